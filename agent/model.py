"""The built-in benchmark model: a Llama-shaped decoder-only transformer in MLX.

Written in the style of mlx-lm's models/llama.py and called the same way,
`model(tokens, cache=cache) -> logits`, so one profiler serves it and any mlx-lm model.
Weights are random (from a fixed seed): a benchmark needs the shapes and the arithmetic,
not the knowledge.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx.nn.layers.distributed import shard_linear
from mlx.utils import tree_flatten

DEFAULT_SEED = 0
QUANT_GROUP_SIZE = 64
SUPPORTED_BITS = (4, 8, 16)


SIZES = (
    "hidden_size",
    "num_hidden_layers",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)
"""ModelArgs' whole-number sizes, each at least 1."""
MOST_PARAMETERS = 10**12
"""The most parameters a built-in model may have: more than the largest Mac (512 GB) holds
even at 4 bits, so a larger shape is a typo, refused before MLX allocates (issue 42: every size
bounded). Llama 3.1 405B, the largest open dense model, has 4.05e11."""


@dataclass
class ModelArgs:
    model_type: str = "llama"
    hidden_size: int = 3072
    num_hidden_layers: int = 28
    intermediate_size: int = 8192
    num_attention_heads: int = 24
    num_key_value_heads: int = 8
    vocab_size: int = 128256
    rms_norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        """Refuse a shape MLX would fail on later in its own words (issue 42: hidden_size=0
        was a ZeroDivisionError, num_hidden_layers=-1 built a model of no layers)."""
        for name in SIZES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} must be a multiple of num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        if self.param_count > MOST_PARAMETERS:
            raise ValueError(
                f"this shape has {self.param_count:.3g} parameters, past the {MOST_PARAMETERS:.0e} "
                "a built-in model may have (more than any Mac holds)"
            )
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number above 0, got {value!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def param_count(self) -> int:
        """The parameters Model(self) holds: embeddings (and an untied head), and per layer
        attention (q and o square, k and v at the KV heads' width), the MLP's three
        projections and two norms; then the final norm."""
        hidden, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * self.intermediate_size
        heads = 1 if self.tie_word_embeddings else 2
        return (
            heads * self.vocab_size * hidden
            + self.num_hidden_layers * (layer + 2 * hidden)
            + hidden
        )

    @classmethod
    def small(cls) -> ModelArgs:
        """About 4M parameters: builds instantly, for smoke tests and pipeline debugging."""
        return cls(
            hidden_size=256,
            num_hidden_layers=4,
            intermediate_size=704,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=4096,
        )

    @classmethod
    def full(cls) -> ModelArgs:
        """Llama-3.2-3B shaped (~3.21B parameters), the size class the seed docs quote."""
        return cls()


BUILTIN_CONFIGS = {"small": ModelArgs.small, "full": ModelArgs.full}


class KVCache:
    """Keys and values of every position seen so far, grown in steps to avoid a copy per token."""

    step = 256

    def __init__(self) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        previous = self.offset
        new = keys.shape[2]
        if self.keys is None or previous + new > self.keys.shape[2]:
            batch, heads, _, head_dim = keys.shape
            grow = ((new + self.step - 1) // self.step) * self.step
            shape = (batch, heads, grow, head_dim)
            fresh_keys = mx.zeros(shape, keys.dtype)
            fresh_values = mx.zeros(shape, values.dtype)
            if self.keys is None:
                self.keys, self.values = fresh_keys, fresh_values
            else:
                self.keys = mx.concatenate([self.keys[..., :previous, :], fresh_keys], axis=2)
                self.values = mx.concatenate([self.values[..., :previous, :], fresh_values], axis=2)
        self.offset += new
        self.keys[..., previous : self.offset, :] = keys
        self.values[..., previous : self.offset, :] = values
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    @property
    def state(self) -> list[mx.array]:
        """The arrays to evaluate so that the cache holds computed values."""
        return [a for a in (self.keys, self.values) if a is not None]


def causal_mask(length: int, offset: int) -> mx.array | str | None:
    """Mask for `length` new queries after `offset` cached positions."""
    if length == 1:
        return None
    if offset == 0:
        return "causal"
    query_positions = mx.arange(offset, offset + length)[:, None]
    key_positions = mx.arange(offset + length)[None]
    return key_positions <= query_positions


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads = args.num_attention_heads
        self.n_kv_heads = args.num_key_value_heads
        self.head_dim = args.head_dim
        self.scale = self.head_dim**-0.5
        dim = args.hidden_size
        self.q_proj = nn.Linear(dim, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, dim, bias=False)
        self.rope = nn.RoPE(self.head_dim, traditional=False, base=args.rope_theta)

    def __call__(self, x: mx.array, cache: KVCache | None = None) -> mx.array:
        batch, length, _ = x.shape
        queries = self.q_proj(x).reshape(batch, length, self.n_heads, -1).transpose(0, 2, 1, 3)
        keys = self.k_proj(x).reshape(batch, length, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        values = self.v_proj(x).reshape(batch, length, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        offset = cache.offset if cache is not None else 0
        queries = self.rope(queries, offset=offset)
        keys = self.rope(keys, offset=offset)
        if cache is not None:
            keys, values = cache.update_and_fetch(keys, values)
        output = mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=self.scale, mask=causal_mask(length, offset)
        )
        return self.o_proj(output.transpose(0, 2, 1, 3).reshape(batch, length, -1))


class MLP(nn.Module):
    """SwiGLU feed-forward block."""

    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.mlp = MLP(args.hidden_size, args.intermediate_size)
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)

    def __call__(self, x: mx.array, cache: KVCache | None = None) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers: list[TransformerBlock | None] = [
            TransformerBlock(args) for _ in range(args.num_hidden_layers)
        ]
        self.norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.pipeline_group: mx.distributed.Group | None = None
        self.pipeline_rank = 0
        self.pipeline_size = 1
        self.start_idx = 0
        self.end_idx: int | None = None

    @property
    def pipeline_layers(self) -> list[TransformerBlock]:
        """The layers this rank runs: all of them until pipeline() splits them."""
        return self.layers[self.start_idx : self.end_idx]

    def pipeline(self, group: mx.distributed.Group) -> None:
        """Split the layers over `group` as mlx-lm's models/pipeline.py (PipelineMixin) does:
        contiguous runs, the low ranks taking the extra layers, the last rank the first
        layers and rank 0 the last, so rank 0 ends with the final hidden state. The other
        ranks' layers become None (their weights are never held), keeping the layer numbers
        that weight names carry. pipeline_problem() says first whether it can."""
        problem = pipeline_problem(len(self.layers), group.size())
        if problem is not None:
            raise ValueError(problem)
        self.pipeline_group = group
        self.pipeline_rank = group.rank()
        self.pipeline_size = group.size()
        base, extra = divmod(len(self.layers), self.pipeline_size)
        split = [base + (1 if rank < extra else 0) for rank in range(self.pipeline_size)]
        self.start_idx = sum(split[self.pipeline_rank + 1 :])
        self.end_idx = self.start_idx + split[self.pipeline_rank]
        self.layers = self.layers[: self.end_idx]
        self.layers[: self.start_idx] = [None] * self.start_idx

    def __call__(self, tokens: mx.array, cache: list[KVCache] | None = None) -> mx.array:
        """As mlx-lm's pipelined models (models/qwen2.py, deepseek_v3.py) run: every rank
        embeds (the shape to receive into), takes the previous stage's activations from the
        rank above, runs its layers, sends them to the rank below, and an all_gather hands
        rank 0's final hidden state to every rank, so each computes the same logits."""
        h = self.embed_tokens(tokens)
        layers = self.pipeline_layers
        layer_caches = cache if cache is not None else [None] * len(layers)
        rank, size, group = self.pipeline_rank, self.pipeline_size, self.pipeline_group
        if rank < size - 1:
            h = mx.distributed.recv_like(h, rank + 1, group=group)
        for layer, layer_cache in zip(layers, layer_caches, strict=True):
            h = layer(h, layer_cache)
        if rank != 0:
            h = mx.distributed.send(h, rank - 1, group=group)
            if layer_caches[-1] is not None:  # evaluating the cache alone still sends
                layer_caches[-1].keys = mx.depends(layer_caches[-1].keys, h)
        if size > 1:
            h = mx.distributed.all_gather(h, group=group)[: h.shape[0]]
        return self.norm(h)


class Model(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = LlamaModel(args)
        if not args.tie_word_embeddings:
            self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)

    def __call__(self, tokens: mx.array, cache: list[KVCache] | None = None) -> mx.array:
        h = self.model(tokens, cache)
        if self.args.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(h)
        return self.lm_head(h)

    @property
    def layers(self) -> list[TransformerBlock]:
        """This rank's layers (all of them unless pipelined), as mlx-lm's models/qwen2.py."""
        return self.model.pipeline_layers

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]

    def shard(self, group: mx.distributed.Group | None = None) -> None:
        """Tensor-parallel over `group`, as mlx-lm's models/llama.py shards: each rank keeps
        its share of the heads and of the MLP's hidden units, and the two "sharded-to-all"
        projections (o_proj, down_proj) all_sum through MLX's distributed backend. Embeddings
        and norms stay whole on every rank. shard_problem() says first whether it can."""
        group = group or mx.distributed.init()
        ranks = group.size()
        for layer in self.layers:
            attention, mlp = layer.self_attn, layer.mlp
            attention.q_proj = shard_linear(attention.q_proj, "all-to-sharded", group=group)
            attention.k_proj = shard_linear(attention.k_proj, "all-to-sharded", group=group)
            attention.v_proj = shard_linear(attention.v_proj, "all-to-sharded", group=group)
            attention.o_proj = shard_linear(attention.o_proj, "sharded-to-all", group=group)
            attention.n_heads //= ranks
            attention.n_kv_heads //= ranks
            mlp.gate_proj = shard_linear(mlp.gate_proj, "all-to-sharded", group=group)
            mlp.down_proj = shard_linear(mlp.down_proj, "sharded-to-all", group=group)
            mlp.up_proj = shard_linear(mlp.up_proj, "all-to-sharded", group=group)


def shard_problem(args: ModelArgs, bits: int, ranks: int) -> str | None:
    """Why `args` at `bits` cannot be split tensor-parallel over `ranks`, or None: every rank
    needs whole heads, and a quantized sharded-to-all layer a whole number of quantization
    groups in its share of the inputs (mlx.nn's QuantizedShardedToAllLinear re-quantizes
    each share)."""
    if ranks < 2:
        return None
    shares = {
        "attention heads": args.num_attention_heads,
        "key/value heads": args.num_key_value_heads,
        "MLP hidden units": args.intermediate_size,
    }
    for what, count in shares.items():
        if count % ranks:
            return f"its {count} {what} do not split evenly over {ranks} ranks"
    if bits != 16:
        for what, inputs in (
            ("o_proj", args.num_attention_heads * args.head_dim),
            ("down_proj", args.intermediate_size),
        ):
            share = inputs // ranks
            if share % QUANT_GROUP_SIZE:
                return (
                    f"{bits}-bit {what} would give each of {ranks} ranks {share} inputs, not a "
                    f"multiple of the quantization group ({QUANT_GROUP_SIZE})"
                )
    return None


def pipeline_problem(layers: int, ranks: int) -> str | None:
    """Why `layers` layers (ModelArgs.num_hidden_layers, or an mlx-lm model's) cannot be split
    into a pipeline over `ranks`, or None: every rank needs at least one whole layer (mlx-lm's
    PipelineMixin refuses an empty stage). Any bits will do: layers move whole."""
    if ranks > layers:
        return f"its {layers} layers cannot give each of {ranks} ranks one"
    return None


def build_model(
    args: ModelArgs,
    bits: int = 16,
    seed: int = DEFAULT_SEED,
    split: Callable[[Model], None] | None = None,
) -> Model:
    """A random-weight model in float16 (`bits=16`) or quantized to 4 or 8 bits, evaluated.
    `split` (Model.shard, LlamaModel.pipeline) runs after quantizing and before anything is
    evaluated: the weights are the same as unsplit (their random keys are drawn as the arrays
    are made), but a rank computes and holds only its share."""
    if not isinstance(args, ModelArgs):
        raise TypeError(
            f"args must be a ModelArgs (ModelArgs.small(), ModelArgs.full()), got "
            f"{type(args).__name__}"
        )
    if isinstance(bits, bool) or bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits!r}")
    mx.random.seed(seed)
    model = Model(args)
    model.set_dtype(mx.float16)
    if bits != 16:
        nn.quantize(model, group_size=QUANT_GROUP_SIZE, bits=bits)
    if split is not None:
        split(model)
    for _, leaf in tree_flatten(model.parameters()):  # a leaf at a time: Ctrl-C lands between
        mx.eval(leaf)
    return model
