"""The serving cell's OpenAI client (agent.profiling.openai_client) against a fake
OpenAI-compatible server on real sockets (tests/fakes/openai_server.py says where each of its
behaviours comes from), and the stream format it reads (shared.benchmark.openai_stream)."""

from __future__ import annotations

import socket

import pytest

from agent.profiling.openai_client import (
    ServeUrl,
    ServeUrlError,
    check_server,
    served_models,
    stream_request,
)
from shared.benchmark.openai_stream import (
    CHAT,
    COMPLETIONS,
    EventReader,
    NotOpenAI,
    model_ids,
    parse_chunk,
    request_body,
)
from shared.benchmark.serving_figures import Slo, serving_figures
from tests.fakes.openai_server import CACHED_TOKENS, PROMPT_TOKENS, FakeOpenAIServer

TIMEOUT_S = 30.0


def closed_port() -> int:
    """A port of 127.0.0.1 nobody listens on: bound, then closed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_stream_is_timed_token_by_token() -> None:
    with FakeOpenAIServer(ttft_s=0.05, gap_s=0.02) as fake:
        timing = stream_request(ServeUrl.parse(fake.url), "fake-model", "hi", 6, TIMEOUT_S)
    assert timing.error is None
    assert timing.completed
    assert (timing.prompt_tokens, timing.output_tokens) == (PROMPT_TOKENS, 6)
    assert timing.cached_tokens == CACHED_TOKENS
    assert len(timing.later_token_s) == 5
    assert timing.ttft_s is not None and timing.ttft_s >= 0.05
    assert timing.e2e_s is not None and timing.e2e_s >= 0.05 + 5 * 0.02  # the server's sleeps


def test_the_completions_endpoint_streams_text_chunks() -> None:
    with FakeOpenAIServer() as fake:
        url = ServeUrl.parse(f"{fake.url}/v1/completions")
        assert url.endpoint == COMPLETIONS
        timing = stream_request(url, "fake-model", "hi", 3, TIMEOUT_S)
    assert timing.error is None
    assert timing.tokens == 3
    assert len(timing.later_token_s) == 2


def test_a_compatible_server_passes_the_check() -> None:
    with FakeOpenAIServer() as fake:
        url = ServeUrl.parse(fake.url)
        assert served_models(url) == ["fake-model"]
        check_server(url, "fake-model")


def test_mlx_lm_servers_empty_model_list_passes_the_check() -> None:
    with FakeOpenAIServer(mode="empty-models") as fake:
        url = ServeUrl.parse(fake.url)
        assert served_models(url) is None
        check_server(url, "fake-model")


def test_connection_refused() -> None:
    url = ServeUrl.parse(f"http://127.0.0.1:{closed_port()}")
    with pytest.raises(ServeUrlError, match=r"^--serve-url http://127.0.0.1:\d+/v1/chat/"
                       r"completions: does not answer \("):  # fmt: skip
        check_server(url, "fake-model", timeout_s=5)
    timing = stream_request(url, "fake-model", "hi", 4, 5)
    assert timing.error is not None and timing.error.startswith("no reply: ")
    assert not timing.completed


def test_a_server_without_the_api_answers_404() -> None:
    with FakeOpenAIServer(mode="not-found") as fake:
        url = ServeUrl.parse(fake.url)
        with pytest.raises(ServeUrlError, match="not OpenAI-compatible: GET /v1/models answered "
                           "HTTP 404"):  # fmt: skip
            check_server(url, "fake-model")
        timing = stream_request(url, "fake-model", "hi", 4, TIMEOUT_S)
    assert timing.error == "HTTP 404: Not Found"


def test_a_reply_that_is_not_an_event_stream() -> None:
    with FakeOpenAIServer(mode="json") as fake:
        url = ServeUrl.parse(fake.url)
        with pytest.raises(ServeUrlError, match=r"not OpenAI-compatible: not an event stream "
                           r"\(Content-Type application/json\)"):  # fmt: skip
            check_server(url, "fake-model")


def test_a_server_dying_mid_stream_fails_the_request_with_what_it_sent() -> None:
    with FakeOpenAIServer(mode="die-after-3") as fake:
        timing = stream_request(ServeUrl.parse(fake.url), "fake-model", "hi", 8, TIMEOUT_S)
    assert timing.error == "the stream ended before [DONE] after 3 token events"
    assert timing.first_token_s is not None and len(timing.later_token_s) == 2
    figures = serving_figures([timing], Slo(2000.0, 100.0))
    assert (figures.completed, figures.failed, figures.good) == (0, 1, 0)


def test_an_error_event_mid_stream_is_named_escaped() -> None:
    with FakeOpenAIServer(mode="error-event") as fake:
        timing = stream_request(ServeUrl.parse(fake.url), "fake-model", "hi", 8, TIMEOUT_S)
    assert timing.error == "the server sent an error mid-stream: out of memory\\x1b[31m"


def test_goodput_counts_the_requests_a_delay_pushed_over_the_slo() -> None:
    """Ten requests one after another, three of them delayed past the TTFT limit: 7 good, and
    goodput 0.7 of the request rate."""
    late = frozenset({2, 5, 9})
    with FakeOpenAIServer(ttft_s=0.0, gap_s=0.0, late=late, late_ttft_s=0.15) as fake:
        url = ServeUrl.parse(fake.url)
        timings = [stream_request(url, "fake-model", "hi", 4, TIMEOUT_S) for _ in range(10)]
    figures = serving_figures(timings, Slo(ttft_ms=100.0, tpot_ms=100.0))
    assert figures.completed == 10
    assert figures.good == 7
    assert figures.goodput is not None and figures.request_rate is not None
    assert figures.goodput / figures.request_rate == pytest.approx(0.7)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("ftp://host:1", "not an http:// or https:// URL"),
        ("http://", "not an http:// or https:// URL"),
        ("http://host:99999", "out of range"),
        ("http://host:8080/v2/generate", "the path must be empty, /v1 or one of"),
    ],
)
def test_a_bad_serve_url_is_one_line(text: str, why: str) -> None:
    with pytest.raises(ServeUrlError, match=why) as raised:
        ServeUrl.parse(text)
    assert "\n" not in str(raised.value)


def test_a_serve_url_names_its_endpoint() -> None:
    assert ServeUrl.parse("http://mac1:8080") == ServeUrl("http", "mac1", 8080, CHAT)
    assert ServeUrl.parse("http://mac1:8080/v1/").endpoint == CHAT
    assert ServeUrl.parse("https://mac1").port == 443
    assert str(ServeUrl.parse("http://mac1")) == "http://mac1:80/v1/chat/completions"


def test_events_are_framed_as_the_sse_standard_says() -> None:
    reader = EventReader()
    lines = [": keepalive 1/2\n", 'data: {"a":\n', "data:  1}\r\n", "\n", "\n", "id: 3\n"]
    assert [reader.feed(line) for line in lines] == [None, None, None, '{"a":\n 1}', None, None]
    assert reader.pending() is None
    reader.feed("data: [DONE]")
    assert reader.pending() == "[DONE]"


def test_chunks_say_their_text_finish_and_usage() -> None:
    chat = parse_chunk('{"choices": [{"index": 0, "delta": {"content": "ab"}}]}')
    assert chat.is_token and chat.text_chars == 2
    reasoning = parse_chunk('{"choices": [{"delta": {"reasoning": "hm"}, "finish_reason": null}]}')
    assert reasoning.is_token
    last = parse_chunk('{"choices": [{"delta": {"role": "assistant"}, "finish_reason": "length"}]}')
    assert not last.is_token and last.finish_reason == "length"
    usage = parse_chunk(
        '{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9, '
        '"prompt_tokens_details": {"cached_tokens": 2}}}'
    )
    assert (usage.prompt_tokens, usage.output_tokens, usage.is_token) == (3, 9, False)
    assert usage.cached_tokens == 2
    assert parse_chunk('{"choices": [{"text": "x"}]}').is_token


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ("<html>", "not JSON"),
        ("[1]", "not a JSON object"),
        ('{"id": 1}', "no choices list"),
        ('{"choices": [{"delta": "x"}]}', "delta is not an object"),
        ('{"choices": [{"text": 5}]}', "text is not a string"),
        ('{"choices": [], "usage": {"completion_tokens": -1}}', "not a count"),
        ('{"error": {"message": "boom"}}', "error mid-stream: boom"),
    ],
)
def test_a_chunk_not_in_openais_format_is_named(data: str, why: str) -> None:
    with pytest.raises(NotOpenAI, match=why):
        parse_chunk(data)


def test_model_lists_and_request_bodies() -> None:
    assert model_ids(b'{"object": "list", "data": [{"id": "m"}]}') == ["m"]
    with pytest.raises(NotOpenAI, match="no data list"):
        model_ids(b'{"models": []}')
    body = request_body(CHAT, "m", "hello", 16)
    assert body["messages"] == [{"role": "user", "content": "hello"}]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert request_body(COMPLETIONS, "m", [{"role": "user", "content": "a"}], 1)["prompt"] == "a"
