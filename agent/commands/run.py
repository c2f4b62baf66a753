"""`agent run -- CMD ARGS...`: a command (a fine-tune) supervised by the cooling policy.

When this machine's `agent serve` runs (same data directory), the command is registered with it: the
daemon's readings and policy drive the supervision (no second sensor reader), and the daemon lists
the job and publishes its events (agent.cooling.feed). Otherwise, or once the daemon is gone,
`agent run` reads the sensor itself and needs no daemon, no coordinator and no network. See
agent.cooling.supervise for the actions and the reduce_batch state file."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from contextlib import ExitStack, closing
from pathlib import Path
from typing import Annotated

import typer

from agent.awake.assertion import hold_awake
from agent.commands.sensors import open_monitor
from agent.cooling.accounting import SUMMARY_ACTION
from agent.cooling.calibration_file import policy_defaults
from agent.cooling.events import PREFIX, EventLog, format_line
from agent.cooling.feed import register
from agent.cooling.gang import GangRank, group_holder
from agent.cooling.supervise import LaunchError, Sink, Supervisor
from agent.daemon_address import find_daemon
from agent.thermal import ThermalMonitor
from shared.bounds import MAX_GRACE_S, MAX_THROTTLE_WINDOW_S, BoundError, check_seconds
from shared.cooling.gang import GangIdentity, GangSpecError, from_environment, from_options
from shared.cooling.job_account import THROTTLE_WINDOW_S, render
from shared.exit_codes import EXIT_SUPERVISOR_FAILED
from shared.io.cli import data_home, fail, usage_error
from shared.io.options import PolicyOptions, ThermalOptions, with_options
from shared.wire.protocol import DEFAULT_PORT
from shared.wire.telemetry import Event


def print_event(event: Event) -> None:
    """One line per event; the job's summary as its few short lines (its detail is JSON)."""
    if event.action == SUMMARY_ACTION and event.detail:
        lines = [f"{PREFIX} {line}" for line in render(json.loads(event.detail))]
        print("\n".join(lines), file=sys.stderr, flush=True)
        return
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


@with_options
def run_command(
    command: Annotated[
        list[str],
        typer.Argument(
            metavar="CMD", help="The command and its arguments, after --.", show_default=False
        ),
    ],
    thermal: ThermalOptions,
    limits: PolicyOptions,
    grace: Annotated[
        float, typer.Option("--grace", help="Seconds from SIGTERM to SIGKILL when stopping.")
    ] = 30.0,
    throttle_window: Annotated[
        float,
        typer.Option(
            "--throttle-window",
            help="Seconds of mlx_lm reports at the start and at the end whose mean tokens/s "
            "the summary's throttle ratio compares.",
            metavar="SECONDS",
        ),
    ] = THROTTLE_WINDOW_S,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            help="CMD is one rank of the distributed job NAME (for launchers that set no "
            "MLX_RANK/MLX_HOSTFILE; mlx.launch's are read by themselves).",
            metavar="NAME",
            rich_help_panel="Distributed jobs",
        ),
    ] = None,
    ranks: Annotated[
        int | None,
        typer.Option(
            "--ranks",
            help="How many ranks the --group job has.",
            min=2,
            rich_help_panel="Distributed jobs",
        ),
    ] = None,  # fmt: skip
    rank: Annotated[
        int | None,
        typer.Option(
            "--rank",
            help="This rank (default: $MLX_RANK).",
            min=0,
            rich_help_panel="Distributed jobs",
        ),
    ] = None,  # fmt: skip
    rank_hosts: Annotated[
        str | None,
        typer.Option(
            "--rank-hosts",
            help="Each rank's Mac, in rank order, comma-separated (where their agents serve).",
            metavar="H0,H1,...",
            rich_help_panel="Distributed jobs",
        ),
    ] = None,
) -> None:
    """Run CMD in its own process group under the cooling policy.

    Pause: SIGSTOP to the group. Resume: SIGCONT. Stop: SIGTERM, then
    SIGKILL after --grace. reduce_batch: the JSON file named by
    $MLX_FLEET_COOLING_STATE says so (and SIGUSR1 when CMD runs with
    MLX_FLEET_COOPERATIVE=1). SIGTERM, SIGINT and SIGHUP to agent run go to
    the group too; a second one, SIGKILL at once. Each action is a line on
    stderr and a row in agent-events.sqlite in the data directory. At the
    end a summary (a `summary` event) gives the job's wall time, its time
    paused and why, time at each pressure level, its hottest reading and,
    from mlx_lm's reports on CMD's stdout (passed through unchanged), its
    tokens/s and throttle ratio.

    With `agent serve` running on this machine, the readings and the policy
    are the daemon's (the threshold options are not used) and the job shows
    in its telemetry; --thermal-source and --poll-interval then serve only
    while no daemon answers, when agent run supervises by itself (and joins
    a daemon again as soon as one answers). CMD never outlives agent run: a
    guardian process ends CMD's group if agent run is killed, even with
    SIGKILL.

    A rank of a distributed MLX job (mlx.launch's MLX_RANK and MLX_HOSTFILE,
    or JACCL's variables, or --group) lives under its gang: when any rank's
    Mac asks for a pause every rank pauses, they resume when every Mac
    allows it, and a stop on one stops all (each exits 75), agent to agent
    with no coordinator (the peers' keys: agent keys trust KEY --peer HOST).

    \b
    Examples:
      agent run -- python -m mlx_lm lora --model M --train --data D
      mlx.launch --hostfile hosts.json -- agent run -- python train.py

    Exit codes: CMD's own (128+N if signal N killed it), 75 thermal stop,
    2 bad usage (thresholds out of order, unknown source), 125 thermal source
    unusable here, 126 CMD cannot be executed, 127 CMD not found.
    """
    try:
        check_seconds("--grace", grace, MAX_GRACE_S)
        check_seconds("--throttle-window", throttle_window, MAX_THROTTLE_WINDOW_S, above_least=True)
    except BoundError as exc:
        raise usage_error(str(exc)) from None
    limits.check()
    identity = gang_identity(group, ranks, rank, rank_hosts)
    data_home()  # its event log and state file: a bad data dir is one line before CMD starts
    with ExitStack() as stack:
        log = stack.enter_context(closing(EventLog()))
        forwards: list[Sink] = []
        supervisor = Supervisor(
            command,
            grace=grace,
            sinks=[print_event, recorder(log, forwards)],
            throttle_window_s=throttle_window,
        )
        try:
            feed, forwarder = register(
                thermal.thermal_source,
                thermal.poll_interval,
                lambda source: limits.for_scale(
                    source.scale, policy_defaults(source.scale, source.name)
                ),
                lambda: local_monitor(thermal),
            )
        except ValueError as exc:  # thresholds out of order with this source's defaults
            raise usage_error(str(exc)) from None
        stack.callback(forwarder.close)  # after the exit event, which it forwards too
        forwards.append(forwarder)
        if feed.remote:
            typer.echo(
                f"{PREFIX} registered with agent serve: readings from "
                f"{feed.source}, its {feed.policy}",
                err=True,
            )
            if feed.source == "none":
                typer.echo(
                    f"{PREFIX} warning: agent serve has no thermal source; CMD runs "
                    "without thermal enforcement",
                    err=True,
                )
        else:
            typer.echo(f"{PREFIX} supervising with {feed.source} here, {feed.policy}", err=True)
        if identity is not None:
            supervisor.gang = join_gang(identity, supervisor, thermal.poll_interval)
        try:
            with hold_awake(f"agent run {command[0]}"):
                code = supervisor.run(feed)
        except LaunchError as exc:
            raise fail(str(exc), exc.code) from None
    raise typer.Exit(code)


