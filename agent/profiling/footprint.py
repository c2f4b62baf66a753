"""How much memory a cell will need, estimated before it runs, so a cell the machine cannot hold
is refused with the estimate instead of taking the job process down (an allocation MLX cannot
make kills the process: SIGSEGV, or the kernel's out-of-memory SIGKILL).

Pure arithmetic over the model's shape (its config: ours or mlx-lm's `args`). A prompt (and a
depth) goes through the model in steps of at most S tokens (the prefill step), each evaluating
the KV cache alone (agent.profiling.speed.prefill), so with L = min(S, the longest of prompt and
depth) and a batch of B, in float16 (2 bytes) unless said otherwise:

- weights: the bytes the model's arrays hold (measured, agent.profiling.memory);
- KV cache: layers x 2 x B x kv_heads x head_dim x (depth + prompt + generated, rounded up to
  the cache's 256-position steps), plus the depth's once more (rounded up alike): the cache
  filled with it is kept while each iteration works on a copy (agent.profiling.speed.Depth);
- activations: the residual stream and one layer's intermediates, B x L x (4 hidden + q/k/v +
  3 intermediate); plus, where attention is not a fused kernel (MLX's CPU backend), the
  attention scores of one layer, B x heads x L x (cache positions) in float32;
- logits: B x vocab (only the last position is projected onto the vocabulary).

The estimate errs high, never low: docs/performance.md (The profiler's fidelity) has it against
MLX's peak. A decode cell's estimate covers the untimed filling of its depth too, whose peak the
figure reported for the timed decode leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from shared.benchmark.matrix import Cell
from shared.distributed.group import TENSOR

HALF = 2
SCORE_BYTES = 4
CACHE_STEP = 256
"""agent.model.KVCache grows in steps of this many positions."""


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int


def model_shape(model: Any) -> ModelShape | None:
    """The shape from the model's `args` (agent.model.ModelArgs, or an mlx-lm ModelArgs);
    None when the model does not say (its cells then run unestimated)."""
    args = getattr(model, "args", None)
    try:
        heads = int(args.num_attention_heads)
        hidden = int(args.hidden_size)
        return ModelShape(
            layers=int(args.num_hidden_layers),
            hidden=hidden,
            intermediate=int(args.intermediate_size),
            heads=heads,
            kv_heads=int(getattr(args, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(args, "head_dim", None) or hidden // heads),
            vocab=int(args.vocab_size),
        )
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return None


def rank_share(shape: ModelShape, ranks: int, sharding: str) -> ModelShape:
    """What one of `ranks` ranks holds of a model of `shape` split `sharding` (a group's
    cells, agent.profiling.sharding): tensor divides the heads, key/value heads and MLP units
    among the ranks (the KV cache and intermediates with them); pipeline gives a rank at most
    its share of the layers, rounded up."""
    if sharding == TENSOR:
        return replace(
            shape,
            heads=max(1, shape.heads // ranks),
            kv_heads=max(1, shape.kv_heads // ranks),
            intermediate=max(1, shape.intermediate // ranks),
        )
    return replace(shape, layers=-(-shape.layers // ranks))


@dataclass(frozen=True)
class Footprint:
    """Estimated bytes, by what holds them."""

    weights: int
    kv_cache: int
    activations: int
    logits: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations + self.logits

    def text(self) -> str:
        """'about 12.3 GB (weights 1.8 + KV cache 0.5 + activations 9.0 + logits 1.0)'."""
        parts = (
            ("weights", self.weights),
            ("KV cache", self.kv_cache),
            ("activations", self.activations),
            ("logits", self.logits),
        )
        detail = " + ".join(f"{name} {_gb(size)}" for name, size in parts)
        return f"about {_gb(self.total)} GB ({detail})"


def _gb(size: int) -> str:
    return f"{size / 1e9:.1f}"


def cell_footprint(
    shape: ModelShape, weight_bytes: int, cell: Cell, step: int, scores_materialized: bool
) -> Footprint:
    """What `cell` needs with a model of `shape` holding `weight_bytes`, its prompt (and
    depth) fed in steps of `step` tokens; `scores_materialized` when attention builds its score
    matrix (no fused kernel)."""
    batch = cell.batch_size
    positions = _rounded(cell.n_depth + cell.n_prompt + cell.n_gen)
    held = positions + _rounded(cell.n_depth)  # the working copy and the filled original
    kv_cache = shape.layers * 2 * batch * shape.kv_heads * shape.head_dim * held * HALF
    length = min(step, max(cell.n_depth, cell.n_prompt, 1))
    per_token = (
        4 * shape.hidden
        + (shape.heads + 2 * shape.kv_heads) * shape.head_dim
        + 3 * shape.intermediate
    )
    activations = batch * length * per_token * HALF
    if scores_materialized:
        activations += batch * shape.heads * length * positions * SCORE_BYTES
    logits = batch * shape.vocab * HALF
    return Footprint(weight_bytes, kv_cache, activations, logits)


def _rounded(positions: int) -> int:
    """Positions a KV cache holds for `positions` tokens: whole steps of CACHE_STEP."""
    return -(-positions // CACHE_STEP) * CACHE_STEP


def refusal(footprint: Footprint, memory_bytes: int) -> str | None:
    """Why a cell is not run (it needs more than the machine's memory), or None to run it."""
    if footprint.total <= memory_bytes:
        return None
    return (
        f"not run: it would need {footprint.text()} of memory; this machine has "
        f"{_gb(memory_bytes)} GB"
    )
