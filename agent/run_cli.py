"""`agent run -- CMD ARGS...`: a command (a fine-tune) supervised by the cooling policy.

When this machine's `agent serve` runs (same data directory), the command is registered with it:
the daemon's readings and policy drive the supervision (no second sensor reader), and the daemon
lists the job and publishes its events (agent.remote). Otherwise, or once the daemon is gone,
`agent run` reads the sensor itself and needs no daemon, no coordinator and no network. See
agent.supervise for the actions and the reduce_batch state file.
"""

from __future__ import annotations

import math
import sqlite3
import sys
from contextlib import ExitStack, closing
from typing import Annotated

import typer

from agent.events import PREFIX, EventLog, format_line
from agent.remote import register
from agent.supervise import Feed, LaunchError, LocalFeed, Sink, Supervisor
from agent.telemetry import policy_text
from agent.thermal import SourceSpecError, SourceUnavailable, ThermalMonitor
from shared.io.cli import (
    Hysteresis,
    MaxSpeedTemp,
    PauseTemp,
    PollInterval,
    StopTemp,
    ThermalSourceName,
    policy_from_options,
    usage_error,
)
from shared.telemetry import Event

EXIT_SUPERVISOR_FAILED = 125  # as timeout(1) and env(1) say when they, not CMD, failed


def _fail(code: int, message: str) -> typer.Exit:
    """One plain line on stderr for the failures that are not usage errors (125-127)."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def print_event(event: Event) -> None:
    print(format_line(event), file=sys.stderr, flush=True)


def recorder(log: EventLog, then: list[Sink]) -> Sink:
    """The sink that records each event in the event log and hands it on, numbered, to `then`
    (the daemon, once registered): the daemon publishes what was recorded without recording it
    again. An event the log could not take is still handed on, unnumbered, and the daemon
    records it."""

    def record(event: Event) -> None:
        try:
            event = log.record(event)
        except sqlite3.Error as exc:  # enforcement must not depend on the disk
            print(f"{PREFIX} warning: event {event.action} not recorded: {exc}", file=sys.stderr)
        for sink in then:
            sink(event)

    return record


def run_command(
    command: Annotated[
        list[str],
        typer.Argument(
            metavar="CMD", help="The command and its arguments, after --.", show_default=False
        ),
    ],
    thermal_source: ThermalSourceName = "auto",
    poll_interval: PollInterval = 1.0,
    max_speed_temp: MaxSpeedTemp = 75.0,
    pause_temp: PauseTemp = 85.0,
    stop_temp: StopTemp = 95.0,
    hysteresis: Hysteresis = 0.0,
    grace: Annotated[
        float, typer.Option("--grace", help="Seconds from SIGTERM to SIGKILL when stopping.")
    ] = 30.0,
) -> None:
    """Run CMD in its own process group under the cooling policy.

    Pause: SIGSTOP to the group. Resume: SIGCONT. Stop: SIGTERM, then
    SIGKILL after --grace. reduce_batch: the JSON file named by
    $MLX_FLEET_COOLING_STATE says so (and SIGUSR1 when CMD runs with
    MLX_FLEET_COOPERATIVE=1). SIGTERM, SIGINT and SIGHUP to agent run go to
    the group too; a second one, SIGKILL at once. Each action is a line on
    stderr and a row in agent-events.sqlite in the data directory.

    With `agent serve` running on this machine, the readings and the policy
    are the daemon's (the threshold options are not used) and the job shows
    in its telemetry; --thermal-source and --poll-interval then serve only
    if the daemon goes away, when agent run supervises by itself.

    Exit codes: CMD's own (128+N if signal N killed it), 75 thermal stop,
    2 bad usage (thresholds out of order, unknown source), 125 thermal source
    unusable here, 126 CMD cannot be executed, 127 CMD not found.
    """
    if not (math.isfinite(poll_interval) and poll_interval > 0):
        raise usage_error(f"--poll-interval must be > 0 seconds, got {poll_interval}")
    if not (math.isfinite(grace) and grace >= 0):
        raise usage_error(f"--grace must be >= 0 seconds, got {grace}")
    policy = policy_from_options(max_speed_temp, pause_temp, stop_temp, hysteresis)
    with ExitStack() as stack:
        log = stack.enter_context(closing(EventLog()))
        forwards: list[Sink] = []
        supervisor = Supervisor(command, grace=grace, sinks=[print_event, recorder(log, forwards)])
        feed: Feed
        registered = register(thermal_source, poll_interval)
        if registered is not None:
            daemon_feed, forwarder = registered
            stack.callback(forwarder.close)  # after the exit event, which it forwards too
            forwards.append(forwarder)
            typer.echo(
                f"{PREFIX} registered with agent serve: readings from "
                f"{daemon_feed.source}, its policy {policy_text(daemon_feed.policy)}",
                err=True,
            )
            if daemon_feed.source == "none":
                typer.echo(
                    f"{PREFIX} warning: agent serve has no thermal source; CMD runs "
                    "without thermal enforcement",
                    err=True,
                )
            feed = daemon_feed
        else:
            feed = LocalFeed(local_monitor(thermal_source, poll_interval), policy)
        try:
            code = supervisor.run(feed)
        except LaunchError as exc:
            raise _fail(exc.code, str(exc)) from None
    raise typer.Exit(code)


def local_monitor(thermal_source: str, poll_interval: float) -> ThermalMonitor:
    """This machine's sensor, read by agent run itself; exits 2 or 125 when it cannot be."""
    try:
        monitor = ThermalMonitor(poll_interval=poll_interval, source=thermal_source)
    except SourceSpecError as exc:
        raise usage_error(str(exc)) from None
    except SourceUnavailable as exc:
        raise _fail(EXIT_SUPERVISOR_FAILED, str(exc)) from None
    if monitor.source.name == "none":
        typer.echo(
            f"{PREFIX} warning: {monitor.last_error}; CMD runs without thermal enforcement",
            err=True,
        )
    return monitor
