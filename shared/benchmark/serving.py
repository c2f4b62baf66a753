"""The serving axis of the matrix: how many users one Mac serves. Pure data, pure functions.

A serving cell sends requests to one engine and times every token at the client. Its load is a
closed loop (`concurrency` clients, each sending its next request as its last completes: mlx-lm's
benchmarks/server_benchmark.py, ml-explore/mlx-lm at 4a9159a, `--concurrency`) or an open loop
(requests arriving as a Poisson process at `request_rate` per second whatever the engine does,
as MLPerf's Server scenario and vLLM's benchmark_serving.py send them). A cell ends after
`requests` requests, or after `duration_s` seconds of sending when that is given.

Prompts are synthetic (`n_prompt` random tokens each) or read from a JSONL prompt file, a line
per request: `{"prompt": str}` or the body mlx-lm's server benchmark sends for each prompt,
`{"messages": [{"role": "user", "content": str}, ...]}`, with an optional `max_tokens` (else
the matrix's `n_gen`). mlx-lm's own --prompt-file is plain text, a prompt per line; a JSONL
line per request keeps a prompt with newlines, a conversation and its own output length.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.benchmark.serving_figures import (
    DEFAULT_SLO,
    QUANTILES,
    SLO_PRESETS,
    RequestTiming,
)
from shared.bounds import (
    MAX_BATCH_SIZE,
    MAX_DECODE_TOKENS,
    MAX_ITERATION_S,
    NotFinite,
    finite_float,
)
from shared.shapes import unknown_keys

SERVE = "serve"
DEFAULT_REQUESTS = 16
"""Requests per cell unless --requests or --serve-duration says otherwise: mlx-lm's server
benchmark sends 10 by default; 16 gives a p95 two requests above the median's."""
MAX_REQUESTS = 10_000
MAX_REQUEST_RATE = 1000.0
"""Requests per second an open loop may ask for: far past any one Mac's engine."""
MAX_SERVE_S = MAX_ITERATION_S
"""A serving cell is one timed iteration: it sends for at most this long."""
MAX_PROMPTS = 1024
MAX_PROMPT_CHARS = 32_768
MAX_PROMPT_FILE_CHARS = 1_048_576
"""A prompt file travels in the spec to every agent: it must fit a message (4 MiB)."""
SATURATION_GROWTH = 2.0
"""An open loop's engine fell behind (`saturated`) when the requests of the last third of a
pass (by arrival) took more than this many times as long, end to end, as the first third's: a
queue grew through the pass, so what was measured is its length, not the offered rate's
service. An engine that keeps up serves the first and the last requests alike."""
ROLES = ("system", "user", "assistant")
SERVERS = ("mlx_lm",)
"""What --serve starts: mlx_lm.server (agent.profiling.mlx_lm_server)."""
MAX_URL_CHARS = 2048
SERVED_MODEL = "served"
"""The model of --serve-url cells given no --model: whatever the server serves (the record's
serving.model_impl names the one asked for)."""
PERCENTILE_KEYS = tuple(
    f"{name}_{stat}{unit}"
    for name, unit in (
        ("ttft", "_ms"),
        ("itl", "_ms"),
        ("tpot", "_ms"),
        ("e2e", "_ms"),
        ("request_tok_s", ""),
    )
    for stat in ("mean", *(f"p{q}" for q in QUANTILES))
)
"""The distributions' keys in ServingFigures.flat() (shared.benchmark.serving_figures)."""


class ServingError(ValueError):
    """A serving axis that cannot run; the message starts with the wire field it is about."""


@dataclass(frozen=True)
class Prompt:
    """One request of a prompt file: its conversation and its own output length, if any."""

    messages: tuple[tuple[str, str], ...]
    max_tokens: int | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"messages": [{"role": r, "content": c} for r, c in self.messages]}
        if self.max_tokens is not None:
            data["max_tokens"] = self.max_tokens
        return data

    @property
    def text(self) -> str:
        """The conversation as plain text, for a model with no chat template."""
        return "\n".join(content for _, content in self.messages)