def local_monitor(thermal: ThermalOptions) -> ThermalMonitor:
    """This machine's sensor, read by agent run itself; exits 2 or 125 when it cannot be."""
    monitor = open_monitor(thermal, EXIT_SUPERVISOR_FAILED)
    if monitor.source.name == "none":
        typer.echo(
            f"{PREFIX} warning: {monitor.last_error}; CMD runs without thermal enforcement",
            err=True,
        )
    return monitor


def gang_identity(
    group: str | None, ranks: int | None, rank: int | None, rank_hosts: str | None
) -> GangIdentity | None:
    """The gang CMD is a rank of: --group's (bad options: exit 2), else mlx.launch's from the
    environment; an environment that names one badly is said in one line, and CMD is
    supervised alone (a fine-tune is never refused for it)."""
    if group is None:
        if ranks is not None or rank_hosts is not None or rank is not None:
            raise usage_error("--rank, --ranks and --rank-hosts need --group")
        try:
            return from_environment(os.environ, lambda path: Path(path).read_text("utf-8"))
        except GangSpecError as exc:
            typer.echo(f"{PREFIX} warning: {exc}; supervising this rank alone", err=True)
            return None
    if ranks is None:
        raise usage_error("--group needs --ranks: how many ranks the job has")
    if rank is None and os.environ.get("MLX_RANK", "").isdigit():
        rank = int(os.environ["MLX_RANK"])
    try:
        return from_options(group, ranks, rank, (rank_hosts or "").split(","))
    except GangSpecError as exc:
        raise usage_error(str(exc)) from None


def join_gang(identity: GangIdentity, supervisor: Supervisor, poll_interval: float) -> GangRank:
    """The gang's side of the supervision; exit 2 when another job on this Mac already is this
    rank of the group (two jobs cannot be one rank; two ranks may share a Mac)."""
    daemon = find_daemon()
    port = int(daemon.endpoint.rpartition(":")[2]) if daemon else DEFAULT_PORT
    taken = group_holder(identity.group, identity.rank)
    if taken is not None:
        raise usage_error(
            f"rank {identity.rank} of group {identity.group} is already job {taken}'s on this Mac"
        )
    typer.echo(f"{PREFIX} {identity.describe()}", err=True)
    if os.environ.get("MLX_METAL_FAST_SYNCH") == "1":  # docs/monitoring.md, Distributed
        typer.echo(
            f"{PREFIX} warning: MLX_METAL_FAST_SYNCH=1 makes a waiting rank spin on the GPU "
            "(ml-explore/mlx#3830 wedged GPUs so): unset it for a job that may be paused",
            err=True,
        )
    return GangRank(identity, supervisor.job, poll_interval, supervisor.post_gang_news, port)
