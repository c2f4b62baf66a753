"""A serving cell in the job's own process, through mlx-lm's continuous-batching engine.

The engine is mlx-lm's BatchGenerator (mlx_lm/generate.py), the one `mlx_lm.server` drives:
requests join a running batch as they come (prompts prefilled `prefill_batch_size` at a time
in steps of `prefill_step_size`, then decoded together up to `completion_batch_size`), and
each generated token comes back from `next()` as a plain int. We are its client: a token's
time is read as `next()` hands it over, so TTFT counts the wait for a place in the batch and
the prompt's prefill, as a streaming HTTP client's would, less the HTTP hop.

Our built-in model (agent/model.py) cannot be driven by BatchGenerator as it is: the engine
merges each request's cache into a batch cache (mlx_lm.models.cache's KVCache.merge into
BatchKVCache, with left padding) and the model must mask by that cache's per-sequence offsets
(create_attention_mask / cache.make_mask), while ours keeps its own KVCache with one integer
offset. Its parameters are named and shaped as mlx-lm's llama (models/llama.py) and its
arithmetic is the same (the same RMSNorm, RoPE, SwiGLU and attention; its logits match to the
bit), so the engine drives mlx-lm's llama holding our model's very arrays (`llama_twin`): no
copy, and the record says so. An mlx-lm model directory is driven as loaded.

A cell's timed iteration is one pass of its requests: a closed loop of N clients, or an open
loop whose requests arrive at seeded Poisson times (shared.benchmark.serving) and are admitted
as they come; the profiler gates, meters and times each pass as any cell's iteration
(agent.profiling.speed), and its untimed warm-up passes send one request per client.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from agent.model import BUILTIN_CONFIGS, QUANT_GROUP_SIZE, Model
from agent.profiling.hf_models import locate
from agent.profiling.speed import Depth, SpeedProfiler
from shared.benchmark.matrix import Cell, MatrixSpec
from shared.benchmark.serving import (
    Prompt,
    ServingSpec,
    arrival_offsets,
    saturated,
    synthetic_prompt,
)
from shared.benchmark.serving_figures import RequestTiming, Slo, serving_figures
from shared.stats import rate_fields

ENGINE = "mlx-lm BatchGenerator"
OPEN_LOOP_BATCH = 32
"""Sequences an open loop's engine decodes at once: mlx_lm.server's --decode-concurrency."""
PREFILL_BATCH = 8
"""Prompts prefilled together: mlx_lm.server's --prompt-concurrency."""
LATE_HOLD = 1.5
"""An injected late request (MLX_FLEET_INJECT=late) is held this many TTFT SLOs before it is
sent: its first token misses the SLO whatever the engine does."""

Tokenize = Callable[[Prompt], list[int]]


def utf8_tokens(prompt: Prompt) -> list[int]:
    """A prompt's UTF-8 bytes as its tokens: the built-in model has no tokenizer, and every
    byte (below 256) is in its vocabulary."""
    return list(prompt.text.encode("utf-8"))


UTF8 = "utf-8 bytes (the built-in model has no tokenizer)"


def prompt_tokenizer(name: str) -> tuple[Tokenize, str]:
    """How a prompt file's prompts become model `name`'s tokens, and the words the record says
    it in: a built-in model's UTF-8 bytes; an mlx-lm model's own tokenizer (mlx_lm.utils
    .load_tokenizer, offline), through its chat template where it has one, as mlx_lm.server
    turns a chat request's `messages` into tokens."""
    if name in BUILTIN_CONFIGS:
        return utf8_tokens, UTF8
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(locate(name, download=False).path)
    if getattr(tokenizer, "chat_template", None):

        def chat(prompt: Prompt) -> list[int]:
            messages = [{"role": role, "content": text} for role, text in prompt.messages]
            return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True))

        return chat, "the model's chat template"
    return (lambda prompt: list(tokenizer.encode(prompt.text))), "the model's tokenizer"


def llama_twin(model: Model) -> nn.Module:
    """mlx-lm's llama with `model`'s arrays (quantized as it is), for BatchGenerator."""
    from mlx_lm.models import llama

    args = model.args
    twin = llama.Model(
        llama.ModelArgs(
            model_type="llama",
            hidden_size=args.hidden_size,
            num_hidden_layers=args.num_hidden_layers,
            intermediate_size=args.intermediate_size,
            num_attention_heads=args.num_attention_heads,
            num_key_value_heads=args.num_key_value_heads,
            rms_norm_eps=args.rms_norm_eps,
            vocab_size=args.vocab_size,
            rope_theta=args.rope_theta,
            tie_word_embeddings=args.tie_word_embeddings,
        )
    )
    embed = model.model.embed_tokens
    if isinstance(embed, nn.QuantizedEmbedding):
        nn.quantize(twin, group_size=QUANT_GROUP_SIZE, bits=embed.bits)
    twin.update(model.parameters())
    return twin


