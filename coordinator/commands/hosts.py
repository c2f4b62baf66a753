"""Which agents a coordinator command drives and how it reaches them: the host options every
command declares once, and the Settings they make."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import zmq

from coordinator.hosts.hostfile import (
    GroupEntry,
    HostEntry,
    HostfileError,
    parse_hostfile,
    parse_hostfile_and_groups,
    parse_hosts,
    parse_hosts_and_groups,
)
from coordinator.hosts.keys import known_hosts, server_key
from coordinator.hosts.link import DEFAULT_HOST_TIMEOUT_S, Settings, Target, connect
from shared.bounds import MAX_CONNECT_TIMEOUT_S, MAX_HOST_TIMEOUT_S, duration_text
from shared.distributed.rank_env import BACKENDS
from shared.io.cli import err, usage_error
from shared.io.keys import own_keypair
from shared.io.options import at_least_zero, bounded_option, option_group
from shared.io.transport import AgentClient, AgentError, HostError

Hosts = Annotated[
    str | None,
    typer.Option(
        "--hosts",
        help="Comma list of HOST[:PORT] running `agent serve` (port 5555 by default). "
        "Without --hosts or --hostfile a local agent is started and stopped for the run.",
    ),
]
KnownHosts = Annotated[
    str | None,
    typer.Option(
        "--hosts",
        help="Comma list of HOST[:PORT] running `agent serve` (port 5555 by default). "
        "Default: every host with a key from `coordinator keys add`.",
    ),
]
Hostfile = Annotated[
    Path | None,
    typer.Option(
        "--hostfile", help="TOML or JSON list of hosts (host, port, key); mlx.launch's JSON too."
    ),
]
ConnectTimeout = bounded_option(
    "--connect-timeout",
    "Seconds a host has to answer before it is reported unreachable (above 0, at most "
    f"{duration_text(MAX_CONNECT_TIMEOUT_S)}).",
    "seconds",
    MAX_CONNECT_TIMEOUT_S,
)
HostTimeout = Annotated[
    float,
    typer.Option(
        "--host-timeout",
        callback=at_least_zero("--host-timeout", "seconds", MAX_HOST_TIMEOUT_S),
        help="Seconds a host that went silent mid-run is given to come back (reconnecting all "
        "the while) before it is failed; its job may still run, and `coordinator resume` "
        f"fetches what it measured. At most {duration_text(MAX_HOST_TIMEOUT_S)}.",
    ),
]
RingPort = Annotated[
    int,
    typer.Option(
        "--port",
        min=1024,
        max=65534,
        help="The ring's first port (mlx.launch's --starting-port): host i listens on PORT+i.",
    ),
]
Backend = Annotated[
    str,
    typer.Option(
        "--backend",
        metavar="|".join(BACKENDS).upper(),
        help="MLX's distributed backend: ring (TCP: Ethernet, Wi-Fi, Thunderbolt bridge), "
        "jaccl (RDMA over Thunderbolt 5, macOS 26.2+), auto (ring unless JACCL is set up).",
    ),
]
Insecure = Annotated[
    bool,
    typer.Option("--insecure", help="No CURVE: for agents started with `agent serve --insecure`."),
]


def targets_from(hosts: str | None, hostfile: Path | None) -> list[Target] | None:
    """The hosts named by --hosts / --hostfile, or None when neither was given."""
    entries = _entries(hosts, hostfile, parse_hosts, parse_hostfile)
    return None if entries is None else [_target(e) for e in entries]


def targets_and_groups(
    hosts: str | None, hostfile: Path | None
) -> list[Target | tuple[Target, ...]] | None:
    """`coordinator benchmark`'s hosts: each a Target, each group (`mac1+mac2`, or a hostfile's
    group entry) the tuple of its members' Targets in rank order; None when neither option was
    given."""
    entries = _entries(hosts, hostfile, parse_hosts_and_groups, parse_hostfile_and_groups)
    if entries is None:
        return None
    return [
        tuple(_target(m) for m in e.members) if isinstance(e, GroupEntry) else _target(e)
        for e in entries
    ]


def _entries(
    hosts: str | None,
    hostfile: Path | None,
    parse_text: Callable[[str], list[Any]],
    parse_file: Callable[[Path], list[Any]],
) -> list[Any] | None:
    """What --hosts or --hostfile names, parsed; a usage error naming the problem."""
    if hosts is not None and hostfile is not None:
        raise usage_error("give --hosts or --hostfile, not both")
    if hosts is not None and not hosts.strip(" ,"):
        raise usage_error("--hosts is empty: name at least one HOST[:PORT]")
    try:
        if hosts is not None:
            return parse_text(hosts)
        return None if hostfile is None else parse_file(hostfile)
    except (HostfileError, ValueError) as exc:
        raise usage_error(str(exc)) from None


def _target(entry: HostEntry) -> Target:
    return Target(entry.address, entry.address, server_key(entry), entry.ips, entry.rdma)


def targets_or_known(hosts: str | None, hostfile: Path | None) -> list[Target]:
    """The hosts named, else every host with a key from `coordinator keys add`."""
    targets = targets_from(hosts, hostfile)
    if targets is not None:
        return targets
    try:
        targets = [Target(address, address, key) for address, key in known_hosts().items()]
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    if not targets:
        raise usage_error(
            "no hosts: give --hosts or --hostfile, or add keys with "
            "`coordinator keys add HOST[:PORT] KEY`"
        )
    return targets


def settings_for(
    insecure: bool, connect_timeout: float, host_timeout: float = DEFAULT_HOST_TIMEOUT_S
) -> Settings:
    if insecure:
        err.print(
            "[bold red]WARNING: --insecure: CURVE is off; agents are not "
            "authenticated and traffic is clear text.[/bold red]",
            highlight=False,
        )
    return Settings(None if insecure else own_keypair(), connect_timeout, host_timeout)


Row = TypeVar("Row")
HostRow = dict[str, Any]


INTERRUPT_WAIT_S = 0.5
"""After Ctrl-C, how long the hosts' threads get to give up (a connect does at once) before the
command exits without them."""


def on_every_host(
    targets: list[Any], ask: Callable[[zmq.Context, Any, threading.Event], Row]
) -> list[Row]:
    """`ask(ctx, target, stop)` for every target at once (one timeout for all, not one per
    host), in the targets' order. Ctrl-C sets `stop` (a connect under way gives up at once) and
    is raised again within INTERRUPT_WAIT_S, whatever a host's thread is still waiting for."""
    ctx = zmq.Context()
    stop = threading.Event()
    rows: list[Any] = [None] * len(targets)
    errors: list[BaseException] = []

    def one(index: int, target: Any) -> None:
        try:
            rows[index] = ask(ctx, target, stop)
        except BaseException as exc:  # handed to the main thread, raised there
            errors.append(exc)

    threads = [
        threading.Thread(target=one, args=(i, t), name=f"ask {i}", daemon=True)
        for i, t in enumerate(targets)
    ]
    for thread in threads:
        thread.start()
    try:
        with err.status(waiting_line(len(targets))):  # drawn on a terminal only
            for thread in threads:
                thread.join()
    except KeyboardInterrupt:
        stop.set()
        give_up = time.monotonic() + INTERRUPT_WAIT_S
        for thread in threads:
            thread.join(max(0.0, give_up - time.monotonic()))
        if not any(thread.is_alive() for thread in threads):
            ctx.destroy(linger=0)
        raise  # a thread still waiting on its socket dies with the process
    ctx.destroy(linger=0)
    if errors:
        raise errors[0]
    return rows


