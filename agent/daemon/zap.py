"""The ZAP check `agent serve` runs on every CURVE handshake: whom this agent obeys.

Trusted coordinators are the certificates in keys/trusted (shared.io.trust), read on every
handshake (rare, and a few small files), so `agent keys trust/revoke` apply at once without any
reload signal. The agent's own key is trusted too: only processes of its user on this machine
hold it (`agent run`, RemoteMonitor).
"""

from __future__ import annotations

import logging
from pathlib import Path

from agent.daemon.throttle import LogThrottle
from shared.io.trust import list_trusted

log = logging.getLogger("agent.keys")


class TrustedKeys:
    """The ZAP credentials provider: is this client key trusted? Refusals are logged through
    `throttle`: the first one of a minute with its key, then a count (a scanner cycling keys
    must not flood the log)."""

    def __init__(self, directory: Path, throttle: LogThrottle | None = None) -> None:
        self.directory = directory
        self.throttle = throttle or LogThrottle(log)
        self.peers: set[str] = set()
        """The keys let in as peer agents (trusted with --peer): the daemon lets them only
        exchange gang states. Updated on this (ZAP) thread, read on the daemon's."""

    def callback(self, domain: str, key: bytes) -> bool:
        client = key.decode("ascii", "replace")
        entry = next((e for e in list_trusted(self.directory) if e.key == client), None)
        if entry is not None:
            if entry.peer is not None:
                self.peers.add(client)
            else:
                self.peers.discard(client)
            return True
        self.throttle.log(
            "refused handshakes",
            logging.WARNING,
            "refused a coordinator: key %s is not trusted here (to allow it: "
            "agent keys trust '%s')",
            client,
            client,
        )
        return False


class OwnOrTrustedKeys:
    """ZAP: the coordinators in keys/trusted, and this agent's own key."""

    def __init__(self, own: str, trusted: TrustedKeys) -> None:
        self.own = own
        self.trusted = trusted

    def callback(self, domain: str, key: bytes) -> bool:
        return key.decode("ascii", "replace") == self.own or self.trusted.callback(domain, key)
