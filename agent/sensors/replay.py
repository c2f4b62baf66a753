"""Recorded readings replayed: the CSV format (time, value) shared by `replay:CSV` thermal
and power sources."""

from __future__ import annotations

import bisect
import math
from pathlib import Path

from shared.cooling.sources import SourceSpecError


class ReplayFormatError(SourceSpecError):
    """A replay file that cannot be played; the message names the file and line."""


ReplayRows = list[tuple[float, float | None]]


def parse_replay_csv(text: str, origin: str, unit: str = "celsius") -> ReplayRows:
    """`seconds,<unit>` rows -> [(seconds, value or None)]: `seconds,celsius` for a thermal
    replay, `seconds,watts` for a power replay.

    An optional `seconds,<unit>` header, blank lines and `#` comments are allowed; an empty value
    is a gap (no reading). Seconds must start at >= 0 and increase.
    """
    rows: ReplayRows = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not rows and line.replace(" ", "").lower() == f"seconds,{unit}":
            continue
        where = f"{origin}:{lineno}"
        rows.append(_replay_row(line, where, rows[-1][0] if rows else None, unit))
    if not rows:
        raise ReplayFormatError(f"{origin}: no `seconds,{unit}` rows")
    return rows


def _replay_row(
    line: str, where: str, previous: float | None, unit: str
) -> tuple[float, float | None]:
    fields = [part.strip() for part in line.split(",")]
    if len(fields) != 2:
        raise ReplayFormatError(f"{where}: expected `seconds,{unit}`, got {line!r}")
    try:
        seconds = float(fields[0])
        value = float(fields[1]) if fields[1] else None
    except ValueError:
        raise ReplayFormatError(f"{where}: not a number in {line!r}") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ReplayFormatError(f"{where}: seconds must be a finite number >= 0, got {line!r}")
    if previous is not None and seconds <= previous:
        raise ReplayFormatError(f"{where}: seconds must increase, got {line!r}")
    if value is not None and not math.isfinite(value):
        raise ReplayFormatError(f"{where}: {unit} must be finite, got {line!r}")
    return seconds, value


def replay_value(rows: ReplayRows, elapsed: float) -> float | None:
    """The row in force `elapsed` seconds in: each row holds until the next, the last one forever;
    None before the first row and in gaps."""
    index = bisect.bisect_right(rows, elapsed, key=lambda row: row[0]) - 1
    return rows[index][1] if index >= 0 else None


def read_replay_csv(path: str | Path, unit: str = "celsius") -> ReplayRows:
    """A replay file's rows (`seconds,<unit>`); ReplayFormatError naming the file when it cannot
    be read or parsed. Thermal and power replays read their files alike."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ReplayFormatError(f"{path}: cannot read replay file: {exc.strerror}") from exc
    return parse_replay_csv(text, str(path), unit=unit)