@dataclass(frozen=True)
class ServingSpec:
    """The load points (each a cell per model and length) and what every serving cell sends."""

    concurrency: tuple[int, ...] = ()
    request_rates: tuple[float, ...] = ()
    requests: int = DEFAULT_REQUESTS
    duration_s: float | None = None
    prompts: tuple[Prompt, ...] = field(default=(), repr=False)
    seed: int = 0
    slo_ttft_ms: float = SLO_PRESETS[DEFAULT_SLO].ttft_ms
    slo_tpot_ms: float = SLO_PRESETS[DEFAULT_SLO].tpot_ms
    serve_url: str | None = None
    """An OpenAI-compatible server the cells send to (as the agent reaches it), not the engine
    in the job's process."""
    serve: str | None = None
    """A server the agent starts with each model and stops after: SERVERS' one, mlx_lm."""

    @property
    def over_http(self) -> bool:
        """Whether the cells go to a server over HTTP (agent.profiling.http_serving)."""
        return self.serve_url is not None or self.serve is not None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "concurrency": list(self.concurrency),
            "request_rates": list(self.request_rates),
            "requests": self.requests,
            "seed": self.seed,
            "slo_ttft_ms": self.slo_ttft_ms,
            "slo_tpot_ms": self.slo_tpot_ms,
        }
        if self.duration_s is not None:
            data["duration_s"] = self.duration_s
        for key in ("serve_url", "serve"):
            if getattr(self, key) is not None:
                data[key] = getattr(self, key)
        if self.prompts:
            data["prompts"] = [prompt.to_dict() for prompt in self.prompts]
        return data

    @classmethod
    def from_dict(cls, data: Any) -> ServingSpec:
        """Build and validate a spec from plain data (a peer's: nothing trusted)."""
        if not isinstance(data, dict):
            raise ServingError("serving: not a mapping")
        if unknown := unknown_keys(data, cls.__dataclass_fields__):
            raise ServingError(f"serving: unknown field(s): {', '.join(unknown)}")
        values = dict(data)
        for key in ("concurrency", "request_rates"):
            if key in values:
                if not isinstance(values[key], (list, tuple)):
                    raise ServingError(f"serving.{key}: {values[key]!r} is not a list")
                values[key] = tuple(values[key])
        if "prompts" in values:
            prompts = values["prompts"]
            if not isinstance(prompts, (list, tuple)) or len(prompts) > MAX_PROMPTS:
                raise ServingError(f"serving.prompts: a list of at most {MAX_PROMPTS} is needed")
            values["prompts"] = tuple(
                prompt_from(item, f"serving.prompts[{i}]") for i, item in enumerate(prompts)
            )
        spec = cls(**values)
        validate_serving(spec)
        return spec


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def validate_serving(spec: ServingSpec) -> None:
    """Raise ServingError naming the first problem (its wire field first, `serving.<field>`)."""
    if not spec.concurrency and not spec.request_rates:
        raise ServingError("serving: give a concurrency or a request rate")
    if len(spec.concurrency) + len(spec.request_rates) > MAX_BATCH_SIZE:
        raise ServingError(f"serving: more than {MAX_BATCH_SIZE} load points")
    for i, clients in enumerate(spec.concurrency):
        if not _is_int(clients) or not 1 <= clients <= MAX_BATCH_SIZE:
            raise ServingError(
                f"serving.concurrency[{i}]: {clients!r} is not a whole number of clients from 1 "
                f"to {MAX_BATCH_SIZE}"
            )
    for i, rate in enumerate(spec.request_rates):
        if not _is_number(rate) or not 0 < rate <= MAX_REQUEST_RATE:
            raise ServingError(
                f"serving.request_rates[{i}]: {rate!r} is not a rate above 0 and at most "
                f"{MAX_REQUEST_RATE:g} requests/s"
            )
    if not _is_int(spec.requests) or not 1 <= spec.requests <= MAX_REQUESTS:
        raise ServingError(
            f"serving.requests: {spec.requests!r} is not a whole number from 1 to {MAX_REQUESTS}"
        )
    for i, rate in enumerate(spec.request_rates):
        if spec.duration_s is None and spec.requests / rate > MAX_SERVE_S:
            raise ServingError(
                f"serving.request_rates[{i}]: {spec.requests} requests at {rate:g}/s would take "
                f"{spec.requests / rate:.0f} s a pass, past {MAX_SERVE_S:g} s; send fewer "
                "requests or for a duration"
            )
    if spec.duration_s is not None and (
        not _is_number(spec.duration_s) or not 0 < spec.duration_s <= MAX_SERVE_S
    ):
        raise ServingError(
            f"serving.duration_s: {spec.duration_s!r} is not a number of seconds above 0 and at "
            f"most {MAX_SERVE_S:g}"
        )
    if not _is_int(spec.seed) or not 0 <= spec.seed < 2**32:
        raise ServingError(f"serving.seed: {spec.seed!r} is not a whole number from 0 to 2^32-1")
    for key in ("slo_ttft_ms", "slo_tpot_ms"):
        value = getattr(spec, key)
        if not _is_number(value) or not 0 < value <= MAX_SERVE_S * 1000:
            raise ServingError(
                f"serving.{key}: {value!r} is not a number of ms above 0 and at most "
                f"{MAX_SERVE_S * 1000:g}"
            )
    validate_server(spec)
    if not isinstance(spec.prompts, tuple) or not all(isinstance(p, Prompt) for p in spec.prompts):
        raise ServingError("serving.prompts: not a list of prompts")
    if sum(len(c) for p in spec.prompts for _, c in p.messages) > MAX_PROMPT_FILE_CHARS:
        raise ServingError(f"serving.prompts: more than {MAX_PROMPT_FILE_CHARS} characters")


