"""`agent`: the per-Mac command line.

Exit codes: 0 ok, 1 partial failure (a cell failed), 2 usage error, 130 interrupted (the cells
finished so far are still printed and saved).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agent.machine import machine_info, package_version
from agent.profiling.runner import ModelLoadError, check_model_dir, run_matrix
from shared.matrix import (
    BUILTIN_DEFAULT_BITS,
    DEFAULT_DECODE_TOKENS,
    MatrixError,
    MatrixSpec,
    expand,
    parse_int_list,
)
from shared.paths import data_subdir
from shared.report import FORMATS, render_text, rich_report
from shared.results import failed_cells

EXIT_OK, EXIT_PARTIAL, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

app = typer.Typer(
    help="mlx-fleet agent: true MLX benchmarks and thermal safety on this Mac.",
    no_args_is_help=True,
    add_completion=False,
)
err = Console(stderr=True)


def print_version(value: bool) -> None:
    if value:
        print(f"mlx-fleet agent {package_version('mlx-fleet')}")
        raise typer.Exit()


@app.callback()
def agent_options(
    version: bool = typer.Option(False, "--version", callback=print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """mlx-fleet agent: true MLX benchmarks and thermal safety on this Mac."""


def usage_error(message: str) -> typer.Exit:
    """One line naming the problem, exit code 2."""
    err.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(EXIT_USAGE)


def matrix_from_options(
    seq_lengths: str,
    batch_sizes: str,
    warmup: int,
    iterations: int,
    config_small: bool,
    config: str | None,
    model_dirs: list[Path],
    bits: str | None,
    decode_tokens: int,
) -> MatrixSpec:
    """The CLI's matrix options as a validated MatrixSpec; raises MatrixError or ModelLoadError."""
    if config is not None and config not in BUILTIN_DEFAULT_BITS:
        known = ", ".join(BUILTIN_DEFAULT_BITS)
        raise MatrixError(f"unknown config {config!r}; known configs: {known}")
    configs = [config] if config else []
    if config_small:
        configs.append("small")
    if not configs and not model_dirs:
        configs = ["full"]
    for directory in model_dirs:
        check_model_dir(directory)
    if model_dirs:
        try:
            import mlx_lm  # noqa: F401 - only checking that the extra is installed
        except ImportError:
            raise ModelLoadError(
                "--model needs mlx-lm, which is not installed: pip install 'mlx-fleet[lm]'"
            ) from None
    spec = MatrixSpec(
        seq_lengths=parse_int_list(seq_lengths, "--seq-lengths"),
        batch_sizes=parse_int_list(batch_sizes, "--batch-sizes"),
        models=tuple(configs) + tuple(str(d.resolve()) for d in model_dirs),
        bits=parse_int_list(bits, "--bits") if bits else (None,),
        decode_tokens=decode_tokens,
        warmup=warmup,
        iterations=iterations,
    )
    expand(spec)
    return spec


def write_output(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
        err.print(f"wrote {output}")


def show_report(report: dict[str, Any], fmt: str, output: Path | None) -> None:
    if fmt == "table" and output is None:
        Console(width=None if sys.stdout.isatty() else 200).print(rich_report(report))
    else:
        write_output(render_text(report, fmt), output)


def save_run(report: dict[str, Any]) -> Path:
    """Every run is kept under the data directory, whatever was printed."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    path = data_subdir("runs") / f"bench-{stamp}.json"
    path.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    return path


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@app.command()
def bench(
    seq_lengths: str = typer.Option(
        "128,512,1024,2048", "-s", "--seq-lengths", help="Comma list of prompt/context lengths."
    ),
    batch_sizes: str = typer.Option(
        "1", "-b", "--batch-sizes", "--batch-size", help="Comma list of batch sizes."
    ),
    warmup: int = typer.Option(2, "-w", "--warmup", help="Untimed iterations per cell."),
    iterations: int = typer.Option(5, "-i", "--iterations", help="Timed iterations per cell."),
    config_small: bool = typer.Option(
        False, "--config-small", help="The ~4M-parameter model: instant, for smoke tests."
    ),
    config: str = typer.Option(
        None, "--config", help="Built-in model: small or full (Llama-3.2-3B shaped, default)."
    ),
    model: list[Path] = typer.Option(
        [], "--model", help="An mlx-lm model directory (config.json + safetensors); repeatable."
    ),
    bits: str = typer.Option(
        None, "--bits",
        help="Comma list of 4, 8, 16 (16 = float16). Default: 4 for full, 16 for small, "
        "the stored weights for --model.",
    ),
    decode_tokens: int = typer.Option(
        DEFAULT_DECODE_TOKENS, "--decode-tokens",
        help="Tokens generated per decode cell (tg<N> @ d<seq>); 0 skips decode.",
    ),
    fmt: str = typer.Option("table", "--format", help=f"One of {', '.join(FORMATS)}."),
    output: Path = typer.Option(None, "--output", help="Write the report to FILE."),
) -> None:
    """Benchmark prefill and decode on this machine over a matrix of lengths, batches, models
    and bit widths."""
    if fmt not in FORMATS:
        raise usage_error(f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    try:
        spec = matrix_from_options(seq_lengths, batch_sizes, warmup, iterations, config_small,
                                   config, model, bits, decode_tokens)
    except (MatrixError, ModelLoadError) as exc:
        raise usage_error(str(exc)) from None

    report: dict[str, Any] = {
        "kind": "agent-bench",
        "machine": machine_info(),
        "spec": spec.to_dict(),
        "models": [],
        "cells": [],
        "started_at": now_iso(),
        "interrupted": False,
    }
    cells = expand(spec)
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True,
    )
    started = time.monotonic()
    try:
        with progress:
            task = progress.add_task(f"benchmarking {cells[0].name}", total=len(cells))
            for record in run_matrix(spec, on_model=report["models"].append):
                report["cells"].append(record)
                done = len(report["cells"])
                following = cells[done].name if done < len(cells) else "done"
                progress.update(task, advance=1, description=f"benchmarking {following}")
    except KeyboardInterrupt:
        report["interrupted"] = True
    report["finished_at"] = now_iso()
    report["wall_s"] = time.monotonic() - started

    show_report(report, fmt, output)
    err.print(f"saved {save_run(report)}", highlight=False)
    if report["interrupted"]:
        raise typer.Exit(EXIT_INTERRUPTED)
    if failed_cells(report["cells"]):
        raise typer.Exit(EXIT_PARTIAL)


def main() -> None:
    app()
