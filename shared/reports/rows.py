"""Rows as the exports write them (csv, SQL, JSON), each text value escaped as a terminal may
show it: shared by every report that exports rows (benchmark, netbench, comparisons)."""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

from shared.safe_text import EXPORT_CAP, shown


def exported(value: Any) -> Any:
    """A text value as an export shows it: every control, zero-width and bidi character
    escaped visibly and at most EXPORT_CAP characters (shared.safe_text), since a CSV or SQL dump
    is read in a terminal too; any other value as it is."""
    return shown(value, EXPORT_CAP) if isinstance(value, str) else value


def rows_csv(fields: Sequence[str], rows: Iterable[dict[str, Any]]) -> str:
    """Rows as CSV under a header of `fields`, each value exported()."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(fields))
    writer.writeheader()
    for row in rows:
        writer.writerow({key: exported(value) for key, value in row.items()})
    return out.getvalue()


class SqlExpression(str):
    """A value computed by SQLite as the row goes in (`last_insert_rowid()`), written as is."""


def sql_literal(value: Any) -> str:
    """A value as SQLite reads it: NULL, a number, quoted text ('' doubling a quote), or an
    SqlExpression."""
    if isinstance(value, SqlExpression):
        return str(value)
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (int, float)):
        return repr(value) if math.isfinite(value) else "NULL"
    return "'" + exported(str(value)).replace("'", "''") + "'"


def rows_sql(table: str, fields: Sequence[tuple[str, str]], rows: Iterable[dict[str, Any]]) -> str:
    """CREATE TABLE IF NOT EXISTS `table` with `fields` (name, SQLite type), then one INSERT
    per row."""
    lines = [create_sql(table, fields), *(insert_sql(table, fields, row) for row in rows)]
    return "\n".join(lines) + "\n"


def create_sql(table: str, fields: Sequence[tuple[str, str]]) -> str:
    columns = ", ".join(f"{name} {kind}" for name, kind in fields)
    return f"CREATE TABLE IF NOT EXISTS {table} ({columns});"


def insert_sql(table: str, fields: Sequence[tuple[str, str]], row: dict[str, Any]) -> str:
    names = ", ".join(name for name, _ in fields)
    values = ", ".join(sql_literal(row[name]) for name, _ in fields)
    return f"INSERT INTO {table} ({names}) VALUES ({values});"


def nanoseconds(milliseconds: float | None) -> int | None:
    """Milliseconds as the whole nanoseconds llama-bench writes; None stays unknown."""
    if milliseconds is None or not math.isfinite(milliseconds):
        return None
    return round(milliseconds * 1e6)


def strict_json(value: Any, **options: Any) -> str:
    """RFC 8259 JSON: a non-finite number (only a run stored before agents' messages were
    checked can hold one) is null, never NaN; non-ASCII is escaped, so no control, bidi or
    zero-width character reaches a terminal raw."""
    return json.dumps(_finite(value), allow_nan=False, default=str, **options)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(entry) for key, entry in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(entry) for entry in value]
    return value
