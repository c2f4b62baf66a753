"""The command-line shell both `agent` and `coordinator` are built with: one way to fail, and
one way to print a table or JSON (a benchmark report: shared.io.report_output).

The options themselves are declared once in shared.io.options; exit codes in shared.exit_codes.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console, RenderableType
from rich.text import Text

from shared.exit_codes import EXIT_PARTIAL, EXIT_USAGE
from shared.io.paths import DataDirError, checked_data_dir

err = Console(stderr=True, soft_wrap=True)  # log lines stay whole, never wrapped


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    """Print `error: message` as one line on stderr; raise the result to exit with `code`
    (2, a usage error, unless another is given)."""
    err.print(Text("error: ", style="red") + Text(message), soft_wrap=True)
    return typer.Exit(code)


def usage_error(message: str) -> typer.Exit:
    """fail() with exit code 2: the input was bad and nothing was done."""
    return fail(message, EXIT_USAGE)


def data_home(write: bool = True) -> Path:
    """A command's one entry to the data dir (shared.io.paths.checked_data_dir), taken before
    any work: one it cannot use is `error: data dir PATH: WHY`, exit 2. `write=False` for a
    command that only reads it (a read-only one is still read)."""
    try:
        return checked_data_dir(write)
    except DataDirError as exc:
        raise usage_error(str(exc)) from None


PIPE_WIDTH = 200
"""Columns for what goes to a pipe or a file (no terminal to size it by) when it fits."""
PIPE_WIDTH_MAX = 1000
"""The most a pipe gets: the natural width of anything that would fill any width."""


def print_rich(renderable: RenderableType) -> None:
    """On stdout, sized to the terminal. Redirected to a pipe or a file it gets PIPE_WIDTH
    columns, or the renderable's natural width when wider: a wide table (`coordinator history`
    with its energy columns) is never folded, and each row stays one line that grep finds
    whole (a long error cell included)."""
    if sys.stdout.isatty():
        Console().print(renderable)
        return
    console = Console(width=PIPE_WIDTH_MAX)
    natural = console.measure(renderable).maximum
    console.width = min(PIPE_WIDTH_MAX, max(PIPE_WIDTH, natural))
    console.print(renderable)


def emit(data: Any, fmt: str, table: Callable[[Any], RenderableType]) -> None:
    """What a `--format table|json` command prints: `table(data)` drawn, or `data` as JSON."""
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    else:
        print_rich(table(data))


def check_output(output: Path | None, flag: str = "--output") -> None:
    """Refuse an output file (`flag`'s) that cannot be written before any work starts."""
    if output is None:
        return
    folder = output.parent if str(output.parent) else Path(".")
    if not folder.is_dir():
        raise usage_error(f"{flag} {output}: folder {folder} does not exist")
    if output.is_dir():
        raise usage_error(f"{flag} {output} is a folder, not a file")
    if not os.access(folder, os.W_OK):
        raise usage_error(f"{flag} {output}: folder {folder} is not writable")


def write_text(text: str, output: Path | None) -> None:
    """A rendered report on stdout, or written to `output` (saying so on stderr)."""
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise fail(f"cannot write {output}: {exc.strerror or exc}", EXIT_PARTIAL) from None
    err.print(f"wrote {output}", highlight=False, markup=False)
