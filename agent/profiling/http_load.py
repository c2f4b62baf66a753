"""A serving cell's load sent to an OpenAI-compatible server: a closed loop of N clients, each
sending its next request when its last one ends (mlx-lm's benchmarks/server_benchmark.py
--concurrency), or an open loop whose requests arrive at given times whatever the server does
(MLPerf's Server scenario, vLLM's benchmark_serving.py --request-rate). Each request is a thread
with its own connection, timed by agent.profiling.openai_client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from agent.profiling.openai_client import ServeUrl, stream_request
from shared.benchmark.serving_figures import RequestTiming

Send = Callable[[int, float], None]
"""Sends request i, arrived at the given time."""
MaySend = Callable[[float], bool]
"""Whether a request arriving at the given time is still sent (the duration not over)."""
READ_TIMEOUT_S = 300.0
"""How long a request waits for the server's next bytes (mlx_lm.server sends a keepalive
comment per prefill step, so a long prompt does not run into it)."""


@dataclass(frozen=True)
class HttpRequest:
    """One request: its prompt (text, or a chat's messages), its output length, and how long
    the client holds it after its arrival before sending it (an injected fault: its latency
    counts from the arrival all the same)."""

    prompt: str | list[dict[str, str]]
    max_tokens: int
    late_s: float = 0.0


def send_load(
    url: ServeUrl,
    model: str,
    requests: Sequence[HttpRequest],
    clients: int,
    offsets: Sequence[float] | None,
    duration_s: float | None,
    timeout_s: float = READ_TIMEOUT_S,
) -> list[RequestTiming]:
    """Send `requests` in order: closed loop with `clients` (offsets None), or open loop, the
    i-th arriving `offsets[i]` seconds after the start. With a duration nothing is sent after
    it. Returns the timings of the requests sent, in their order, once every one has ended."""
    start = time.perf_counter()
    timings: list[RequestTiming | None] = [None] * len(requests)

    def may_send(now: float) -> bool:
        return duration_s is None or now - start < duration_s

    def send(index: int, arrived: float) -> None:
        request = requests[index]
        if request.late_s:
            time.sleep(request.late_s)
        timings[index] = stream_request(
            url, model, request.prompt, request.max_tokens, timeout_s, arrived_s=arrived
        )

    if offsets is None:
        _closed_loop(len(requests), clients, send, may_send)
    else:
        _open_loop(offsets[: len(requests)], start, send, may_send)
    return [timing for timing in timings if timing is not None]


def _closed_loop(count: int, clients: int, send: Send, may_send: MaySend) -> None:
    """`clients` threads, each taking the next request as soon as its last one ended."""
    taken = iter(range(count))
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                now = time.perf_counter()
                index = next(taken, None) if may_send(now) else None
            if index is None:
                return
            send(index, now)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(min(clients, count))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _open_loop(offsets: Sequence[float], start: float, send: Send, may_send: MaySend) -> None:
    """A thread per request, started at its arrival time."""
    threads = []
    for index, offset in enumerate(offsets):
        arrival = start + offset
        wait = arrival - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        if not may_send(arrival):
            break
        thread = threading.Thread(target=send, args=(index, arrival), daemon=True)
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
