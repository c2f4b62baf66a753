"""A serving cell's load over HTTP (agent.profiling.http_load) against the fake OpenAI server
(tests/fakes/openai_server.py): a closed loop keeps its clients' requests in flight and no more,
an open loop sends at its arrival times whatever the server does, a duration ends the sending,
and a held request's latency counts from its arrival."""

from __future__ import annotations

import pytest

from agent.profiling.http_load import HttpRequest, send_load
from agent.profiling.openai_client import ServeUrl
from tests.fakes.openai_server import FakeOpenAIServer


def requests(count: int, late_s: float = 0.0) -> list[HttpRequest]:
    return [HttpRequest(f"w{i} w{i + 1}", 3, late_s) for i in range(count)]


def test_a_closed_loop_keeps_its_clients_busy_and_no_more() -> None:
    with FakeOpenAIServer(ttft_s=0.05, gap_s=0.01) as fake:
        timings = send_load(ServeUrl.parse(fake.url), "m", requests(9), 3, None, None)
    assert [t.error for t in timings] == [None] * 9
    assert fake.most_streaming == 3
    ordered = sorted(t.start_s for t in timings)
    # Three waves: each client sends its next request only once its last one ended.
    assert ordered[3] - ordered[0] >= 0.05 and ordered[6] - ordered[3] >= 0.05


def test_an_open_loop_sends_at_its_arrival_times_whatever_the_server_does() -> None:
    offsets = [0.0, 0.02, 0.04, 0.06]
    with FakeOpenAIServer(ttft_s=0.3) as fake:
        timings = send_load(ServeUrl.parse(fake.url), "m", requests(4), 0, offsets, None)
    assert fake.most_streaming == 4  # the server's slowness held nothing back
    starts = [t.start_s - timings[0].start_s for t in timings]
    assert starts == pytest.approx(offsets)
    assert all(t.ttft_s is not None and t.ttft_s >= 0.3 for t in timings)


def test_nothing_is_sent_after_the_duration() -> None:
    with FakeOpenAIServer(ttft_s=0.2) as fake:
        timings = send_load(ServeUrl.parse(fake.url), "m", requests(10), 1, None, 0.1)
    assert len(timings) == 1
    assert fake.requests == 1


def test_a_held_request_counts_from_its_arrival() -> None:
    with FakeOpenAIServer() as fake:
        (timing,) = send_load(
            ServeUrl.parse(fake.url), "m", requests(1, late_s=0.15), 1, [0.0], None
        )
    assert timing.ttft_s is not None and timing.ttft_s >= 0.15
