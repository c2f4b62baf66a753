"""What a serving cell's record may hold (docs/protocol.md §5, Serving cells), checked as
shared.wire.agent_shapes checks every record: every field optional for an older agent's."""

from __future__ import annotations

from typing import Any

from shared import shapes as s
from shared.benchmark.matrix import DECODE, PREFILL, PREFILL_DECODE, SERVE
from shared.benchmark.serving import MAX_REQUEST_RATE, MAX_REQUESTS, MAX_SERVE_S, PERCENTILE_KEYS
from shared.bounds import MAX_BATCH_SIZE, MAX_ITERATIONS

MODES = (PREFILL, DECODE, PREFILL_DECODE, SERVE)
MOST_REQUESTS = MAX_REQUESTS * MAX_ITERATIONS
amount = s.number(0)
maybe_amount = s.nil_or(amount)
count = s.integer(0, MOST_REQUESTS * 8192)
figures = s.fields(
    {
        "requests": s.integer(0, MOST_REQUESTS),
        "completed": s.integer(0, MOST_REQUESTS),
        "failed": s.integer(0, MOST_REQUESTS),
        "good": s.integer(0, MOST_REQUESTS),
        "output_tokens": count,
        "slo_ttft_ms": s.number(0, MAX_SERVE_S * 1000),
        "slo_tpot_ms": s.number(0, MAX_SERVE_S * 1000),
    },
    {
        "window_s": maybe_amount,
        "output_tok_s": maybe_amount,
        "request_rate": maybe_amount,
        "goodput": maybe_amount,
        **dict.fromkeys(PERCENTILE_KEYS, maybe_amount),
    },
)
serving = s.fields(
    {"loop": s.one_of(("closed", "open")), "passes": s.integer(0, MAX_ITERATIONS)},
    {
        "engine": s.text(256),
        "model_impl": s.text(256),
        "requests_per_pass": s.integer(1, MAX_REQUESTS),
        "duration_s": s.nil_or(s.number(0, MAX_SERVE_S)),
        "prompts": s.one_of(("file", "synthetic")),
        "tokens_from": s.text(256),
        "prompt_cache": s.text(1024),
        "saturated": s.nil_or(s.flag),
        "late_injected": s.integer(0, MOST_REQUESTS),
        "figures": figures,
    },
)
SERVED = {
    "concurrency": s.integer(0, MAX_BATCH_SIZE),
    "request_rate": s.number(0, MAX_REQUEST_RATE),
    "serving": serving,
    "joules_per_output_token_net": s.nil_or(s.number()),
}
"""A serving cell's fields (shared.benchmark.serving): optional, so an older agent's records
read as they were."""


def iteration_tokens(record: dict[str, Any]) -> float:
    """Tokens one timed iteration counts, against which a record's rate is checked: a serving
    cell's output tokens per pass, any other's (prompt + generated) x batch."""
    if record.get("mode") != SERVE:
        return (record["n_prompt"] + record["n_gen"]) * record["batch_size"]
    served = record.get("serving") or {}
    passes = served.get("passes") or 1
    return (served.get("figures") or {}).get("output_tokens", 0) / passes
