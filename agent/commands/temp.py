"""`agent temp`: what the thermal source says now, and what the cooling policy would do about it."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from agent.clocks.base import ClockSource
from agent.clocks.registry import open_clock_source
from agent.commands.sensors import open_monitor
from agent.cooling.calibration_file import policy_defaults
from agent.cooling.clock_throttle import ClockThrottle
from agent.daemon.telemetry import TREND_WINDOW, trend_c_per_min
from agent.thermal.base import ThermalReading
from agent.thermal.monitor import ThermalMonitor
from shared.bounds import MAX_COUNT
from shared.cooling.calibration import PolicyInForce
from shared.cooling.clocks import clock_summary, sample_fields
from shared.cooling.display import STATE_STYLES, sparkline, trend_arrow
from shared.cooling.pace import pace_text
from shared.cooling.policy import CoolingState, Supervision, host_state
from shared.cooling.throttle import POLLS
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import print_rich, usage_error
from shared.io.given import needs
from shared.io.options import PolicyOptions, TableFormat, ThermalOptions, with_options
from shared.tables import TEXT, FitTable

HISTORY_SHOWN = 30
CLOCK_WINDOW_S = 0.5
"""A single `agent temp` reads the clocks over this long when its source counts intervals
(IOReport's residencies: a clock is an average over time)."""


def kind(reading: ThermalReading | None) -> str:
    """How a value must be labelled: from a sensor, simulated/replayed, a real Mac's readings
    replayed from a capture, or not there at all."""
    if reading is None or (reading.celsius is None and reading.pressure is None):
        return "unavailable"
    if reading.simulated:
        return "simulated"
    return "capture" if reading.source == "capture" else "sensor"


def snapshot(
    source: str,
    reading: ThermalReading | None,
    reason: str | None,
    state: CoolingState | None,
    policy: PolicyInForce,
    clocks: dict[str, Any] | None = None,
    duty: float | None = None,
) -> dict[str, Any]:
    """The JSON shape of one observation; `kind` and `simulated` say whether it is a sensor.
    `clocks`: a sample's clock fields (shared.cooling.clocks.sample_fields); `duty`: the pace
    tier's while the state is pace."""
    return {
        "source": reading.source if reading else source,
        "kind": kind(reading),
        "simulated": bool(reading and reading.simulated),
        "celsius": reading.celsius if reading else None,
        "sensor": reading.sensor if reading else None,
        "pressure": reading.pressure if reading else None,
        "sensors": dict(reading.sensors) if reading else {},
        "note": reading.note if reading else None,
        "time": (
            datetime.fromtimestamp(reading.time, timezone.utc).isoformat(timespec="milliseconds")
            if reading
            else None
        ),
        "state": state.value if state else None,
        "duty": duty if state else None,
        "reason": None if reading else reason,
        "policy": policy.policy.to_dict(),
        "policy_origin": policy.origin,
        "clocks": clocks,
    }


def read_clocks(clock: ClockSource, throttle: ClockThrottle | None = None) -> dict[str, Any]:
    """The clock fields of a sample, read now (never raises: a source says why it has none);
    with `throttle` (--watch), also its verdict on them: `throttling` and `throttle_evidence`
    (docs/thermal.md, Throttling as a state; the clock alone: `agent temp` runs no job)."""
    reading = clock.read()
    fields = sample_fields(reading, clock.name, clock.simulated, clock.last_error)
    if throttle is None:
        return fields
    verdict = throttle.observe(reading)
    return fields | {"throttling": verdict.throttling, "throttle_evidence": verdict.text}


def throttle_cell(clocks: dict[str, Any]) -> Text:
    """The throttle rule's verdict on the clock: `yes: GPU 1.10 GHz of 1.40 sustained`, `no`,
    or why there is none (one reading: the rule needs POLLS; no load, no clock)."""
    if "throttling" not in clocks:
        return Text(f"— (the rule needs {POLLS} polls under load: agent temp --watch)")
    evidence = clocks["throttle_evidence"]
    if clocks["throttling"] is None:
        return Text("— (no load on the GPU, or no clock: no verdict)")
    if clocks["throttling"]:
        return Text(f"yes: {evidence}", style="bold dark_orange")
    return Text(f"no ({evidence})" if evidence else "no")


def render(
    data: dict[str, Any], history: list[float] | None = None, per_minute: float | None = None
) -> FitTable:
    """The Rich view of a snapshot; with a history (watch mode) also the trend in °C/min. A
    `field  value` list (shared.tables): a reading never wraps, a long reason wraps in its cell."""
    table = FitTable(show_header=False, box=None, pad_edge=False)
    table.add_column("field", style="bold")
    table.add_column("value", wrap=TEXT)
    label = {
        "simulated": " [bold magenta](SIMULATED: not a sensor)[/]",
        "capture": " [bold cyan](CAPTURE: real readings, replayed)[/]",
    }
    table.add_row("Source", f"{data['source']}{label.get(data['kind'], '')}")
    celsius = data["celsius"]
    table.add_row("SoC °C", f"{celsius:.1f}" if celsius is not None else "[red]unavailable[/]")
    if data["sensor"]:
        table.add_row("Sensor", Text(data["sensor"]))
    if data.get("note"):
        table.add_row("Note", Text(data["note"], style="yellow"))
    if history is not None:
        arrow = trend_arrow(per_minute)
        trend = (
            f"{arrow} {per_minute:+.1f} °C/min" if arrow else f"— (after {TREND_WINDOW} readings)"
        )
        table.add_row("Trend", trend)
        table.add_row("History", sparkline(history[-HISTORY_SHOWN:]) or "—")
    table.add_row("Pressure", data["pressure"] or "—")
    if data.get("clocks") is not None:
        clocks = data["clocks"]
        summary = clock_summary(clocks)
        if summary.startswith("unavailable"):
            table.add_row("Clocks", Text(summary, style="red"))
        else:
            table.add_row("Clocks", Text(f"{summary} [{clocks['clock_source']}]"))
            if clocks["clock_note"]:
                table.add_row("  means", Text(clocks["clock_note"]))
        table.add_row("Throttling", throttle_cell(clocks))
    policy = data["policy"]
    thresholds = (
        f"reduce ≥ {policy['max_speed_temp']:g}, pause ≥ {policy['pause_temp']:g}, "
        f"stop ≥ {policy['stop_temp']:g} °C"
        + (f", paced under {policy['pace_temp']:g} °C" if policy.get("pace_temp") else "")
        + f"; {data['policy_origin']}"
    )
    if data["state"] is None:
        table.add_row("Policy", f"no reading, nothing to act on ({thresholds})")
    else:
        style = STATE_STYLES[CoolingState(data["state"])]
        state = pace_text(data["duty"]) if data["state"] == "pace" else data["state"]
        table.add_row("Policy", f"[{style}]{state}[/] ({thresholds})")
    for name, value in data["sensors"].items():
        table.add_row(f"  {name}", f"{value:.2f}")
    if data["reason"]:
        table.add_row("Why", Text(data["reason"]))
    if data["time"]:
        table.add_row("Time", data["time"])
    return table


@with_options
def temp_command(
    thermal: ThermalOptions,
    limits: PolicyOptions,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Keep reading: a live view.")
    ] = False,
    fmt: TableFormat = "table",
    count: Annotated[
        int,
        typer.Option("--count", "-n", help="With --watch: stop after N readings; 0 never."),
    ] = 0,
) -> None:
    """Show the SoC temperature, its source, the pressure level and the cooling policy's state.

    Exit codes: 0 a reading was shown (or none, with why), 1 the source cannot work on this
    machine, 2 bad usage."""
    if not 0 <= count <= MAX_COUNT:
        raise usage_error(f"--count must be 0 to {MAX_COUNT}, got {count}")
    needs("--count", count or None, "--watch", watch)
    with open_monitor(thermal, EXIT_PARTIAL) as monitor, open_clock_source(monitor.source) as clock:
        policy = limits.in_force(
            monitor.source.scale, policy_defaults(monitor.source.scale, monitor.source.name)
        )
        if watch:
            _watch(monitor, clock, policy, fmt, count)
        else:
            started = time.monotonic()
            reading = monitor.read()
            host, state = host_state(policy.policy, reading, Supervision())
            if clock.counts_intervals:
                time.sleep(max(0.0, CLOCK_WINDOW_S - (time.monotonic() - started)))
            data = snapshot(
                monitor.source.name, reading, monitor.last_error, state, policy,
                read_clocks(clock), host.duty,
            )  # fmt: skip
            _emit(data, fmt)