def waiting_line(count: int) -> str:
    return f"waiting for {count} host{'' if count == 1 else 's'} to answer…"


def report_refusal(exc: AgentError, row: HostRow) -> None:
    """An agent's refusal as the row's error, in its own words."""
    row["error"] = str(exc)


def ask_each(
    targets: list[Target],
    settings: Settings,
    start: Callable[[Target], HostRow],
    ask: Callable[[AgentClient, HostRow], None],
    refused: Callable[[AgentError, HostRow], None] = report_refusal,
) -> list[HostRow]:
    """Every host's row, all asked at once: each starts as its `host`, then `start(target)`, then an
    `error` of None unless `start` placed it (what an unreachable host's row says), and `ask(client,
    row)` fills it in over one connection. An agent's refusal goes to `refused`; a host that cannot
    be reached keeps the row it had, with the reason as its error. No failure stops the other
    hosts."""

    def one(ctx: zmq.Context, target: Target, stop: threading.Event) -> HostRow:
        row = {"host": target.name, **start(target)}
        row.setdefault("error", None)
        try:
            with connect(ctx, target, settings, stop) as client:
                ask(client, row)
        except AgentError as exc:
            refused(exc, row)
        except HostError as exc:
            row["error"] = str(exc)
        return row

    return on_every_host(targets, one)


@option_group
@dataclass(frozen=True)
class FleetOptions:
    """The hosts a command asks (--hosts or --hostfile, else every host with a key from
    `coordinator keys add`) and how it reaches them: declared once for every such command."""

    hosts: KnownHosts = None
    hostfile: Hostfile = None
    connect_timeout: ConnectTimeout = 5.0
    insecure: Insecure = False

    def targets(self) -> list[Target]:
        return targets_or_known(self.hosts, self.hostfile)

    def settings(self, host_timeout: float = DEFAULT_HOST_TIMEOUT_S) -> Settings:
        return settings_for(self.insecure, self.connect_timeout, host_timeout)

    def ask_each(
        self,
        start: Callable[[Target], HostRow],
        ask: Callable[[AgentClient, HostRow], None],
        refused: Callable[[AgentError, HostRow], None] = report_refusal,
    ) -> list[HostRow]:
        """ask_each() over these hosts with these settings."""
        return ask_each(self.targets(), self.settings(), start, ask, refused)