def validate_server(spec: ServingSpec) -> None:
    """The server fields: one of them at most, a server we know how to start, a URL of a
    bounded length with nothing a terminal would act on (the agent parses it whole)."""
    if spec.serve_url is not None and spec.serve is not None:
        raise ServingError("serving.serve: give a server to start or a URL, not both")
    if spec.serve is not None and spec.serve not in SERVERS:
        raise ServingError(f"serving.serve: {spec.serve!r} is not one of {', '.join(SERVERS)}")
    url = spec.serve_url
    if url is None:
        return
    if not isinstance(url, str) or len(url) > MAX_URL_CHARS or not url.isprintable():
        raise ServingError(f"serving.serve_url: not a URL of at most {MAX_URL_CHARS} characters")
    if not url.startswith(("http://", "https://")) or " " in url:
        raise ServingError(f"serving.serve_url: {url!r} is not an http:// or https:// URL")


def prompt_from(item: Any, where: str) -> Prompt:
    """One prompt file line's object (or a spec's prompt): `prompt` text or mlx-lm's `messages`,
    with an optional `max_tokens`; ServingError naming `where` and the problem otherwise."""
    if not isinstance(item, dict):
        raise ServingError(f"{where}: not a JSON object")
    if "prompt" not in item and "messages" not in item:
        raise ServingError(f"{where}: no prompt (a `prompt` string or `messages` list)")
    unknown = sorted(map(str, set(item) - {"prompt", "messages", "max_tokens"}))
    if unknown:
        raise ServingError(f"{where}: unknown key(s): {', '.join(unknown)}")
    if "prompt" in item and "messages" in item:
        raise ServingError(f"{where}: give `prompt` or `messages`, not both")
    if "prompt" in item:
        messages: Any = [{"role": "user", "content": item["prompt"]}]
    else:
        messages = item["messages"]
    if not isinstance(messages, list) or not messages:
        raise ServingError(f"{where}: `messages` must be a non-empty list")
    pairs = []
    for j, message in enumerate(messages):
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            raise ServingError(f"{where}: message {j + 1} is not {{role, content}}")
        role, content = message["role"], message["content"]
        if role not in ROLES:
            raise ServingError(f"{where}: message {j + 1}'s role {role!r} is not one of {ROLES}")
        if not isinstance(content, str) or not content.strip():
            raise ServingError(f"{where}: message {j + 1} has no text")
        if len(content) > MAX_PROMPT_CHARS or "\x00" in content:
            raise ServingError(
                f"{where}: message {j + 1} is over {MAX_PROMPT_CHARS} characters or has a NUL"
            )
        pairs.append((role, content))
    most = item.get("max_tokens")
    if most is not None and (not _is_int(most) or not 1 <= most <= MAX_DECODE_TOKENS):
        raise ServingError(f"{where}: max_tokens {most!r} is not 1 to {MAX_DECODE_TOKENS}")
    return Prompt(tuple(pairs), most)