def vocab_size(model: nn.Module) -> int:
    args = getattr(model, "args", None)
    return int(getattr(args, "vocab_size", 0) or 256)


@dataclass
class Stream:
    """One request in flight, as its client sees it."""

    start_s: float
    prompt_tokens: int
    tokens: list[float] = field(default_factory=list)

    def timing(self) -> RequestTiming:
        first = self.tokens[0] if self.tokens else None
        return RequestTiming(
            self.start_s, first, tuple(self.tokens[1:]), self.prompt_tokens, len(self.tokens)
        )


@dataclass(frozen=True)
class Request:
    prompt: Any
    """Token ids for the engine here; text or a chat's messages for a server over HTTP."""
    max_tokens: int
    late_s: float = 0.0
    """Held this long after its arrival before the engine sees it (an injected fault)."""


class ServingCell:
    """One serving cell's engine, requests and passes."""

    def __init__(
        self,
        model: nn.Module,
        cell: Cell,
        spec: MatrixSpec,
        tokenize: tuple[Tokenize, str] = (utf8_tokens, UTF8),
        late_share: float = 0.0,
    ) -> None:
        from mlx_lm.generate import BatchGenerator

        assert spec.serving is not None
        self.serving: ServingSpec = spec.serving
        self.cell = cell
        self.twinned = isinstance(model, Model)
        self.engine_model = llama_twin(model) if isinstance(model, Model) else model
        self.tokenize, self.tokens_from = tokenize
        self.late_share = late_share
        batch = cell.concurrency or OPEN_LOOP_BATCH
        self.generator = BatchGenerator(
            self.engine_model,
            max_tokens=cell.n_gen,
            completion_batch_size=batch,
            prefill_batch_size=min(PREFILL_BATCH, batch),
            prefill_step_size=spec.prefill_step_size,
        )
        self.passes: list[list[RequestTiming]] = []
        self.saturated: list[bool] = []
        self.late = 0

    def close(self) -> None:
        self.generator.close()

    def depth(self) -> Depth:
        """What each pass starts from: no cache (every request brings its own)."""
        return Depth([], None)

    def requests(self, pass_index: int, count: int) -> list[Request]:
        """The pass's requests: the prompt file's in turn (as mlx-lm's benchmark cycles its
        prompts), or synthetic ones of n_prompt random tokens, each its own."""
        serving, cell = self.serving, self.cell
        draw = random.Random(f"late:{serving.seed}:{pass_index}")
        hold = LATE_HOLD * serving.slo_ttft_ms / 1000
        made = []
        for i in range(count):
            if serving.prompts:
                prompt = serving.prompts[i % len(serving.prompts)]
                payload, most = self.prompt_of(prompt), prompt.max_tokens or cell.n_gen
            else:
                seed = serving.seed * 1_000_003 + pass_index * 10_007 + i
                payload, most = self.synthetic(seed), cell.n_gen
            late = hold if self.late_share and draw.random() < self.late_share else 0.0
            made.append(Request(payload, most, late))
        return made

    def prompt_of(self, prompt: Prompt) -> Any:
        """A prompt file's prompt as the engine takes it: its tokens."""
        return self.tokenize(prompt)

    def synthetic(self, seed: int) -> Any:
        """A synthetic prompt as the engine takes it: n_prompt random token ids."""
        return synthetic_prompt(self.cell.n_prompt, vocab_size(self.engine_model), seed)

    def run_pass(self, timed: bool) -> None:
        """One pass: timed, the cell's requests at its load; untimed (warm-up), one request
        per client (or per open-loop batch slot, at most the cell's requests) all at once."""
        serving, cell = self.serving, self.cell
        if not timed:
            count = min(serving.requests, cell.concurrency or PREFILL_BATCH)
            self._serve(self.requests(-1, count), count, None)
            return
        requests = self.requests(len(self.passes), serving.requests)
        offsets = None
        if cell.request_rate:
            seed = serving.seed * 1_000_003 + len(self.passes)
            drawn = arrival_offsets(cell.request_rate, len(requests), seed)
            offsets = [offset - drawn[0] for offset in drawn]  # the first one opens the pass
        timings = self._serve(requests, cell.concurrency, offsets)
        self.passes.append(timings)
        if offsets is not None:
            self.saturated.append(saturated(timings))
        self.late += sum(1 for r in requests[: len(timings)] if r.late_s)

    def _serve(
        self, requests: list[Request], clients: int, offsets: list[float] | None
    ) -> list[RequestTiming]:
        """Send `requests` (closed loop: `clients` at a time; open loop: at `offsets` seconds
        from the start), collect every token as the engine hands it over, until all that were
        sent are done. With a duration, nothing is sent after it."""
        generator, duration = self.generator, self.serving.duration_s
        start = time.perf_counter()
        streams: list[Stream] = []
        by_uid: dict[int, Stream] = {}
        held: list[tuple[float, int]] = []  # (when the engine may see it, request index)
        in_flight = 0

        def arrive(index: int, at: float) -> None:
            request = requests[index]
            streams.append(Stream(at, len(request.prompt)))
            held.append((at + request.late_s, index))

        def may_send(now: float) -> bool:
            return len(streams) < len(requests) and (duration is None or now - start < duration)

        if offsets is None:
            for _ in range(min(clients, len(requests))):
                arrive(len(streams), start)
        while True:
            now = time.perf_counter()
            while offsets is not None and may_send(now) and start + offsets[len(streams)] <= now:
                arrive(len(streams), start + offsets[len(streams)])
            for due, index in [item for item in held if item[0] <= now]:
                held.remove((due, index))
                request = requests[index]
                (uid,) = generator.insert([request.prompt], max_tokens=[request.max_tokens])
                by_uid[uid] = streams[index]
                in_flight += 1
            if not in_flight:
                waits = [due for due, _ in held]
                if offsets is not None and may_send(now):
                    waits.append(start + offsets[len(streams)])
                if not waits:
                    break
                time.sleep(max(0.0, min(waits) - now))
                continue
            _, responses = generator.next()
            now = time.perf_counter()
            for response in responses:
                stream = by_uid[response.uid]
                stream.tokens.append(now)
                if response.finish_reason is None:
                    continue
                del by_uid[response.uid]
                in_flight -= 1
                if offsets is None and may_send(now):
                    arrive(len(streams), now)
        return [stream.timing() for stream in streams]

    def result(self, profiled: dict[str, Any]) -> dict[str, Any]:
        """The cell's metrics: the profiler's (`profiled`: memory, warm-up, sleep, precision)
        with tok/s as each pass's output tokens over its time, and the `serving` figures of
        every timed request (shared.benchmark.serving_figures) pooled over the passes, their
        rates over the passes' windows together."""
        slo = Slo(self.serving.slo_ttft_ms, self.serving.slo_tpot_ms)
        per_pass = [serving_figures(timings, slo) for timings in self.passes]
        seconds = [ms / 1000 for ms in profiled["samples_ms"]]
        rates = [f.output_tokens / s for f, s in zip(per_pass, seconds, strict=True) if s > 0]
        figures = serving_figures([t for timings in self.passes for t in timings], slo).flat()
        window = sum(f.window_s or 0.0 for f in per_pass)
        for key, count in (
            ("output_tok_s", "output_tokens"),
            ("request_rate", "completed"),
            ("goodput", "good"),
        ):
            figures[key] = figures[count] / window if window > 0 else None
        figures["window_s"] = window or None
        profiled.update(rate_fields(rates))
        profiled["serving"] = {
            "engine": ENGINE,
            "model_impl": "mlx-lm llama holding the built-in model's arrays"
            if self.twinned
            else "as loaded",
            "loop": "open" if self.cell.request_rate else "closed",
            "passes": len(self.passes),
            "requests_per_pass": self.serving.requests,
            "duration_s": self.serving.duration_s,
            "prompts": "file" if self.serving.prompts else "synthetic",
            "tokens_from": self.tokens_from if self.serving.prompts else "random tokens",
            "prompt_cache": "none: BatchGenerator keeps no cache across requests, so every "
            "request prefills its whole prompt",
            "saturated": any(self.saturated) if self.cell.request_rate else None,
            "late_injected": self.late,
            "figures": figures,
        }
        return profiled


