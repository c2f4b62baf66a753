"""`agent doctor`: is this machine ready to run the agent? Every check, ✓ or ✗, with the fix."""

from __future__ import annotations

from typing import Annotated

import typer

from agent.daemon.endpoints import ServeError, endpoint_for, telemetry_endpoint
from agent.doctor.checks import report
from shared.doctor import doctor_table
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import emit, usage_error
from shared.io.options import TableFormat


def doctor_command(
    fmt: TableFormat = "table",
    bind: Annotated[
        str,
        typer.Option(
            "--bind", help="The HOST:PORT `agent serve` will bind (its ports are checked)."
        ),
    ] = "0.0.0.0:5555",
) -> None:
    """Python, MLX and its device, a 1-second benchmark, every thermal source side by side,
    thermal pressure, the data directory and keys, the ports, the service, the firewall.

    Exit codes: 0 when the agent can run here (every required check passed), 1 otherwise,
    2 bad usage. --format json is the report to attach to a bug report."""
    try:
        endpoint, _ = endpoint_for(bind)
    except ServeError as exc:
        raise usage_error(str(exc)) from None
    command = int(endpoint.rpartition(":")[2].replace("*", "0"))
    telemetry = int(telemetry_endpoint(endpoint, None).rpartition(":")[2].replace("*", "0"))
    found = report((command, telemetry))
    emit(found, fmt, lambda data: doctor_table([{"host": data["host"], "report": data}]))
    if not found["ok"]:
        raise typer.Exit(EXIT_PARTIAL)
