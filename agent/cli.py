"""`agent`: the per-Mac command line.

Exit codes: 0 ok, 1 partial failure (a cell failed), 2 usage error, 130 interrupted (the cells
finished so far are still printed and saved).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agent.cooling import ThermalGuard, ThermalShutdownError
from agent.machine import machine_info
from agent.profiling.runner import (
    ModelLoadError,
    check_bits_for_dir,
    check_model_dir,
    require_mlx_lm,
    run_matrix,
)
from agent.run_cli import run_command
from agent.serve_cli import keys_app, serve_command
from agent.service_cli import install_command, service_status_command, uninstall_command
from agent.thermal import SourceSpecError, SourceUnavailable, ThermalMonitor
from agent.thermal.cli import temp_command
from shared.clock import now_iso, utc_now
from shared.io.cli import (
    EXIT_INTERRUPTED,
    EXIT_PARTIAL,
    BatchSizes,
    Bits,
    ConfigName,
    ConfigSmall,
    DecodeTokens,
    Format,
    Hysteresis,
    Iterations,
    MaxSpeedTemp,
    ModelDirs,
    Output,
    PauseTemp,
    PollInterval,
    SeqLengths,
    StopTemp,
    ThermalSourceName,
    Warmup,
    check_format,
    err,
    fleet_app,
    matrix_from_options,
    policy_from_options,
    show_report,
    usage_error,
)
from shared.io.paths import data_subdir
from shared.matrix import DEFAULT_DECODE_TOKENS, MatrixError, expand
from shared.report import progress_line
from shared.results import failed_cells, not_run

app = fleet_app("agent", "mlx-fleet agent: true MLX benchmarks and thermal safety on this Mac.")


def save_run(report: dict[str, Any]) -> Path:
    """Every run is kept under the data directory, whatever was printed."""
    stamp = utc_now().strftime("%Y%m%dT%H%M%S%fZ")
    path = data_subdir("runs") / f"bench-{stamp}.json"
    path.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    return path


@app.command()
def bench(
    seq_lengths: SeqLengths = "128,512,1024,2048",
    batch_sizes: BatchSizes = "1",
    warmup: Warmup = 2,
    iterations: Iterations = 5,
    config_small: ConfigSmall = False,
    config: ConfigName = None,
    model: ModelDirs = None,
    bits: Bits = None,
    decode_tokens: DecodeTokens = DEFAULT_DECODE_TOKENS,
    fmt: Format = "table",
    output: Output = None,
    thermal_source: ThermalSourceName = "auto",
    poll_interval: PollInterval = 1.0,
    max_speed_temp: MaxSpeedTemp = 75.0,
    pause_temp: PauseTemp = 85.0,
    stop_temp: StopTemp = 95.0,
    hysteresis: Hysteresis = 0.0,
    no_cooling: Annotated[
        bool, typer.Option("--no-cooling", help="Only observe temperatures: never pause or stop.")
    ] = False,
) -> None:
    """Benchmark prefill and decode over a matrix of lengths, batches, models and bits.

    Every list-valued option forms a cross-product; each sequence length N gives a prefill
    cell pp<N> and a decode cell tg<G> @ d<N>. Each iteration waits out a thermal pause (kept
    out of the latencies) and a stop ends the run; cells that paused or ran at or above
    --max-speed-temp are flagged."""
    check_format(fmt, output)
    policy = policy_from_options(max_speed_temp, pause_temp, stop_temp, hysteresis)
    model_dirs = [str(Path(d).expanduser().resolve()) for d in model or []]
    try:
        spec = matrix_from_options(
            seq_lengths,
            batch_sizes,
            warmup,
            iterations,
            config_small,
            config,
            model_dirs,
            bits,
            decode_tokens,
        )
        for directory in model_dirs:
            check_model_dir(Path(directory))
            check_bits_for_dir(Path(directory), spec.bits)
        if model_dirs:
            require_mlx_lm()
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
    try:
        monitor = ThermalMonitor(poll_interval=poll_interval, source=thermal_source)
    except SourceSpecError as exc:
        raise usage_error(str(exc)) from None
    except SourceUnavailable as exc:
        raise usage_error(f"thermal source {thermal_source!r} unavailable: {exc}") from None
    except ValueError as exc:  # --poll-interval
        raise usage_error(f"--poll-interval: {exc}") from None
    guard = ThermalGuard(monitor, policy, enabled=not no_cooling)
    report["thermal"] = {
        "source": monitor.source.name,
        "simulated": monitor.source.simulated,
        "policy": policy.to_dict(),
        "cooling": not no_cooling,
    }
    cells = expand(spec)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )
    started = time.monotonic()
    try:
        with progress:
            task = progress.add_task(f"benchmarking {cells[0].name}", total=len(cells))
            for record in run_matrix(spec, guard=guard, on_model=report["models"].append):
                report["cells"].append(record)
                done = len(report["cells"])
                if not err.is_terminal:
                    err.print(f"[{done}/{len(cells)}] {progress_line(record)}", highlight=False)
                following = cells[done].name if done < len(cells) else "done"
                progress.update(task, advance=1, description=f"benchmarking {following}")
    except KeyboardInterrupt:
        report["interrupted"] = True
        report["cells"] += not_run(cells[len(report["cells"]) :], "interrupted")
    except ThermalShutdownError as exc:
        report["stopped"] = str(exc)
        report["cells"] += not_run(cells[len(report["cells"]) :], "thermal shutdown")
    finally:
        monitor.close()
    report["finished_at"] = now_iso()
    report["wall_s"] = time.monotonic() - started

    err.print(f"saved {save_run(report)}", highlight=False)  # kept before anything can fail
    show_report(report, fmt, output)
    if report["interrupted"]:
        raise typer.Exit(EXIT_INTERRUPTED)
    if "stopped" in report:
        err.print(f"stopped: {report['stopped']}", highlight=False, markup=False)
    if failed_cells(report["cells"]):
        raise typer.Exit(EXIT_PARTIAL)


app.command("temp")(temp_command)
app.command("run", context_settings={"allow_interspersed_args": False})(run_command)
app.command("install")(install_command)
app.command("uninstall")(uninstall_command)
app.command("service-status")(service_status_command)
app.command("serve")(serve_command)
app.add_typer(keys_app, name="keys")


def main() -> None:
    app()