def parse_prompt_file(text: str, name: str) -> tuple[Prompt, ...]:
    """A JSONL prompt file's prompts (blank lines skipped); ServingError naming the file, the
    line and the problem for a file that is not JSONL, holds no prompt or is too large."""
    if len(text) > MAX_PROMPT_FILE_CHARS:
        raise ServingError(f"--prompt-file {name}: over {MAX_PROMPT_FILE_CHARS} characters")
    prompts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise ServingError(f"--prompt-file {name}: line {number} is not JSON") from None
        prompts.append(prompt_from(item, f"--prompt-file {name}: line {number}"))
        if len(prompts) > MAX_PROMPTS:
            raise ServingError(f"--prompt-file {name}: more than {MAX_PROMPTS} prompts")
    if not prompts:
        raise ServingError(f"--prompt-file {name}: no prompt in it")
    return tuple(prompts)


def parse_rates(text: str) -> tuple[float, ...]:
    """'0.5,2' -> (0.5, 2.0); ServingError naming --request-rate and the bad item."""
    items = [item.strip() for item in text.split(",")]
    rates = []
    for item in items:
        try:
            rate = finite_float(item)
        except NotFinite as exc:
            raise ServingError(f"--request-rate: {item!r} is not {exc}") from None
        if rate <= 0:
            raise ServingError(f"--request-rate: {item} must be above 0 (requests per second)")
        rates.append(rate)
    return tuple(rates)


def load_tag(concurrency: int, rate: float) -> str:
    """`c4` (closed loop, 4 clients) or `r2.0` (open loop, 2 requests/s): a serving test's load."""
    return f"c{concurrency}" if concurrency else f"r{float(rate)}"


def arrival_offsets(rate: float, count: int, seed: int) -> list[float]:
    """Seconds from a cell's start at which its `count` open-loop requests arrive: a Poisson
    process at `rate` per second (exponential gaps), the same for the same seed on every Mac."""
    draw = random.Random(seed)
    offsets, at = [], 0.0
    for _ in range(count):
        at += draw.expovariate(rate)
        offsets.append(at)
    return offsets


def synthetic_prompt(length: int, vocab_size: int, seed: int) -> list[int]:
    """`length` random token ids below `vocab_size`, one list per (seed): prompts that share no
    prefix, so no request finds another's tokens in a prompt cache."""
    draw = random.Random(seed)
    return [draw.randrange(vocab_size) for _ in range(length)]


def saturated(timings: Sequence[RequestTiming]) -> bool:
    """Whether an open loop's engine fell behind its rate (SATURATION_GROWTH); a pass of fewer
    than three completed requests cannot tell, and is not."""
    done = sorted((t.start_s, t.e2e_s) for t in timings if t.e2e_s is not None)
    third = len(done) // 3
    if not third:
        return False
    first = statistics.fmean(e2e for _, e2e in done[:third])
    last = statistics.fmean(e2e for _, e2e in done[-third:])
    return last > SATURATION_GROWTH * first


def per_output_token(record: dict[str, Any]) -> dict[str, Any]:
    """A serving cell's energy per output token: its `tokens_per_joule` and `joules_per_token`
    (gross) over the output tokens of its timed passes, not its prompt and output lengths, and
    `joules_per_output_token_net`, net of the idle baseline (docs/energy.md)."""
    tokens = ((record.get("serving") or {}).get("figures") or {}).get("output_tokens") or 0
    gross, net = record.get("energy_j"), record.get("energy_net_j")
    if gross is not None:
        record["tokens_per_joule"] = tokens / gross if gross > 0 else None
        record["joules_per_token"] = gross / tokens if tokens else None
    record["joules_per_output_token_net"] = net / tokens if net is not None and tokens else None
    return record
