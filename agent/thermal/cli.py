"""`agent temp`: what the thermal source says now, and what the cooling policy would do about it."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from agent.thermal.base import SourceUnavailable, ThermalReading
from agent.thermal.monitor import ThermalMonitor, trend_slope
from shared.display import STATE_STYLES, sparkline, trend_arrow
from shared.io.cli import Hysteresis, MaxSpeedTemp, PauseTemp, StopTemp, policy_from_options
from shared.policy import CoolingState, ThermalPolicy, decide
from shared.source_names import SourceSpecError

FORMATS = ("table", "json")
EXIT_UNAVAILABLE, EXIT_USAGE = 1, 2
HISTORY_SHOWN = 30
TREND_WINDOW = 5  # the seed's is_rising window


def _fail(code: int, message: str) -> typer.Exit:
    """One plain line on stderr (Rich would wrap it at 80 columns when piped)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def kind(reading: ThermalReading | None) -> str:
    """How a value must be labelled: from a sensor, simulated/replayed, or not there at all."""
    if reading is None or (reading.celsius is None and reading.pressure is None):
        return "unavailable"
    return "simulated" if reading.simulated else "sensor"


def snapshot(
    source: str,
    reading: ThermalReading | None,
    reason: str | None,
    state: CoolingState | None,
    policy: ThermalPolicy,
) -> dict[str, Any]:
    """The JSON shape of one observation; `kind` and `simulated` say whether it is a sensor."""
    return {
        "source": reading.source if reading else source,
        "kind": kind(reading),
        "simulated": bool(reading and reading.simulated),
        "celsius": reading.celsius if reading else None,
        "pressure": reading.pressure if reading else None,
        "sensors": dict(reading.sensors) if reading else {},
        "time": (
            datetime.fromtimestamp(reading.time, timezone.utc).isoformat(timespec="milliseconds")
            if reading
            else None
        ),
        "state": state.value if state else None,
        "reason": None if reading else reason,
        "policy": policy.to_dict(),
    }


def render(
    data: dict[str, Any], history: list[float] | None = None, per_minute: float | None = None
) -> Table:
    """The Rich view of a snapshot; with a history (watch mode) also the trend in °C/min."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    label = {"simulated": " [bold magenta](SIMULATED: not a sensor)[/]", "unavailable": ""}
    table.add_row("Source", f"{data['source']}{label.get(data['kind'], '')}")
    celsius = data["celsius"]
    table.add_row("SoC °C", f"{celsius:.1f}" if celsius is not None else "[red]unavailable[/]")
    if history is not None:
        arrow = trend_arrow(per_minute)
        table.add_row("Trend", f"{arrow} {per_minute:+.1f} °C/min" if arrow else "—")
        table.add_row("History", sparkline(history[-HISTORY_SHOWN:]) or "—")
    table.add_row("Pressure", data["pressure"] or "—")
    policy = data["policy"]
    thresholds = (
        f"reduce ≥ {policy['max_speed_temp']:g}, pause ≥ {policy['pause_temp']:g}, "
        f"stop ≥ {policy['stop_temp']:g} °C"
    )
    if data["state"] is None:
        table.add_row("Policy", f"no reading, nothing to act on ({thresholds})")
    else:
        style = STATE_STYLES[CoolingState(data["state"])]
        table.add_row("Policy", f"[{style}]{data['state']}[/] ({thresholds})")
    for name, value in data["sensors"].items():
        table.add_row(f"  {name}", f"{value:.2f}")
    if data["reason"]:
        table.add_row("Why", Text(data["reason"]))
    if data["time"]:
        table.add_row("Time", data["time"])
    return table


def temp_command(
    source: Annotated[
        str,
        typer.Option(
            "--source",
            "-s",
            help="auto, none, iohid, macmon, powermetrics, linux, sim, replay:CSV.",
        ),
    ] = "auto",
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Keep reading: a live view.")
    ] = False,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table or json.")] = "table",
    interval: Annotated[
        float, typer.Option("--interval", help="Seconds between readings (and tool samples).")
    ] = 1.0,
    count: Annotated[
        int, typer.Option("--count", "-n", help="With --watch: stop after N readings; 0 never.")
    ] = 0,
    max_speed_temp: MaxSpeedTemp = 75.0,
    pause_temp: PauseTemp = 85.0,
    stop_temp: StopTemp = 95.0,
    hysteresis: Hysteresis = 0.0,
) -> None:
    """Show the SoC temperature, its source, the pressure level and the cooling policy's state."""
    if fmt not in FORMATS:
        raise _fail(EXIT_USAGE, f"unknown format {fmt!r}; choose from {', '.join(FORMATS)}")
    if not interval > 0 or count < 0:
        raise _fail(EXIT_USAGE, "--interval must be > 0 and --count >= 0")
    policy = policy_from_options(max_speed_temp, pause_temp, stop_temp, hysteresis)
    try:
        monitor = ThermalMonitor(poll_interval=interval, source=source)
    except SourceSpecError as exc:
        raise _fail(EXIT_USAGE, str(exc)) from None
    except SourceUnavailable as exc:
        raise _fail(EXIT_UNAVAILABLE, str(exc)) from None
    with monitor:
        if watch:
            _watch(monitor, policy, fmt, count)
        else:
            reading = monitor.read()
            state = decide(policy, reading.celsius, reading.pressure) if reading else None
            _emit(snapshot(monitor.source.name, reading, monitor.last_error, state, policy), fmt)


def _emit(data: dict[str, Any], fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(data), flush=True)
    else:
        Console().print(render(data))


def _watch(monitor: ThermalMonitor, policy: ThermalPolicy, fmt: str, count: int) -> None:
    """Poll in the background and show each tick: JSON lines, or a Live table with the trend."""
    monitor.start()
    state: CoolingState | None = None
    live = Live(auto_refresh=False, console=Console()) if fmt == "table" else None
    shown = 0
    try:
        if live:
            live.start()
        while True:
            reading = monitor.reading
            if reading:
                paused = state is CoolingState.PAUSE
                state = decide(policy, reading.celsius, reading.pressure, paused)
            else:
                state = None
            data = snapshot(monitor.source.name, reading, monitor.last_error, state, policy)
            if live:
                history = monitor.get_history()
                slope = trend_slope(history[-TREND_WINDOW:])
                per_minute = None if slope is None else slope * 60.0 / monitor.poll_interval
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
