"""`coordinator monitor`: the live dashboard, a one-shot snapshot for scripts, and /metrics."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.live import Live

from coordinator.commands.hosts import FleetOptions
from coordinator.telemetry.dashboard import UP, render, snapshot
from coordinator.telemetry.monitor import Monitor
from coordinator.telemetry.store import TelemetryStore
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import PIPE_WIDTH, emit, err, usage_error
from shared.io.options import TABLE_OR_JSON, RetentionDays, output_format, with_options
from shared.io.signals import interrupted_exit_code, sigterm_as_interrupt
from shared.io.sqlite import StoreError

if TYPE_CHECKING:
    from shared.io.metrics import FleetMetrics, MetricsServer

MonitorFormat = output_format(
    TABLE_OR_JSON, "table (the dashboard) or json (a snapshot; a line a second without --once)."
)
REFRESH_S = 0.25
"""How long a step waits for reports: what arrived is recorded within this."""
DRAW_EVERY_S = 1.0
"""The dashboard is drawn (or a JSON line printed) this often: agents publish once a second by
default, and drawing a lab's table is the monitor's largest cost (docs/performance.md)."""


def stored_conditions() -> dict[str, list[str]]:
    """Each cordoned host's condition names from the run store, at each scrape; none when the
    store cannot be read (the scrape goes on)."""
    from coordinator.runs.conditions import conditions
    from coordinator.runs.store import RunStore

    try:
        with RunStore() as store:
            return {
                host: [item["name"] for item in found] for host, found in conditions(store).items()
            }
    except StoreError:
        return {}


def start_exporter(metrics: FleetMetrics, address: str) -> MetricsServer:
    """/metrics at `address`, announced on stderr with the port actually bound."""
    from shared.io.metrics import ConditionsCollector, parse_address, serve_metrics

    metrics.registry.register(ConditionsCollector(stored_conditions))
    try:
        server = serve_metrics(metrics.registry, address)
    except ValueError as exc:
        raise usage_error(f"--prometheus: {exc}") from None
    except OSError as exc:
        raise usage_error(f"--prometheus {address}: cannot listen: {exc.strerror}") from None
    host = parse_address(address)[0]
    shown = f"[{host}]" if ":" in host else host
    err.print(
        f"coordinator monitor: metrics on http://{shown}:{server.port}/metrics", highlight=False
    )
    return server


@with_options
def monitor(
    fleet: FleetOptions,
    once: Annotated[
        bool,
        typer.Option(
            "--once",
            help="Print one snapshot (every host's current reading, or why there is "
            "none) and exit: 0 when every host is reachable and publishing, else 1.",
        ),
    ] = False,
    fmt: MonitorFormat = "table",
    prometheus: Annotated[
        str | None,
        typer.Option(
            "--prometheus",
            help="Also serve every host's metrics at http://HOST:PORT/metrics "
            "(port 0 picks a free one).",
        ),
    ] = None,
    retention_days: RetentionDays = 30.0,
) -> None:
    """Live thermal dashboard of every agent; everything heard is recorded.

    One row per host: SoC °C (marked sim when simulated or replayed), the machine's watts when
    its agent has a power source (marked sim likewise), the last five minutes, trend,
    pressure, policy state, supervised jobs, time paused; alert lines when a host
    pauses or stops a job, goes silent or becomes unreachable. Hosts are reconnected and their
    gaps backfilled by themselves. `coordinator history` reads what was recorded. Ctrl-C ends it.
    """
    targets, settings = fleet.targets(), fleet.settings()
    metrics, server = None, None
    if prometheus is not None:
        from shared.io.metrics import FleetMetrics  # prometheus_client only when asked

        metrics = FleetMetrics()
        server = start_exporter(metrics, prometheus)
    try:
        with (
            TelemetryStore() as store,
            Monitor(targets, settings, store, metrics, retention_days * 86400) as running,
        ):
            if once:
                healthy = show_once(running, fmt)
            else:
                with sigterm_as_interrupt():
                    watch(running, fmt)
    except StoreError as exc:
        raise usage_error(str(exc)) from None
    finally:
        if server is not None:
            server.close()
    if not once:
        raise typer.Exit(interrupted_exit_code())  # the watch ends only at Ctrl-C or SIGTERM
    if not healthy:
        raise typer.Exit(EXIT_PARTIAL)


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else PIPE_WIDTH)


def show_once(running: Monitor, fmt: str) -> bool:
    """Wait until every host is heard live, silent or unreachable; print; True if all are up."""
    while not running.board.settled():
        running.step(REFRESH_S)
    now = time.time()
    width = _console().width
    emit(snapshot(running.board, now), fmt, lambda _: render(running.board, now, width))
    return all(view.status == UP and not view.silent for view in running.board.hosts.values())


def terminal_size(console: Console) -> tuple[int, int]:
    """The terminal's size now, whatever COLUMNS and LINES say (a shell may export them, and
    Rich takes them as fixed: a resize would then go unnoticed)."""
    if not console.is_terminal:
        return console.size.width, console.size.height
    try:
        columns, lines = os.get_terminal_size(sys.stdout.fileno())
    except OSError:
        return console.size.width, console.size.height
    return columns, lines


def watch(running: Monitor, fmt: str) -> None:
    """The Live dashboard (or JSON lines) until Ctrl-C or SIGTERM (shared.io.signals: SIGTERM
    ends it as Ctrl-C does); the caller then flushes what was recorded and exits 130, or 143
    after SIGTERM (README, Exit codes)."""
    try:
        if fmt == "json":
            printed = 0.0
            while True:
                running.step(REFRESH_S)
                if time.monotonic() - printed >= DRAW_EVERY_S:
                    print(json.dumps(snapshot(running.board, time.time())), flush=True)
                    printed = time.monotonic()
        console = _console()
        size = console.size = terminal_size(console)
        with Live(console=console, auto_refresh=False) as live:
            drawn = 0.0
            while True:
                if terminal_size(console) != size:  # resized: what the terminal rewrapped goes
                    size = console.size = terminal_size(console)
                    console.clear()
                    drawn = 0.0
                if time.monotonic() - drawn >= DRAW_EVERY_S:
                    board = render(running.board, time.time(), *size)
                    live.update(board, refresh=True)
                    drawn = time.monotonic()
                running.step(REFRESH_S)
    except KeyboardInterrupt:
        return