class PassClock:
    """The cell's IterationTiming, passed on to `inner` (its energy and windows): it tells a
    pass whether the profiler is timing it (a re-warm or a warm-up pass runs untimed)."""

    def __init__(self, inner: Any, warmup: int) -> None:
        self.inner, self.warmup = inner, warmup
        self.timing = False

    def started(self, step: int) -> None:
        self.timing = step >= self.warmup
        if self.inner is not None:
            self.inner.started(step)

    def stopped(self, step: int, seconds: float) -> None:
        self.timing = False
        if self.inner is not None:
            self.inner.stopped(step, seconds)


def measure_serving(
    profiler: SpeedProfiler,
    model: nn.Module | None,
    cell: Cell,
    spec: MatrixSpec,
    late_share: float = 0.0,
    serving: ServingCell | None = None,
) -> dict[str, Any]:
    """A serving cell's record metrics, its passes run as `profiler`'s iterations; `serving`
    sends them elsewhere (agent.profiling.http_serving), else the engine here does."""
    assert spec.serving is not None
    if serving is None:
        tokenize = prompt_tokenizer(cell.model) if spec.serving.prompts else (utf8_tokens, UTF8)
        serving = ServingCell(model, cell, spec, tokenize, late_share)
    clock = PassClock(profiler.timing, spec.warmup)
    profiler.timing = clock

    def one_pass(cache: list[Any]) -> mx.array:
        serving.run_pass(clock.timing)
        return mx.array(0)

    try:
        measurement = profiler.measure(
            model, serving.depth(), one_pass, spec.warmup, spec.iterations
        )
    finally:
        serving.close()
    return serving.result(profiler.result(measurement, 0))
