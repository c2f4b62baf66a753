"""`agent doctor` / `coordinator doctor` reports as one table: a row per check, ✓ or ✗, what
was found and the fix. Pure: the checks themselves run on the agent (agent.doctor.checks)."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from shared.safe_text import DETAIL_CAP, shown
from shared.tables import TEXT, WHOLE, WORDS, FitTable

PASS, FAIL = "✓", "✗"


def result_mark(check: dict[str, Any]) -> str:
    mark = PASS if check["ok"] else FAIL
    return f"{mark} (required)" if check["required"] and not check["ok"] else mark


def doctor_table(hosts: list[dict[str, Any]]) -> FitTable:
    """One row per check of every host; a host that sent no report is one row saying why.
    `hosts`: {"host", "report" (or None), "error"} per host."""
    several = len(hosts) > 1
    table = FitTable(title="mlx-fleet doctor")
    for name in (["host"] if several else []) + ["check", "", "found", "fix"]:
        wrap = WHOLE if name == "host" else TEXT if name in ("found", "fix") else WORDS
        table.add_column(name, wrap=wrap)
    for host in hosts:  # an agent's words: shown() and Text, never markup, never escapes
        where = [Text(shown(host["host"]))] if several else []
        report = host.get("report")
        if report is None:
            error = Text(shown(host.get("error")))
            table.add_row(*where, "agent", FAIL, error, "", style="red")
            continue
        for check in report["checks"]:
            table.add_row(
                *where,
                Text(shown(check["name"])),
                result_mark(check),
                Text(shown(check["detail"], DETAIL_CAP)),
                Text(shown(check["fix"] or "", DETAIL_CAP)),
                style=None if check["ok"] else "red" if check["required"] else "yellow",
            )
    return table
