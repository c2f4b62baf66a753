"""A serving cell's client for an OpenAI-compatible server (`--serve-url`, `--serve mlx_lm`):
one streamed request at a time per thread, its first and every later token timed as it arrives
here, over the standard library's http.client (no dependency).

What the stream must look like is shared.benchmark.openai_stream's; this module is the socket
side: the URL, the check before any cell, and one request's timing. Every string a server sends
that ends up in an error passes shared.safe_text.shown first.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass

from shared.benchmark.openai_stream import (
    CHAT,
    DONE,
    ENDPOINTS,
    EVENT_STREAM,
    MODELS,
    EventReader,
    NotOpenAI,
    model_ids,
    parse_chunk,
    request_body,
)
from shared.benchmark.serving_figures import RequestTiming
from shared.safe_text import shown

MAX_LINE = 1 << 20
"""Bytes of one line of the event stream a reply may send; a longer one fails the request."""
MAX_ERROR_BODY = 300
"""Bytes of a refusal's body quoted in its error."""
CHECK_TIMEOUT_S = 10.0
"""How long the check before any cell waits for each reply."""


class ServeUrlError(ValueError):
    """A --serve-url that cannot be served from: one line naming it and why (exit 2)."""


@dataclass(frozen=True)
class ServeUrl:
    """Where requests go: a server's address and the endpoint they are posted to."""

    scheme: str
    host: str
    port: int
    endpoint: str = CHAT

    @classmethod
    def parse(cls, text: str) -> ServeUrl:
        """`http://HOST:PORT` (chat completions, as mlx-lm's server benchmark posts), the same
        with `/v1`, or with the endpoint itself: `/v1/chat/completions` or `/v1/completions`."""
        try:
            parts = urllib.parse.urlsplit(text)
            port = parts.port
        except ValueError as exc:
            raise ServeUrlError(f"--serve-url {shown(text)}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServeUrlError(f"--serve-url {shown(text)}: not an http:// or https:// URL")
        path = parts.path.rstrip("/")
        if path in ("", "/v1"):
            endpoint = CHAT
        elif path in ENDPOINTS:
            endpoint = path
        else:
            raise ServeUrlError(
                f"--serve-url {shown(text)}: the path must be empty, /v1 or one of "
                f"{', '.join(ENDPOINTS)}"
            )
        default = 443 if parts.scheme == "https" else 80
        return cls(parts.scheme, parts.hostname, port or default, endpoint)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.endpoint}"

    def connect(self, timeout_s: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=timeout_s)


def reason(exc: BaseException) -> str:
    """An exception as a short line: what the socket or the parser said."""
    text = str(exc) or type(exc).__name__
    return shown(text)


def served_models(url: ServeUrl, timeout_s: float = CHECK_TIMEOUT_S) -> list[str] | None:
    """The models the server lists (GET /v1/models); ServeUrlError when it does not answer or
    does not answer as OpenAI's API does. None for a 200 with an empty body: mlx_lm.server's
    answer when the Hugging Face cache it scans does not exist (its handle_models_request sends
    the headers, then scan_cache_dir raises CacheNotFound), a server that streams all the same."""
    connection = url.connect(timeout_s)
    try:
        connection.request("GET", MODELS, headers={"Accept": "application/json"})
        reply = connection.getresponse()
        body = reply.read(MAX_LINE)
    except (OSError, http.client.HTTPException) as exc:
        raise ServeUrlError(f"--serve-url {url}: does not answer ({reason(exc)})") from None
    finally:
        connection.close()
    if reply.status != 200:
        raise ServeUrlError(
            f"--serve-url {url}: not OpenAI-compatible: GET {MODELS} answered HTTP {reply.status}"
        )
    if not body.strip():
        return None
    try:
        return model_ids(body)
    except NotOpenAI as exc:
        raise ServeUrlError(f"--serve-url {url}: not OpenAI-compatible: {exc}") from None


def check_server(url: ServeUrl, model: str, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Before any cell: the server lists its models, and streams a one-token answer to `model`
    in OpenAI's format. ServeUrlError, one line, when either fails."""
    served_models(url, timeout_s)
    timing = stream_request(url, model, "Hello", 1, timeout_s)
    if timing.error is not None:
        raise ServeUrlError(f"--serve-url {url}: not OpenAI-compatible: {timing.error}")


def stream_request(
    url: ServeUrl,
    model: str,
    prompt: str | list[dict[str, str]],
    max_tokens: int,
    timeout_s: float,
    clock: Callable[[], float] = time.perf_counter,
    arrived_s: float | None = None,
) -> RequestTiming:
    """One streamed request, timed at this end: sent (before connecting: the connection is part
    of what a user waits for, as in mlx-lm's benchmark), each token event as its chunk arrives.
    `arrived_s` (on `clock`, not after now) is when an open loop's request arrived: its times
    count from then, so a client that sends it late adds to its latency, never hides it.
    A request that fails is a RequestTiming with its error and what arrived before it: refused,
    an HTTP error, a reply that is not an event stream, a chunk not in OpenAI's format, or a
    stream that ended before `[DONE]`."""
    body = json.dumps(request_body(url.endpoint, model, prompt, max_tokens)).encode()
    headers = {"Content-Type": "application/json", "Accept": EVENT_STREAM}
    start = clock() if arrived_s is None else arrived_s
    connection = url.connect(timeout_s)
    try:
        try:
            connection.request("POST", url.endpoint, body, headers)
            reply = connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            return RequestTiming(start, error=f"no reply: {reason(exc)}")
        if reply.status != 200:
            quoted = shown(reply.read(MAX_ERROR_BODY).decode("utf-8", "replace"))
            return RequestTiming(start, error=f"HTTP {reply.status}: {quoted}")
        content_type = reply.getheader("Content-Type", "") or ""
        if not content_type.startswith(EVENT_STREAM):
            return RequestTiming(
                start, error=f"not an event stream (Content-Type {shown(content_type) or 'none'})"
            )
        return _read_stream(reply, start, clock)
    finally:
        connection.close()


def _read_stream(
    reply: http.client.HTTPResponse, start: float, clock: Callable[[], float]
) -> RequestTiming:
    """The events of a 200 event-stream reply, each token event timed as it is read."""
    reader = EventReader()
    times: list[float] = []
    prompt_tokens = output_tokens = cached_tokens = None
    error = None
    try:
        while True:
            line = reply.readline(MAX_LINE + 1)
            if len(line) > MAX_LINE:
                raise NotOpenAI(f"a line of the stream is over {MAX_LINE} bytes")
            data = reader.feed(line.decode("utf-8", "replace")) if line else reader.pending()
            if data == DONE:
                break
            if data is not None:
                chunk = parse_chunk(data)
                if chunk.is_token:
                    times.append(clock())
                if chunk.prompt_tokens is not None:
                    prompt_tokens = chunk.prompt_tokens
                if chunk.output_tokens is not None:
                    output_tokens = chunk.output_tokens
                if chunk.cached_tokens is not None:
                    cached_tokens = chunk.cached_tokens
            if not line:
                error = f"the stream ended before {DONE} after {len(times)} token events"
                break
    except NotOpenAI as exc:
        error = shown(str(exc))
    except (OSError, http.client.HTTPException) as exc:
        error = f"the stream broke after {len(times)} token events: {reason(exc)}"
    if not times and error is None:
        error = "the stream ended with no token"
    return RequestTiming(
        start,
        times[0] if times else None,
        tuple(times[1:]),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        error=error,
        cached_tokens=cached_tokens,
    )
