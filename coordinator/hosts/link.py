"""How the coordinator reaches one agent: the host as a target, the settings every connection
takes, and the one way to connect (a name DNS cannot resolve and a missing server key said
first). Every command that talks to agents borrows it: fleet runs, monitor, netbench, status."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import zmq

from shared.io.keys import Keypair
from shared.io.transport import AgentClient, HostError, resolve_error

DEFAULT_HOST_TIMEOUT_S = 120.0
"""How long a silent host is given to come back before it is failed (its job may still run)."""


@dataclass(frozen=True)
class Target:
    """A host to drive: `name` labels it in reports, `address` (HOST:PORT) reaches it."""

    name: str
    address: str
    server_key: str | None
    ips: tuple[str, ...] = ()
    """Where a distributed job's peers reach it (a hostfile's mlx.launch `ips`); empty: the
    address's host."""
    rdma: tuple[str | None, ...] | None = None
    """Its RDMA device towards each host (mlx.launch's `rdma`), for JACCL; None: none given."""


@dataclass(frozen=True)
class Settings:
    """How to reach agents: `keypair` None means no CURVE (agents run --insecure)."""

    keypair: Keypair | None
    connect_timeout: float = 5.0
    host_timeout: float = DEFAULT_HOST_TIMEOUT_S


def connect(
    ctx: zmq.Context, target: Target, settings: Settings, stop: threading.Event | None = None
) -> AgentClient:
    """A client whose hello the agent answered; HostError says why there is none (a name DNS
    cannot resolve first: no key is worth adding for a mistyped host). Setting `stop` (Ctrl-C)
    ends a connect under way at once."""
    unresolved = resolve_error(target.address)
    if unresolved is not None:
        raise HostError(unresolved)
    if settings.keypair is not None and target.server_key is None:
        raise HostError(
            f"no server key known for {target.address}: run `agent keys show` "
            f"there, then `coordinator keys add {target.address} KEY` (or give "
            "the key in the hostfile)"
        )
    server_key = target.server_key if settings.keypair is not None else None
    client = AgentClient(
        ctx, target.address, server_key, settings.keypair, settings.connect_timeout, stop
    )
    try:
        client.connect()
    except BaseException:
        client.close()
        raise
    return client
