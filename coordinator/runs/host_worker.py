"""One thread per host for a command that keeps asking many agents at once (a stage): each keeps
its own connection, sends the requests it is handed in order, asks one request again and again
(a poll), and reports every reply, refusal and loss to one queue. A host that stops answering
is reconnected until its timeout runs out, then reported lost; no host waits on another."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq

from coordinator.hosts.link import Settings, Target, connect
from shared.io.transport import AgentClient, AgentError, HostError, InvalidMessage

REPLY, REFUSED, UNREACHABLE, RECONNECTED, LOST = (
    "reply",
    "refused",
    "unreachable",
    "reconnected",
    "lost",
)
Request = tuple[str, dict[str, Any], Any, float | None]
"""A request's type, body, the asker's tag and its reply's timeout (None: the connect timeout)."""
INVALID_REPLY = "invalid-reply"
"""A REFUSED report's `code` for a reply that failed its checks (no agent sends this code): the
host answered, so it is not reconnected and asked again, which would never end."""
RETRY_S = 1.0
"""Between reconnection attempts of an unreachable host."""


@dataclass(frozen=True)
class HostReport:
    """What a host's worker heard: `kind` REPLY (`body` the reply's), REFUSED (`error`, with
    the agent's `code` or INVALID_REPLY), UNREACHABLE / RECONNECTED / LOST (`error` why);
    `request` is the type asked, `tag` what the asker attached to it."""

    host: str
    kind: str
    request: str = ""
    body: dict[str, Any] | None = None
    error: str | None = None
    code: str | None = None
    tag: Any = None


class HostWorker(threading.Thread):
    """Sends `ask()`ed requests to one agent, and `poll` (a request type and body, or None)
    every `poll_s` while nothing else waits. Reports go to `reports`; `stop` ends it."""

    def __init__(
        self,
        ctx: zmq.Context,
        target: Target,
        settings: Settings,
        reports: queue.Queue[HostReport],
        stop: threading.Event,
        poll_s: float = 0.5,
    ) -> None:
        super().__init__(name=f"host {target.name}", daemon=True)
        self.ctx, self.target, self.settings = ctx, target, settings
        self.reports, self.stop = reports, stop
        self.poll_s = poll_s
        self.poll: tuple[str, dict[str, Any]] | None = None
        self.inbox: queue.Queue[Request] = queue.Queue()

    def ask(
        self, type_: str, body: dict[str, Any], tag: Any = None, timeout: float | None = None
    ) -> None:
        """Send `type_` next; `timeout`: seconds its reply may take (the connect timeout when
        None: a request the agent answers at once)."""
        self.inbox.put((type_, body, tag, timeout))

    def _report(self, kind: str, **fields: Any) -> None:
        self.reports.put(HostReport(self.target.name, kind, **fields))

    def run(self) -> None:
        client: AgentClient | None = None
        lost_since: float | None = None
        pending: Request | None = None
        while not self.stop.is_set():
            try:
                if client is None:
                    client = connect(self.ctx, self.target, self.settings, self.stop)
                    if lost_since is not None:
                        self._report(RECONNECTED)
                    lost_since = None
                while pending is not None or not self.inbox.empty():
                    pending = pending or self.inbox.get_nowait()
                    self._send(client, *pending)
                    pending = None
                if self.poll is not None:
                    self._send(client, *self.poll, None, None)
                with contextlib.suppress(queue.Empty):
                    pending = self.inbox.get(timeout=self.poll_s)
            except HostError as exc:
                if client is not None:
                    client.close()
                    client = None
                if self.stop.is_set():
                    break
                now = time.monotonic()
                if lost_since is None:
                    lost_since = now
                    self._report(UNREACHABLE, error=str(exc))
                if now - lost_since > self.settings.host_timeout:
                    self._report(LOST, error=str(exc))
                    break
                self.stop.wait(RETRY_S)
        if client is not None:
            client.close()

    def _send(
        self,
        client: AgentClient,
        type_: str,
        body: dict[str, Any],
        tag: Any,
        timeout: float | None,
    ) -> None:
        """One request; a refusal is a report, a lost host a HostError for run()."""
        try:
            reply = client.request(type_, body, timeout=timeout or self.settings.connect_timeout)
        except AgentError as exc:
            self._report(REFUSED, request=type_, error=str(exc), code=exc.code, tag=tag)
            return
        except InvalidMessage as exc:
            self._report(REFUSED, request=type_, error=str(exc), code=INVALID_REPLY, tag=tag)
            return
        self._report(REPLY, request=type_, body=reply, tag=tag)
