"""A fake OpenAI-compatible streaming server, written from OpenAI's API reference and
mlx_lm.server's code, with the failure modes a serving cell's client must survive.

What it copies, and from where:
- the happy path: mlx_lm/server.py (mlx-lm 0.32): `http.server`'s ThreadingHTTPServer speaking
  HTTP/1.0 (the reply ends when the connection closes), `GET /v1/models` as
  `{"object": "list", "data": [{"id": ...}]}`, `GET /health` as `{"status": "ok"}`, and a
  streamed answer as `Content-type: text/event-stream` events `data: {chunk}\\n\\n`, one chunk per
  token (`choices[0].delta.content` for chat, `choices[0].text` for completions) with
  `finish_reason` null, a last chunk with the finish reason, the usage chunk when
  `stream_options.include_usage` is asked for (`choices: []`, `usage.prompt_tokens`,
  `usage.completion_tokens`, `usage.prompt_tokens_details.cached_tokens`), then
  `data: [DONE]`; a `: keepalive` comment before the first token, as its prefill progress
  callback writes.
- `404`: mlx_lm.server's answer to a POST on a path it does not serve (`Not Found`, no JSON); a
  server that serves no /v1 API at all answers the same to `GET /v1/models` (mode "not-found").
- a reply that is not an event stream: an OpenAI-style server that ignores `stream: true` and
  answers one `application/json` completion (mode "json").
- death mid-stream: the process killed while it streams: the socket closes after some chunks
  without `[DONE]` (mode "die-after-N").
- `GET /v1/models` answering 200 with an empty body: mlx_lm.server with no Hugging Face cache
  directory (its handle_models_request sends the headers, then scan_cache_dir raises
  CacheNotFound); it streams all the same (mode "empty-models").
- an error event mid-stream: vLLM's and OpenAI's `data: {"error": {...}}` (mode "error-event").
- connection refused: no fake at all: a port nobody listens on (tests use a closed one).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PROMPT_TOKENS = 7
CACHED_TOKENS = 2
"""What the fake says each prompt was, and found cached, in its usage chunk."""


class FakeOpenAIServer:
    """Serve on a free port of 127.0.0.1 from a thread, as a context. `ttft_s` before the first
    token, `gap_s` between tokens; the streams numbered in `late` (1-based, in arrival order)
    wait `late_ttft_s` instead of `ttft_s`, and those in `dying` die after 3 tokens."""

    def __init__(
        self,
        mode: str = "ok",
        ttft_s: float = 0.0,
        gap_s: float = 0.0,
        late: frozenset[int] = frozenset(),
        late_ttft_s: float = 0.0,
        dying: frozenset[int] = frozenset(),
    ) -> None:
        self.mode, self.ttft_s, self.gap_s = mode, ttft_s, gap_s
        self.late, self.late_ttft_s, self.dying = late, late_ttft_s, dying
        self.requests = 0
        self.streaming = 0
        self.most_streaming = 0
        """Streams open at once now, and at most so far."""
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self.port = self._http.server_address[1]
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=10)

    def opened(self, change: int) -> None:
        with self._lock:
            self.streaming += change
            self.most_streaming = max(self.most_streaming, self.streaming)

    def next_stream(self) -> tuple[float, int | None]:
        """The next stream's TTFT, and the token it dies before (None: it lives)."""
        with self._lock:
            self.requests += 1
            number = self.requests
        die_after = int(self.mode.removeprefix("die-after-")) if "die" in self.mode else None
        if number in self.dying:
            die_after = 3
        return (self.late_ttft_s if number in self.late else self.ttft_s), die_after


def _handler(fake: FakeOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet, as tests want
            pass

        def reply(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-type", content_type)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if fake.mode == "not-found" or self.path not in ("/v1/models", "/health"):
                self.reply(404, "application/json", b"Not Found")
            elif fake.mode == "empty-models" and self.path == "/v1/models":
                self.reply(200, "application/json", b"")
            elif self.path == "/health":
                self.reply(200, "application/json", json.dumps({"status": "ok"}).encode())
            else:
                models = {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
                self.reply(200, "application/json", json.dumps(models).encode())

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if fake.mode == "not-found" or self.path not in (
                "/v1/chat/completions",
                "/v1/completions",
            ):
                self.reply(404, "application/json", b"Not Found")
                return
            if fake.mode == "json":
                answer = {"object": "chat.completion", "choices": [{"index": 0, "text": "hi"}]}
                self.reply(200, "application/json", json.dumps(answer).encode())
                return
            fake.opened(1)
            try:
                finished = self.stream(body)
            finally:
                # closed before its last event: a client that sends its next request on [DONE]
                # is never counted twice
                fake.opened(-1)
            if finished:
                self.event("[DONE]")

        def event(self, data: str) -> None:
            self.wfile.write(f"data: {data}\n\n".encode())
            self.wfile.flush()

        def stream(self, body: dict[str, Any]) -> bool:
            """Every event but [DONE]; whether the stream got that far."""
            chat = self.path.endswith("chat/completions")
            tokens = int(body["max_tokens"])
            self.send_response(200)
            self.send_header("Content-type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            self.wfile.write(b": keepalive 7/7\n\n")
            self.wfile.flush()
            ttft, die_after = fake.next_stream()
            time.sleep(ttft)
            for index in range(tokens):
                if index == die_after:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return False
                if index == 1 and fake.mode == "error-event":
                    self.event(json.dumps({"error": {"message": "out of memory\x1b[31m"}}))
                    return False
                if index:
                    time.sleep(fake.gap_s)
                self.event(json.dumps(chunk(chat, f"w{index} ", None)))
            self.event(json.dumps(chunk(chat, "", "length")))
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {
                    "prompt_tokens": PROMPT_TOKENS,
                    "completion_tokens": tokens,
                    "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
                }
                self.event(json.dumps({"object": "chat.completion", "choices": [], "usage": usage}))
            return True

    return Handler


def chunk(chat: bool, text: str, finish_reason: str | None) -> dict[str, Any]:
    """One streamed chunk as mlx_lm.server's generate_response builds it."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason}
    if chat:
        choice["delta"] = {"role": "assistant", **({"content": text} if text else {})}
        return {"object": "chat.completion.chunk", "choices": [choice]}
    choice["text"] = text
    return {"object": "text_completion", "choices": [choice]}
