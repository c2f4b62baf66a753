"""`agent bench`: the benchmark matrix on this Mac, gated by the cooling policy, one report."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TimeElapsedColumn,
)
from rich.text import Text

from agent.awake.assertion import hold_awake
from agent.commands.sensors import open_meter, open_monitor
from agent.cooling.calibration_file import policy_defaults
from agent.cooling.clock_throttle import follow_clock
from agent.cooling.scheduler import ActionSink, CoolWaitSink, ThermalGuard, ThermalShutdownError
from agent.power.meter import EnergyMeter
from agent.profiling.hf_models import ModelNotFound, locate, names_a_repo
from agent.profiling.http_serving import check_serve_url
from agent.profiling.machine import machine_info
from agent.profiling.model_dir import (
    ModelLoadError,
    check_bits_for_dir,
    check_model_dir,
    require_mlx_lm,
)
from agent.profiling.openai_client import ServeUrlError
from agent.profiling.runner import exit_beside_an_abandoned_build, run_matrix
from agent.thermal import ThermalMonitor, ThermalReading
from shared.benchmark.matrix import MatrixError, MatrixSpec, expand, resolve_bits
from shared.benchmark.results import failed_cells, not_run
from shared.benchmark.roofline import mark_roofline
from shared.benchmark.status import (
    PauseView,
    activity_label,
    baseline_label,
    build_label,
    no_sensor_warning,
    pause_label,
    quantized_cpu_warning,
)
from shared.benchmark.sustain import SustainError, SustainPlan
from shared.clock import now_iso, utc_now
from shared.cooling.calibration import PolicyInForce
from shared.cooling.cool_start import CoolWait, cool_wait_line
from shared.cooling.policy import Action
from shared.exit_codes import EXIT_PARTIAL, EXIT_USAGE
from shared.io.cli import check_output, data_home, err, usage_error
from shared.io.files import write_private
from shared.io.options import (
    Label,
    MatrixOptions,
    Output,
    PolicyOptions,
    PowerOptions,
    ReportFormat,
    ServingOptions,
    SustainOptions,
    ThermalOptions,
    check_sustained_repetitions,
    with_options,
)
from shared.io.paths import data_subdir
from shared.io.report_output import show_report
from shared.io.signals import interrupted_exit_code, sigterm_as_interrupt
from shared.reports.benchmark import progress_line

NoCooling = Annotated[
    bool, typer.Option("--no-cooling", help="Only observe temperatures: never pause or stop.")
]


@with_options
def bench(
    matrix: MatrixOptions,
    serving: ServingOptions,
    thermal: ThermalOptions,
    limits: PolicyOptions,
    power: PowerOptions,
    sustained: SustainOptions,
    fmt: ReportFormat = "table",
    output: Output = None,
    label: Label = None,
    no_cooling: NoCooling = False,
) -> None:
    """Benchmark prompt processing and generation over llama-bench's matrix, on this Mac.

    Every list-valued option forms a cross-product, as in llama-bench: each prompt length P
    gives a test pp<P>, each generation length G a test tg<G>, each -pg P,G a test pp<P>+tg<G>,
    each at every depth D (tokens already in the KV cache: ' @ d<D>'), per batch size, model and
    bit width. pp fills the KV cache in steps of --prefill-step-size evaluating the cache only,
    as mlx-lm does. Each iteration waits out a thermal pause (kept out of the latencies) and a
    stop ends the run; cells that paused or ran at or above --max-speed-temp are flagged. Each
    cell's energy comes from --power-source (docs/energy.md); --sustain runs each cell for a
    duration, window by window. --concurrency and --request-rate make every cell a serving test
    through mlx-lm's batch engine: TTFT, ITL, TPOT and e2e percentiles, goodput within
    --slo-ttft/--slo-tpot, joules per output token (docs/performance.md, Serving cells)."""
    check_output(output)
    spec = local_spec(matrix, serving)
    plan = sustained.plan()
    check_sustained_repetitions(spec, plan)
    data_home()  # a data dir the run cannot be saved in fails now, not after the matrix
    monitor = open_monitor(thermal, EXIT_USAGE)
    try:
        policy = limits.in_force(
            monitor.source.scale, policy_defaults(monitor.source.scale, monitor.source.name)
        )
        meter = open_meter(power, thermal.poll_interval)
    except BaseException:
        monitor.close()
        raise
    clock = None
    with sigterm_as_interrupt():
        try:
            check_sustain(plan, meter, thermal.poll_interval)
            status = BenchStatus()
            notice = None if no_cooling else cooling_notice(monitor, status)
            guard = ThermalGuard(
                monitor,
                policy.policy,
                enabled=not no_cooling,
                on_action=notice,
                on_cool_wait=cool_wait_notice(monitor),
            )
            clock = follow_clock(monitor, guard)
            report = new_report(spec, monitor, policy, cooling=not no_cooling)
            warn_unprotected(report, spec)
            report["energy"] = energy_header(meter)
            if plan is not None:
                report["sustain"] = plan.to_dict()
            measure(report, spec, guard, meter, plan, status)
            report["energy"] = energy_header(meter)
        finally:
            monitor.close()
            meter.close()
            if clock is not None:
                clock.close()
        try:
            show_report(report, fmt, output, label)
        finally:
            saved = keep_run(report)  # after the table: a save that fails loses nothing shown
    if report["interrupted"]:
        exit_beside_an_abandoned_build(interrupted_exit_code())
        raise typer.Exit(interrupted_exit_code())
    if "stopped" in report:
        err.print(f"stopped: {report['stopped']}", highlight=False, markup=False)
    if not saved or failed_cells(report["cells"]):
        raise typer.Exit(EXIT_PARTIAL)


class BenchStatus:
    """What the progress label says: what runs and since when, or the pause the run is in (set
    from the readings' thread, read at every refresh)."""

    def __init__(self) -> None:
        self.text, self.since, self.timed = "starting", time.monotonic(), False
        self.pause: PauseView | None = None
        self.paused_at = 0.0

    def doing(self, text: str, timed: bool = True) -> None:
        self.text, self.since, self.timed = text, time.monotonic(), timed

    def label(self, now: float) -> str:
        pause = self.pause
        if pause is not None:
            return pause_label(pause, now - self.paused_at)
        return activity_label(self.text, now - self.since) if self.timed else self.text


class StatusColumn(ProgressColumn):
    """The label, made at every refresh so its clock ticks."""

    def __init__(self, status: BenchStatus) -> None:
        super().__init__()
        self.status = status

    def render(self, task: Task) -> Text:
        return Text(self.status.label(time.monotonic()))


def warn_unprotected(report: dict[str, Any], spec: MatrixSpec) -> None:
    """The header's warnings: a source with no sensor leaves the cooling policy inert, and
    quantized cells crawl on MLX's CPU backend (shared.benchmark.status decides)."""
    warnings = (
        no_sensor_warning(report["thermal"]["source"]),
        quantized_cpu_warning(
            [resolve_bits(m, b) for m in spec.models for b in spec.bits],
            report["machine"].get("backend"),
        ),
    )
    for warning in warnings:
        if warning:
            err.print(warning, highlight=False, markup=False)


def cooling_notice(monitor: ThermalMonitor, status: BenchStatus | None = None) -> ActionSink:
    """A pause can last minutes with no cell finishing: say on stderr when the policy pauses,
    resumes or stops the run, at which reading and from which source; the label shows the
    pause while it lasts."""

    def say(action: Action, reading: ThermalReading | None, reason: str | None) -> None:
        if action not in (Action.PAUSE, Action.RESUME, Action.STOP):
            return
        if status is not None:
            paused(status, action, reading)
        at = ""
        if reading is not None and reading.celsius is not None:
            at = f" at {reading.celsius:.1f} °C"
        elif reading is not None and reading.pressure is not None:
            at = f" at thermal pressure {reading.pressure}"
        source = monitor.source.name + (", simulated" if monitor.source.simulated else "")
        because = f": {reason}" if reason else ""
        err.print(f"cooling: {action.value}{at} ({source}){because}", highlight=False, markup=False)

    def paused(status: BenchStatus, action: Action, reading: ThermalReading | None) -> None:
        if action is not Action.PAUSE:
            status.pause = None
            return
        if status.pause is None:
            status.paused_at = time.monotonic()
        status.pause = PauseView(
            reading.celsius if reading else None,
            reading.pressure if reading else None,
            monitor.source.name,
            reading.sensor if reading else None,
            0.0,
        )

    return say


def cool_wait_notice(monitor: ThermalMonitor) -> CoolWaitSink:
    """A cool start can take minutes before a cell: say on stderr that it waits, from what to
    what, and how it ended."""
    source = monitor.source.name + (", simulated" if monitor.source.simulated else "")

    def say(wait: CoolWait) -> None:
        if wait.waited_s and not wait.done:
            return  # one line as it starts and one as it ends are enough on a terminal
        err.print(f"{cool_wait_line(wait)} ({source})", highlight=False, markup=False)

    return say


def local_spec(matrix: MatrixOptions, serving: ServingOptions | None = None) -> MatrixSpec:
    """The matrix with its --model directories resolved and checked on this machine, and its
    Hugging Face ids fetched into the cache (or found there offline); exit 2 naming the
    problem."""
    try:
        if serving is not None and serving.serve_url is not None:
            # The server's model, named as the server knows it: nothing to find here.
            spec = serving.apply(matrix.spec(list(matrix.model or [])))
            assert spec.serving is not None
            check_serve_url(spec.serving)  # before any cell: it answers, and streams
            return spec
        models = [local_model(name) for name in matrix.model or []]
        spec = matrix.spec([name for name, _ in models])
        if serving is not None:
            spec = serving.apply(spec)
        for _, path in models:
            check_model_dir(path)
            check_bits_for_dir(path, spec.bits)
        if models:
            require_mlx_lm()
    except (MatrixError, ModelLoadError, ModelNotFound, ServeUrlError) as exc:
        raise usage_error(str(exc)) from None
    return spec


def local_model(name: str) -> tuple[str, Path]:
    """(what the spec names, the directory on this disk): a directory by its absolute path, a
    Hugging Face id as given, resolved to its snapshot."""
    if not names_a_repo(name):
        path = Path(name).expanduser()
        return str(path.resolve()), path
    require_mlx_lm()  # huggingface_hub comes with it
    return name, locate(name).path


def new_report(
    spec: MatrixSpec, monitor: ThermalMonitor, policy: PolicyInForce, cooling: bool
) -> dict[str, Any]:
    return {
        "kind": "agent-bench",
        "machine": machine_info(),
        "spec": spec.to_dict(),
        "models": [],
        "cells": [],
        "started_at": now_iso(),
        "interrupted": False,
        "thermal": {
            "source": monitor.source.name,
            "simulated": monitor.source.simulated,
            "policy": policy.policy.to_dict(),
            "policy_origin": policy.origin,
            "cooling": cooling,
        },
    }


def check_sustain(plan: SustainPlan | None, meter: EnergyMeter, poll_interval: float) -> None:
    """A window must hold a new reading of the power meter and of the thermal source: exit 2
    naming the one whose interval is longer than a window."""
    if plan is None:
        return
    try:
        plan.check(meter.info().resolution_s, f"the power meter {meter.source.name}")
        plan.check(poll_interval, "the thermal source (--poll-interval)")
    except SustainError as exc:
        raise usage_error(str(exc)) from None


def energy_header(meter: EnergyMeter) -> dict[str, Any]:
    """The report's `energy`: the meter, its idle baseline, and why there is no figure."""
    return {
        **meter.info().to_dict(),
        "present": meter.present,
        "baseline_s": meter.baseline_s,
        "idle_w": meter.idle_w,
        "note": meter.idle_note if meter.present else meter.last_error,
    }


def measure(
    report: dict[str, Any],
    spec: MatrixSpec,
    guard: ThermalGuard,
    meter: EnergyMeter | None = None,
    plan: SustainPlan | None = None,
    status: BenchStatus | None = None,
) -> None:
    """Every cell into the report, with a progress bar whose label names the cell, the model
    building, the idle baseline or the cooling pause, and for how long (a line for each of
    those when stderr is not a terminal). Ctrl-C and a thermal stop keep what finished and list
    what did not run."""
    cells = expand(spec)
    status = status or BenchStatus()

    def phase(phase: dict[str, Any]) -> None:
        if phase["kind"] == "build":
            text = build_label(phase["label"], phase.get("param_count"))
            line = text
        else:
            text, line = "idle baseline", baseline_label(phase["seconds"])
        doing(text)
        if not err.is_terminal:
            err.print(f"{line}…", highlight=False, markup=False)

    def doing(text: str) -> None:
        """A new label, drawn at once: a build shorter than a refresh is still seen."""
        status.doing(text)
        progress.refresh()

    progress = Progress(
        SpinnerColumn(),
        StatusColumn(status),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    )
    started = time.monotonic()
    try:
        with hold_awake("agent bench"), progress:
            task = progress.add_task("bench", total=len(cells))
            records = run_matrix(
                spec,
                guard=guard,
                on_model=report["models"].append,
                on_begin=lambda index: doing(cells[index].name),
                energy=meter,
                sustain=plan,
                on_phase=phase,
            )
            for record in records:
                report["cells"].append(record)
                done = len(report["cells"])
                if not err.is_terminal:
                    line = f"[{done}/{len(cells)}] {progress_line(record)}"
                    err.print(line, highlight=False, markup=False)
                progress.update(task, advance=1)
    except KeyboardInterrupt:
        report["interrupted"] = True
        report["cells"] += not_run(cells[len(report["cells"]) :], "interrupted")
    except ThermalShutdownError as exc:
        report["stopped"] = str(exc)
        report["cells"] += not_run(cells[len(report["cells"]) :], "thermal shutdown")
    for record in report["cells"]:  # every format names where a cell ran, as a fleet's does
        record["host"] = report["machine"]["hostname"]
    report["cells"] = mark_roofline(report)  # decode cells against the chip's bandwidth
    report["finished_at"] = now_iso()
    report["wall_s"] = time.monotonic() - started


def keep_run(report: dict[str, Any]) -> bool:
    """Every run is kept under the data directory (0600), whatever was printed, and stderr says
    where; a disk that fills or turns read-only mid-run is one line (the caller exits 1), not a
    traceback under the table."""
    try:
        path = data_subdir("runs") / f"bench-{utc_now():%Y%m%dT%H%M%S%fZ}.json"
        write_private(path, json.dumps(report, indent=2, default=str))
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        err.print(f"error: run not saved: {exc.strerror or exc}{where}", markup=False)
        return False
    err.print(f"saved {path}", highlight=False, markup=False)
    return True
