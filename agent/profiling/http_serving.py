"""A serving cell against a server over HTTP instead of the engine in the job's process:
`--serve-url URL` (a running OpenAI-compatible server, as this agent reaches it) or `--serve
mlx_lm` (mlx_lm.server started with the cell's model for the cell and stopped after it, so a
server that dies fails its one cell and the next cell starts a fresh one).

The cell is agent.profiling.serving's: the same requests (a prompt file's conversations, or
synthetic prompts), the same closed or open loop, passes, figures and record; only the sending
differs (agent.profiling.http_load), each token timed at this client as its chunk arrives. The
model lives in the server's process: no weights are loaded here, and this process's MLX memory
says nothing of it. A server started here reports its MLX peak memory as it stops (over its
life: the cell's, its model's load included), which is the cell's peak memory; a --serve-url
server's memory, and any server's active memory, are unknowns.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import mlx.nn as nn

from agent.profiling.http_load import HttpRequest, send_load
from agent.profiling.mlx_lm_server import MlxLmServer
from agent.profiling.openai_client import ServeUrl, check_server, served_models
from agent.profiling.serving import Request, ServingCell, measure_serving
from agent.profiling.speed import Depth
from agent.profiling.units import to_gb
from shared.benchmark.matrix import Cell, MatrixSpec
from shared.benchmark.openai_stream import DEFAULT_MODEL
from shared.benchmark.serving import SERVED_MODEL, Prompt, ServingSpec
from shared.benchmark.serving_figures import RequestTiming

WORDS = (
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "are", "with", "as", "his", "they",
    "be", "at", "one", "have", "this", "from", "or", "had", "by", "word", "but", "what", "some",
    "we", "can", "out", "other", "were", "all", "there", "when", "up", "use", "your", "how",
    "said", "an", "each", "she", "which", "do", "their", "time", "if", "will", "way", "about",
    "many", "then", "them", "write", "would", "like", "so", "these", "her", "long", "make",
    "thing", "see", "him", "two", "has", "look", "more", "day", "could", "go", "come", "did",
    "number", "sound", "no", "most", "people", "my", "over", "know", "water", "than", "call",
    "first", "who", "may", "down", "side", "been", "now", "find",
)  # fmt: skip
"""Common English words, most of them one token in the usual BPE vocabularies: a synthetic
prompt over HTTP is -p of them (the server's tokenizer is not ours; its usage counts the
tokens it made of them, and the record keeps that count)."""


class RequestsFailed(RuntimeError):
    """No request of a pass completed: the cell has no figure (the first error says why)."""


@dataclass(frozen=True)
class ServedModel:
    """What a served cell's group holds in place of a loaded model: the model as the server is
    to be given it (a directory or a Hugging Face id) or as the server names it."""

    name: str


def synthetic_text(words: int, seed: int) -> str:
    """`words` words of WORDS, drawn by `seed`: prompts that share no long prefix."""
    draw = random.Random(seed)
    return " ".join(draw.choice(WORDS) for _ in range(words))


class NoCache(Depth):
    """A pass over HTTP starts from nothing of this process's: the server keeps the caches."""

    def __init__(self) -> None:
        super().__init__([], None)

    def fresh(self, model: nn.Module) -> list[Any]:
        return []


def request_model(url: ServeUrl) -> str:
    """The `model` a request to `url` names: the server's only listed model, else
    mlx_lm.server's `default_model` (what mlx-lm's own server benchmark sends)."""
    ids = served_models(url)
    return ids[0] if ids is not None and len(ids) == 1 else DEFAULT_MODEL


def check_serve_url(serving: ServingSpec) -> None:
    """Before any cell: a --serve-url that parses, answers and streams in OpenAI's format;
    ServeUrlError, one line, otherwise."""
    if serving.serve_url is not None:
        url = ServeUrl.parse(serving.serve_url)
        check_server(url, request_model(url))


