"""What a request handler of the daemon is made of: the Request it answers, the Reply it gives,
and HANDLERS, the one table of the requests this agent serves, which `handles` fills. Its own
module, below the handlers, so that handlers kept by concern in several modules
(agent.daemon.requests, job_requests, run_requests) register into one table without importing
each other.

A handler returns its Reply, or raises ProtocolError, which goes back as an `error` reply, or
returns None when its reply is deferred (computed on a worker thread and sent by the daemon's loop
through Requests.send_finished())."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import zmq

from shared.wire import protocol as p


class Reply(NamedTuple):
    """The reply's type and body, and the stream messages that follow it at once (same `re`)."""

    type: str
    body: dict[str, Any]
    then: tuple[tuple[str, dict[str, Any]], ...] = ()


class Request(NamedTuple):
    identity: bytes
    message: p.Message
    frame: zmq.Frame | None
    """The message's last frame under CURVE, None without: see endpoints.peer_key."""

    @property
    def body(self) -> dict[str, Any]:
        return self.message.body

    def refuse(self, code: str, message: str) -> p.ProtocolError:
        """The error answering this request."""
        return p.ProtocolError(code, message, re=self.message.id)


Handler = Callable[[Any, Request], Reply | None]
"""A method of agent.daemon.requests.Requests (or of one of its bases)."""
HANDLERS: dict[str, Handler] = {}


def handles(type_: str) -> Callable[[Handler], Handler]:
    """Register the decorated method as the handler of request `type_`."""

    def register(handler: Handler) -> Handler:
        if type_ in HANDLERS:
            raise ValueError(f"two handlers for {type_}")
        HANDLERS[type_] = handler
        return handler

    return register


def check_limit(request: Request, most: int) -> None:
    """A page's `limit`: nil (the default) or 1 to `most`; `bad-body` naming the range
    otherwise, never a silent cut (docs/protocol.md §5)."""
    limit = request.body["limit"]
    if limit is not None and not 1 <= limit <= most:
        raise request.refuse(
            p.BAD_BODY, f"{request.message.type}: limit must be 1 to {most}, got {limit}"
        )


def check_cursor(request: Request, name: str) -> None:
    """An offset or a cursor: 0 to MAX_WIRE_INT; `bad-body` naming the field otherwise."""
    value = request.body[name]
    if value is not None and not 0 <= value <= p.MAX_WIRE_INT:
        raise request.refuse(
            p.BAD_BODY,
            f"{request.message.type}: {name} must be 0 to {p.MAX_WIRE_INT}, got {value}",
        )
