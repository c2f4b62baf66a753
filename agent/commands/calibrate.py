"""`agent calibrate`: learn this Mac's throttle point (agent.cooling.calibrate runs it,
shared.cooling.throttle_point reads it) and keep it as the Mac's calibrated policy."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from agent.clocks.registry import open_clock_source
from agent.commands.sensors import open_monitor
from agent.cooling.calibrate import (
    Busy,
    Calibration,
    CalibrationStopped,
    LoadChild,
    NoLoad,
    Progress,
    busy_lock,
    running_job,
    time_scale,
)
from agent.cooling.calibration_file import policy_defaults, save_calibration
from shared.cooling.calibration import SOURCE_POLICIES, PolicyInForce
from shared.cooling.throttle_point import (
    CalibrationSample,
    NoThrottle,
    OperatingPoint,
    ThrottlePoint,
)
from shared.exit_codes import EXIT_PARTIAL, EXIT_THERMAL_STOP, EXIT_USAGE
from shared.io.cli import data_home, fail, usage_error
from shared.io.files import replace_atomically
from shared.io.options import (
    CalibrateMinutes,
    StopGiven,
    TableFormat,
    ThermalOptions,
    with_options,
)
from shared.io.paths import data_dir
from shared.io.signals import interrupted_exit_code, sigterm_as_interrupt
from shared.safe_text import shown

PREFIX = "calibrate:"
POLLS_FILE = "calibration-polls.jsonl"
PROGRESS_EVERY_S = 10.0
FILE_EVERY_S = 1.0
DEFAULT_MINUTES = 30.0
PHASE_TEXT = {
    "idle": "idle, for the start temperature",
    "sustained": "flat out until the clock drops and stays down",
    "recovering": "resting until the firmware can restore its clock",
    "held": "held just below the onset",
}


@with_options
def calibrate_command(
    thermal: ThermalOptions,
    minutes: CalibrateMinutes = DEFAULT_MINUTES,
    stop_temp: StopGiven = None,
    fmt: TableFormat = "table",
    progress_file: Annotated[
        Path | None,
        typer.Option(
            "--progress-file",
            hidden=True,
            help="Rewrite this file with the progress as JSON every second (agent serve's).",
        ),
    ] = None,
) -> None:
    """Learn where this Mac throttles (a sustained MLX load, then held below it) and keep it as
    its calibrated policy.

    From cold, flat out until the clock (else the work rate) drops and stays down: every sensor's
    reading there is its onset; then held just under it, for the duty that holds it and the
    work rate it leaves. Stored as the Mac's calibrated policy (pause at the onset), under any
    thresholds a coordinator set.

    Nothing is stored when it is interrupted (Ctrl-C, SIGTERM), stopped by the heat, or finds
    no onset: the previous policy stays. Exit codes: 0 calibrated, 1 no onset found (or the
    load failed mid-run), 2 bad usage (a job running, no sensor, no MLX device), 75 a thermal
    stop, 130 interrupted (143 after SIGTERM)."""
    data_home()
    try:
        lock = busy_lock()
    except Busy as exc:
        raise usage_error(f"{exc}: one at a time") from None
    try:
        job = running_job()
        if job is not None:
            raise usage_error(f"a job is running ({shown(job)}): calibrate an idle Mac")
        _calibrate(thermal, minutes, stop_temp, fmt, progress_file)
    finally:
        os.close(lock)


def _calibrate(
    thermal: ThermalOptions,
    minutes: float,
    stop_temp: float | None,
    fmt: str,
    progress_file: Path | None,
) -> None:
    monitor = open_monitor(thermal, EXIT_USAGE)
    source = monitor.source
    clocks = open_clock_source(source)
    load: LoadChild | None = None
    try:
        first = monitor.read()
        if first is None or first.celsius is None:
            why = monitor.last_error or "it gives no degrees"
            raise usage_error(f"no sensor: {source.name}: {why}; a calibration needs degrees")
        previous = policy_defaults(source.scale, source.name)
        stop = stop_temp if stop_temp is not None else default_stop(source.scale)
        load = LoadChild()
        try:
            device = load.wait_ready()
        except NoLoad as exc:
            raise usage_error(str(exc)) from None
        _say(f"{PREFIX} {minutes:g} min on {source.name} ({_scale_text(source)}), load on {device}")
        shown = Shown(progress_file)
        run = Calibration(monitor, clocks, minutes, thermal.poll_interval, stop, shown)
        with sigterm_as_interrupt():
            try:
                try:
                    point = run.run(load)
                finally:
                    keep_polls(run.samples)
            except KeyboardInterrupt:
                _kept("interrupted", previous)
                raise typer.Exit(interrupted_exit_code()) from None
            except CalibrationStopped as exc:
                _kept(f"stopped by the heat: {exc}", previous)
                raise typer.Exit(EXIT_THERMAL_STOP) from None
            except NoThrottle as exc:
                _kept(f"no throttle point in {minutes:g} min: {exc}", previous)
                raise typer.Exit(EXIT_PARTIAL) from None
            except (NoLoad, ValueError) as exc:
                _kept(f"failed: {exc}", previous)
                raise typer.Exit(EXIT_PARTIAL) from None
    finally:
        if load is not None:
            load.close()
        clocks.close()
        monitor.close()
    try:
        save_calibration(point)
    except OSError as exc:
        raise fail(f"cannot store the calibration: {exc}; the previous policy stays") from None
    in_force = policy_defaults(source.scale, source.name)
    report = calibration_report(point, in_force, time_scale(source))
    if fmt == "json":
        print(json.dumps(report))
    else:
        print("\n".join(report_lines(report)))


def keep_polls(samples: list[CalibrationSample]) -> None:
    """Every poll of the run, kept as JSON lines in calibration-polls.jsonl (the last run's,
    stored or not): each sensor's reading against the clock and the work, for a second look."""
    lines = [json.dumps(dataclasses.asdict(sample)) for sample in samples]
    with contextlib.suppress(OSError):  # the record of a run, not the policy: best effort
        replace_atomically(data_dir() / POLLS_FILE, "".join(f"{line}\n" for line in lines))


