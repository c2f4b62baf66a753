"""`agent doctor`: is this machine ready to run the agent? Every check, ✓ or ✗, with the fix."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from agent.daemon.endpoints import ServeError, endpoint_for, telemetry_endpoint
from agent.doctor.check import Check
from agent.doctor.checks import report
from agent.doctor.load_checks import load_checks
from agent.profiling.device_probe import probe_device
from shared.bounds import MAX_CAPTURE_S, MAX_LOAD_S
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import emit, err, usage_error
from shared.io.given import conflict, needs
from shared.io.options import TableFormat, positive
from shared.reports.doctor_verdict import doctor_view

CAPTURE_INTERVAL_S = 1.0


def optional(check: Callable[[float], float]) -> Callable[[float | None], float | None]:
    """`check` for an option that may be left out: None (not given) passes."""

    def maybe(value: float | None) -> float | None:
        return None if value is None else check(value)

    return maybe


LoadSeconds = Annotated[
    float | None,
    typer.Option(
        "--load",
        metavar="SECONDS",
        help="Also run MLX matmuls for SECONDS and check that every thermal and power source "
        "reads differently under load than at idle (docs/deploy.md).",
        callback=optional(positive("--load", "seconds", MAX_LOAD_S)),
    ),
]
"""`agent doctor --load`'s length (agent.doctor.load_checks)."""
CaptureFile = Annotated[
    Path | None,
    typer.Option(
        "--capture",
        metavar="FILE",
        help="Instead of the checks, write every raw input of every thermal source here, poll "
        "by poll (docs/thermal.md, Captures): attach it to a bug report.",
        dir_okay=False,
    ),
]
DEFAULT_CAPTURE_S = 5.0
CaptureSeconds = Annotated[
    float | None,
    typer.Option(
        "--seconds",
        help=f"With --capture: how long to capture, one poll a second (default "
        f"{DEFAULT_CAPTURE_S:g}).",
        callback=optional(positive("--seconds", "seconds", MAX_CAPTURE_S)),
    ),
]


def doctor_command(
    fmt: TableFormat = "table",
    bind: Annotated[
        str,
        typer.Option(
            "--bind", help="The HOST:PORT `agent serve` will bind (its ports are checked)."
        ),
    ] = "0.0.0.0:5555",
    load: LoadSeconds = None,
    capture: CaptureFile = None,
    seconds: CaptureSeconds = None,
) -> None:
    """Python, MLX and its device, a 1-second benchmark, every thermal source side by side,
    thermal pressure, the data directory and keys, the ports, the service, the firewall (for
    the image that listens: a framework Python's Python.app), FileVault and Login Items.

    With --load, also whether each thermal and power source moves under an MLX load; with
    --capture, instead of the checks, every raw input of every source, poll by poll.

    The failed required checks come first; the last line is the verdict ("✓ this machine
    can run the agent (N optional checks not met)" or "✗ fix these first: ...").
    Exit codes: 0 when the agent can run here (every required check passed), 1 otherwise,
    2 bad usage. --format json is the report to attach to a bug report.

    Example: agent doctor --capture mac.jsonl --seconds 60 (exit 1 when nothing could be
    read here)."""
    needs("--seconds", seconds, "--capture", capture is not None)
    conflict("--load", load, "--capture", capture is not None)
    if capture is not None:
        write_capture(capture, DEFAULT_CAPTURE_S if seconds is None else seconds, fmt)
        return
    try:
        endpoint, _ = endpoint_for(bind)
    except ServeError as exc:
        raise usage_error(str(exc)) from None
    command = int(endpoint.rpartition(":")[2].replace("*", "0"))
    telemetry = int(telemetry_endpoint(endpoint, None).rpartition(":")[2].replace("*", "0"))
    # The load runs first, so its idle window is not the cooling-off of the benchmark.
    loaded = loaded_checks(load) if load is not None else []
    found = report((command, telemetry))
    found["checks"] += [asdict(check) for check in loaded]
    emit(found, fmt, lambda data: doctor_view([{"host": data["host"], "report": data}]))
    if not found["ok"]:
        raise typer.Exit(EXIT_PARTIAL)


def loaded_checks(seconds: float) -> list[Check]:
    """--load's checks, run in this process only once a probe child has used the device: a
    device whose first use aborts MLX is a failed check here, not the end of doctor."""
    probe = probe_device()
    if probe.facts is None:
        return [Check("load", False, f"no MLX load: {probe.failure}", probe.fix)]
    return load_checks(seconds)


def write_capture(path: Path, seconds: float, fmt: str) -> None:
    """`--capture`: the file, and one line saying what it holds."""
    from agent.doctor.capture import capture
    from agent.profiling.machine import machine_info

    try:
        polls, facts = capture(path, seconds, CAPTURE_INTERVAL_S, machine_info())
    except OSError as exc:
        raise usage_error(f"cannot write the capture {path}: {exc.strerror}") from None
    summary = {"capture": str(path), "polls": polls, **facts}
    if fmt == "json":
        print(json.dumps(summary))
    else:
        held = ", ".join(facts["inputs"]) or "nothing"
        missing = "; ".join(f"{name}: {why}" for name, why in facts["missing"].items())
        err.print(f"captured {polls} polls of {held} to {path}", highlight=False, markup=False)
        if missing:
            err.print(f"not read here: {missing}", highlight=False, markup=False)
    if not facts["inputs"]:
        raise typer.Exit(EXIT_PARTIAL)
