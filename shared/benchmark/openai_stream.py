"""OpenAI's streaming completions as a serving cell's client reads them: the request body, the
server-sent events framing and each chunk's meaning. Pure: bytes and text in, facts out.

The format is OpenAI's API reference (Chat Completions and Completions, `stream: true`: a
`text/event-stream` of `data: {chunk}` events ending with `data: [DONE]`; `stream_options:
{"include_usage": true}` adds a last chunk with `usage` and no choices) as mlx_lm.server writes
it (mlx_lm/server.py, `handle_completion`: one chunk per generated piece of text, `: keepalive`
comments during a long prefill, the usage chunk, then `[DONE]`). The event framing is the WHATWG
HTML standard's server-sent events: `data:` lines joined by newlines, `:` comments ignored, a
blank line ending an event.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MODELS = "/v1/models"
ENDPOINTS = (CHAT, COMPLETIONS)
DONE = "[DONE]"
DEFAULT_MODEL = "default_model"
"""What mlx-lm's server benchmark names as the model: mlx_lm.server then serves its --model."""
EVENT_STREAM = "text/event-stream"


class NotOpenAI(ValueError):
    """A reply that does not follow OpenAI's streaming format; the message says how, in one
    line, with nothing of the reply that could reach a terminal unescaped."""


def request_body(
    endpoint: str, model: str, prompt: str | list[dict[str, str]], max_tokens: int
) -> dict[str, Any]:
    """A streamed, greedy request for `max_tokens` tokens, with the usage chunk asked for. A
    chat endpoint takes messages (a string becomes one user message), a completions endpoint a
    prompt string."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"{endpoint} is not one of {', '.join(ENDPOINTS)}")
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint == CHAT:
        body["messages"] = (
            [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        )
    elif isinstance(prompt, str):
        body["prompt"] = prompt
    else:
        body["prompt"] = "\n".join(message["content"] for message in prompt)
    return body


class EventReader:
    """Server-sent events from a stream's lines: feed each line (its end of line stripped or
    not); an event's data comes back when the blank line that ends it arrives."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        line = line.rstrip("\r\n")
        if not line:
            if not self._data:
                return None
            data, self._data = "\n".join(self._data), []
            return data
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if field == "data":
            self._data.append(value.removeprefix(" "))
        return None

    def pending(self) -> str | None:
        """The data of an event the stream ended inside, without its blank line (a server that
        closes right after its last `data:` line): None when there is none."""
        return "\n".join(self._data) if self._data else None


@dataclass(frozen=True)
class Chunk:
    """What one streamed chunk says: how many characters of output it carries (reasoning
    included), why the answer finished (None while it goes on), and the token counts of a usage
    chunk."""

    text_chars: int = 0
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    """Of the prompt's tokens, those the server found in its prompt cache (usage's
    prompt_tokens_details.cached_tokens, as OpenAI and mlx_lm.server send it)."""

    @property
    def is_token(self) -> bool:
        """A token event: the chunk carries output text."""
        return self.text_chars > 0


def parse_chunk(data: str) -> Chunk:
    """One event's data as a chunk of a chat or text completion; NotOpenAI otherwise. An error
    object sent mid-stream (as vLLM and OpenAI do) is NotOpenAI naming it."""
    try:
        chunk = json.loads(data)
    except ValueError:
        raise NotOpenAI(f"an event is not JSON ({len(data)} characters)") from None
    if not isinstance(chunk, dict):
        raise NotOpenAI("an event is not a JSON object")
    if "error" in chunk:
        raise NotOpenAI(f"the server sent an error mid-stream: {_error_text(chunk['error'])}")
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        raise NotOpenAI("a chunk has no choices list")
    usage = chunk.get("usage")
    prompt_tokens = output_tokens = cached_tokens = None
    if isinstance(usage, dict):
        prompt_tokens = _count(usage, "prompt_tokens")
        output_tokens = _count(usage, "completion_tokens")
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            cached_tokens = _count(details, "cached_tokens")
    elif usage is not None:
        raise NotOpenAI("a chunk's usage is not an object")
    text_chars, finish_reason = 0, None
    for choice in choices:
        if not isinstance(choice, dict):
            raise NotOpenAI("a chunk's choice is not an object")
        text_chars += _choice_chars(choice)
        reason = choice.get("finish_reason")
        if reason is not None:
            if not isinstance(reason, str):
                raise NotOpenAI("a chunk's finish_reason is not a string")
            finish_reason = reason
    return Chunk(text_chars, finish_reason, prompt_tokens, output_tokens, cached_tokens)


def _choice_chars(choice: dict[str, Any]) -> int:
    """A chat chunk's delta content and reasoning, or a text completion's text."""
    if "delta" in choice:
        delta = choice["delta"]
        if not isinstance(delta, dict):
            raise NotOpenAI("a chunk's delta is not an object")
        parts = [delta.get("content"), delta.get("reasoning"), delta.get("reasoning_content")]
    else:
        parts = [choice.get("text")]
    if any(part is not None and not isinstance(part, str) for part in parts):
        raise NotOpenAI("a chunk's text is not a string")
    return sum(len(part) for part in parts if part)


def _count(usage: dict[str, Any], key: str) -> int | None:
    value = usage.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise NotOpenAI(f"a chunk's usage.{key} is not a count")
    return value


def _error_text(error: object) -> str:
    """An error object's message, cut to one short line (the caller escapes it for display)."""
    message = error.get("message") if isinstance(error, dict) else error
    text = " ".join(str(message).split())
    return text[:200]


def model_ids(body: bytes) -> list[str]:
    """The models a `GET /v1/models` reply lists (OpenAI's `{"object": "list", "data": [{"id":
    ...}]}`); NotOpenAI when it is not that."""
    try:
        reply = json.loads(body)
    except ValueError:
        raise NotOpenAI(f"GET {MODELS} did not answer JSON") from None
    data = reply.get("data") if isinstance(reply, dict) else None
    if not isinstance(data, list):
        raise NotOpenAI(f"GET {MODELS} answered JSON with no data list")
    ids = [entry.get("id") for entry in data if isinstance(entry, dict)]
    if len(ids) != len(data) or not all(isinstance(i, str) for i in ids):
        raise NotOpenAI(f"GET {MODELS} lists an entry with no string id")
    return ids