def default_stop(scale: str | None) -> float | None:
    """Where the heat ends a calibration without --stop-temp: the source's table's stop (a
    safety limit no calibration moves); none for a model, which no heat harms."""
    return SOURCE_POLICIES[scale].stop_temp if scale in SOURCE_POLICIES else None


class Shown:
    """Progress on stderr: each phase as it starts, and a line every PROGRESS_EVERY_S; with a
    `file`, the latest progress there as JSON every FILE_EVERY_S (what agent serve reads)."""

    def __init__(self, file: Path | None = None) -> None:
        self.phase: str | None = None
        self.next_s = 0.0
        self.file = file
        self.file_next_s = 0.0

    def __call__(self, progress: Progress) -> None:
        if self.file is not None and (
            progress.phase != self.phase or progress.elapsed_s >= self.file_next_s
        ):
            self.file_next_s = progress.elapsed_s + FILE_EVERY_S
            with contextlib.suppress(OSError):  # progress is a courtesy; the run goes on
                replace_atomically(self.file, json.dumps(progress.to_dict()))
        if progress.phase == self.phase and progress.elapsed_s < self.next_s:
            return
        started = progress.phase != self.phase
        self.phase, self.next_s = progress.phase, progress.elapsed_s + PROGRESS_EVERY_S
        degrees = "no reading" if progress.celsius is None else f"{progress.celsius:.1f} °C"
        clock = "" if progress.gpu_hz is None else f", GPU {progress.gpu_hz / 1e9:.2f} GHz"
        onset = "" if progress.onset_c is None else f", onset {progress.onset_c:.1f} °C"
        what = PHASE_TEXT[progress.phase] if started else progress.phase
        _say(
            f"{PREFIX} {progress.elapsed_s:5.0f}/{progress.total_s:.0f} s {what}: "
            f"{degrees}{clock}{onset}"
        )


def _say(line: str) -> None:
    typer.echo(line, err=True)


def _kept(why: str, previous: PolicyInForce) -> None:
    _say(f"{PREFIX} {why}; nothing stored, the previous policy stays: {previous}")


def _scale_text(source: object) -> str:
    scale = time_scale(source)
    return "real time" if scale == 1 else f"simulated, plant time x{scale:g}"


def calibration_report(
    point: ThrottlePoint, in_force: PolicyInForce, scale: float
) -> dict[str, Any]:
    """The JSON of a calibration: what was found, the policy now in force and its origin."""
    return {
        "calibration": point.to_dict(),
        "origin": point.origin(),
        "time_scale": scale,
        "policy": in_force.policy.to_dict(),
        "policy_origin": in_force.origin,
    }


def report_lines(report: dict[str, Any]) -> list[str]:
    """The calibration for people: the onset and its origin, both operating points, per sensor."""
    point = ThrottlePoint.from_dict(report["calibration"])
    unit = "s" if report["time_scale"] == 1 else f"s of plant time (x{report['time_scale']:g})"
    lines = [
        point.origin(),
        f"  time to throttle    {point.time_to_throttle_s:.0f} {unit}"
        + (f", from {point.start_c:.1f} °C" if point.start_c is not None else ""),
        f"  throttled by        {point.evidence or point.signal}",
        f"  firmware throttles  {_point_text(point.throttled)}",
        f"  held below onset    {_point_text(point.held)}",
    ]
    if point.duty_cycle is not None:
        lines.append(f"  sustainable duty    {point.duty_cycle:.0%} of the time at the onset")
    if point.throttled and point.held and point.throttled.work_rate > 0:
        ratio = point.held.work_rate / point.throttled.work_rate
        lines.append(f"  holding below onset does {ratio:.2f}x the throttled work per second")
    for name, celsius in sorted(point.sensor_onsets.items()):
        lines.append(f"  onset on {shown(name):<12} {celsius:.1f} °C")
    lines.append(f"  now in force: {report['policy_origin'] and _policy_text(report)}")
    return lines


def _point_text(point: OperatingPoint | None) -> str:
    if point is None:
        return "not measured (too short a run)"
    clock = "" if point.clock_hz is None else f", GPU {point.clock_hz / 1e9:.2f} GHz"
    degrees = "" if point.celsius is None else f", {point.celsius:.1f} °C"
    return f"{point.work_rate:.3g} work/s, duty {point.duty:.0%}{clock}{degrees}"


def _policy_text(report: dict[str, Any]) -> str:
    p = report["policy"]
    return (
        f"policy {p['max_speed_temp']:g}/{p['pause_temp']:g}/{p['stop_temp']:g} °C "
        f"({report['policy_origin']})"
    )
