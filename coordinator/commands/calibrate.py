"""`coordinator calibrate`: every host learns its own throttle point at once (calibrate.start, then
calibrate.get until it ends: docs/protocol.md §18), each with its progress on stderr, then one
table of what each found and the policy it now enforces."""

from __future__ import annotations

import time
from typing import Any

import typer
from rich.text import Text

from coordinator.commands.hosts import FleetOptions, HostRow
from coordinator.telemetry.dashboard import NA
from shared.cooling.throttle_point import ThrottlePoint
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import emit, err
from shared.io.options import CalibrateMinutes, TableFormat, with_options
from shared.io.transport import AgentClient, AgentError
from shared.safe_text import shown
from shared.tables import TEXT, FitTable

POLL_S = 2.0
"""How often each host is asked how its calibration goes."""
SHOW_EVERY_S = 30.0
"""A host's progress line at most this often, and whenever its phase changes."""
LATE_S = 120.0
"""Past its minutes, how long a calibration may still take (the load starting, the last poll)
before the host is reported as not finishing."""
CALIBRATED, UNREACHABLE = "calibrated", "unreachable"
PHASES_SHOWN = {
    "idle": "idle from cold",
    "sustained": "flat out",
    "recovering": "resting",
    "held": "held below onset",
}


def run_on(client: AgentClient, row: HostRow, minutes: float) -> None:
    """Start the host's calibration and follow it to its end."""
    started = client.request("calibrate.start", {"minutes": minutes})
    row["source"] = started["source"]
    deadline = time.monotonic() + minutes * 60.0 + LATE_S
    last_phase, shown_at = None, 0.0
    while True:
        time.sleep(POLL_S)
        got = client.request("calibrate.get", timeout=client.connect_timeout + POLL_S)
        progress = got["progress"]
        if progress and (progress["phase"] != last_phase or time.monotonic() >= shown_at):
            last_phase, shown_at = progress["phase"], time.monotonic() + SHOW_EVERY_S
            _show(row["host"], progress)
        if got["state"] != "running":
            break
        if time.monotonic() > deadline:
            row["result"], row["error"] = "failed", f"still calibrating {LATE_S:g} s past its time"
            return
    row["result"] = CALIBRATED if got["state"] == "ok" else got["state"]
    row["error"] = None if got["state"] == "ok" else got["error"]
    if got["state"] == "ok" and got["calibration"] is not None:
        row["calibration"] = got["calibration"]
    row["policy_origin"] = got["policy_origin"]


def _show(host: str, progress: dict[str, Any]) -> None:
    degrees = NA if progress["celsius"] is None else f"{progress['celsius']:.1f} °C"
    onset = "" if progress["onset_c"] is None else f", onset {progress['onset_c']:.1f} °C"
    err.print(
        Text(
            f"{shown(host)}: {progress['elapsed_s']:.0f}/{progress['total_s']:.0f} s "
            f"{PHASES_SHOWN[progress['phase']]}, {degrees}{onset}"
        ),
        highlight=False,
    )


def refused(exc: AgentError, row: HostRow) -> None:
    row.update(result="refused", error=str(exc))


def calibration_table(rows: list[dict[str, Any]]) -> FitTable:
    """One row per host: its onset (and the sensor), time to throttle, duty, both operating
    points; the caption names each host's policy origin."""
    table = FitTable(
        title="mlx-fleet calibration",
        title_justify="left",
        folds=("throttled work/s", "held work/s", "to throttle"),
    )
    for title in ("host", "result", "onset °C", "to throttle", "duty", "throttled work/s"):
        table.add_column(title, justify="left" if title in ("host", "result") else "right")
    table.add_column("held work/s", justify="right")
    table.add_column("why", wrap=TEXT)
    origins = []
    for row in rows:
        point = ThrottlePoint.from_dict(row["calibration"]) if row.get("calibration") else None
        onset = NA if point is None else f"{point.onset_c:.1f} ({point.sensor or point.source})"
        table.add_row(
            Text(shown(row["host"])),
            Text(row["result"], style="green" if row["result"] == CALIBRATED else "bold red"),
            Text(shown(onset)),
            NA if point is None else f"{point.time_to_throttle_s:.0f} s",
            NA if point is None or point.duty_cycle is None else f"{point.duty_cycle:.0%}",
            NA if point is None or point.throttled is None else f"{point.throttled.work_rate:.3g}",
            NA if point is None or point.held is None else f"{point.held.work_rate:.3g}",
            Text(shown(row["error"] or "")),
        )
        if row.get("policy_origin"):
            origins.append(shown(f"{row['host']}: {row['policy_origin']}", 1000))
    if origins:
        table.caption = Text("\n".join(origins))
        table.caption_justify = "left"
    return table


@with_options
def calibrate(
    fleet: FleetOptions, minutes: CalibrateMinutes = 30.0, fmt: TableFormat = "table"
) -> None:
    """Have every host learn where it throttles (`agent calibrate` on each, at once).

    Each agent runs a sustained MLX load from cold on its own thermal source, then holds it below
    the onset, and keeps what it found as its calibrated policy (under any thresholds set with
    `coordinator policy`). Progress per host on stderr; at the end each host's onset, time to
    throttle, sustainable duty and both operating points. A host running a job refuses (busy).
    Ctrl-C stops following: each agent's calibration goes on and is kept (`coordinator policy`
    then names it). Exit 1 when any host did not calibrate.
    """
    rows = fleet.ask_each(
        lambda _: {"result": UNREACHABLE, "calibration": None, "policy_origin": None},
        lambda client, row: run_on(client, row, minutes),
        refused,
    )
    emit(rows, fmt, calibration_table)
    if not all(row["result"] == CALIBRATED for row in rows):
        raise typer.Exit(EXIT_PARTIAL)