def _emit(data: dict[str, Any], fmt: str) -> None:
    """One observation: a JSON line (a stream of them with --watch), or the table."""
    if fmt == "json":
        print(json.dumps(data), flush=True)
    else:
        print_rich(render(data))


def _watch(
    monitor: ThermalMonitor, clock: ClockSource, policy: PolicyInForce, fmt: str, count: int
) -> None:
    """Poll in the background and show each tick: JSON lines, or a Live table with the trend
    and the throttle rule's verdict on the clock (agent.cooling.clock_throttle)."""
    monitor.start()
    supervision = Supervision()
    throttle = ClockThrottle(monitor.source.name)
    live = Live(auto_refresh=False, console=Console()) if fmt == "table" else None
    shown = 0
    try:
        if live:
            live.start()
        while True:
            reading = monitor.reading
            supervision, state = host_state(policy.policy, reading, supervision)
            clocks = read_clocks(clock, throttle)
            data = snapshot(
                monitor.source.name, reading, monitor.last_error, state, policy, clocks,
                supervision.duty,
            )  # fmt: skip
            if live:
                history = monitor.get_history()
                per_minute = trend_c_per_min(history, monitor.poll_interval)
                live.update(render(data, history, per_minute), refresh=True)
            else:
                _emit(data, fmt)
            shown += 1
            if count and shown >= count:
                return
            time.sleep(monitor.poll_interval)
    except KeyboardInterrupt:
        return
    finally:
        if live:
            live.stop()
