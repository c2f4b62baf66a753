"""The one way to print a benchmark report (`agent bench`, `coordinator benchmark` and `show`):
kept apart from shared.io.cli so that the commands that print none (`agent serve` among them)
start without importing every renderer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.benchmark.verdict import noisy_hint
from shared.io.cli import err, print_rich, write_text
from shared.reports.benchmark import render_text, rich_report
from shared.reports.llama_bench import left_out_note


def show_report(
    report: dict[str, Any], fmt: str, output: Path | None, label: str | None = None
) -> None:
    """A benchmark report on stdout (a table sized to the terminal) or written to `output`,
    then notes on stderr: cells a llama-bench format leaves out, a hint for noisy cells."""
    if fmt == "table" and output is None:
        print_rich(rich_report(report))
    else:
        write_text(render_text(report, fmt, label=label), output)
    for note in (left_out_note(report, fmt), noisy_hint(report.get("cells") or [])):
        if note is not None:
            err.print(note, highlight=False, markup=False)