class HttpServingCell(ServingCell):
    """agent.profiling.serving's cell with its requests sent to a server over HTTP."""

    def __init__(
        self,
        served: ServedModel,
        cell: Cell,
        spec: MatrixSpec,
        late_share: float,
        server: MlxLmServer | None = None,
    ):
        """`server`: a started server the caller owns (a group's rank 0,
        agent.profiling.group_serving); without one, --serve starts its own for the cell."""
        assert spec.serving is not None
        self.serving = spec.serving
        self.cell = cell
        self.late_share = late_share
        self.twinned = False
        self.engine_model = None
        self.tokens_from = "the server's tokenizer (the counts are its usage's)"
        self.passes: list[list[RequestTiming]] = []
        self.saturated: list[bool] = []
        self.late = 0
        self.server: MlxLmServer | None = server
        self.owned = server is None
        if server is not None:
            self.url, self.model = server.url, DEFAULT_MODEL
        elif self.serving.serve_url is not None:
            self.url = ServeUrl.parse(self.serving.serve_url)
            named = served.name != SERVED_MODEL
            self.model = served.name if named else request_model(self.url)
        else:
            self.server = MlxLmServer(served.name).__enter__()
            self.url, self.model = self.server.url, DEFAULT_MODEL

    def close(self) -> None:
        if self.server is not None and self.owned:
            self.server.__exit__(None, None, None)

    def depth(self) -> Depth:
        return NoCache()

    def prompt_of(self, prompt: Prompt) -> Any:
        return prompt.to_dict()["messages"]

    def synthetic(self, seed: int) -> Any:
        return synthetic_text(self.cell.n_prompt, seed)

    def _serve(
        self, requests: list[Request], clients: int, offsets: list[float] | None
    ) -> list[RequestTiming]:
        """The requests sent over HTTP; a started server found dead after them fails the
        cell with the reason (ServerDied), whatever the requests say."""
        load = [HttpRequest(r.prompt, r.max_tokens, r.late_s) for r in requests]
        timings = send_load(self.url, self.model, load, clients, offsets, self.serving.duration_s)
        if self.server is not None:
            self.server.raise_if_dead()
        if timings and all(t.error is not None for t in timings):
            raise RequestsFailed(f"every request failed, the first with: {timings[0].error}")
        return timings

    def result(self, profiled: dict[str, Any]) -> dict[str, Any]:
        result = super().result(profiled)
        peak = None if self.server is None else self.server.peak_memory_bytes
        result.update(peak_memory_gb=None if peak is None else to_gb(peak), active_memory_gb=None)
        served = "mlx_lm.server, started for this cell" if self.server else str(self.url)
        result["serving"].update(
            engine=f"over HTTP: {served}",
            model_impl=f"the server's, {self.model!r} asked for; {self._memory_said()}",
            prompt_cache=prompt_cache_state([t for timings in self.passes for t in timings]),
            tokens_from=self.tokens_from,
        )
        return result

    def _memory_said(self) -> str:
        if self.server is None:
            return "its memory is the server process's, not measured here"
        if self.server.peak_memory_bytes is None:
            return "its memory: the server did not report its peak (killed, or dead before)"
        return (
            "peak memory: the server process's MLX peak over its life (its model's load included)"
        )


def prompt_cache_state(timings: list[RequestTiming]) -> str:
    """What the server's prompt cache held for the timed requests, as its usage said."""
    told = [t for t in timings if t.cached_tokens is not None and t.prompt_tokens is not None]
    if not told:
        return "the server's own; it did not say what it found cached (no cached_tokens)"
    cached = sum(t.cached_tokens or 0 for t in told)
    prompts = sum(t.prompt_tokens or 0 for t in told)
    return (
        f"the server's own: {cached} of {prompts} prompt tokens of {len(told)} requests found "
        "in it (its usage's cached_tokens)"
    )


def measure_over_http(
    profiler: Any, served: ServedModel, cell: Cell, spec: MatrixSpec, late_share: float
) -> dict[str, Any]:
    """A serving cell's record metrics over HTTP (agent.profiling.serving.measure_serving with
    this module's cell). A server that does not answer (ServeUrlError: through `coordinator
    benchmark`, each agent finds it out at its first cell), will not start or dies (ServerDied),
    or whose every request fails (RequestsFailed) fails the cell with the reason."""
    serving = HttpServingCell(served, cell, spec, late_share)
    return measure_serving(profiler, None, cell, spec, serving=serving)
