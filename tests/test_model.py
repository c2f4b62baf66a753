"""The benchmark model: shapes, parameter counts, KV-cache correctness, quantization."""

from __future__ import annotations

import mlx.core as mx
import pytest

from agent.model import KVCache, Model, ModelArgs, build_model
from agent.profiling import MemoryProfiler


def expected_params(args: ModelArgs) -> int:
    """Parameters of a Llama-shaped model, counted by hand from its dimensions."""
    h, kv = args.hidden_size, args.num_key_value_heads * args.head_dim
    attention = 2 * h * h + 2 * h * kv
    mlp = 3 * h * args.intermediate_size
    per_layer = attention + mlp + 2 * h
    head = 0 if args.tie_word_embeddings else args.vocab_size * h
    return args.vocab_size * h + args.num_hidden_layers * per_layer + h + head


def test_small_is_under_ten_million_parameters() -> None:
    args = ModelArgs.small()
    info = MemoryProfiler().profile_model(build_model(args))
    assert info["param_count"] == expected_params(args)
    assert info["param_count"] < 10_000_000


def test_full_is_llama_3b_sized_without_materializing_weights() -> None:
    before = mx.get_active_memory()
    model = Model(ModelArgs.full())
    info = MemoryProfiler().profile_model(model)
    assert abs(info["param_count"] - 3.21e9) / 3.21e9 < 0.02
    assert info["param_count"] == expected_params(ModelArgs.full())
    # 3.2B float32 weights would be 12.8 GB; nothing was evaluated.
    assert mx.get_active_memory() - before < 100 * 1024**2


def test_tied_weights_are_counted_once() -> None:
    tied = ModelArgs.small()
    untied = ModelArgs.small()
    untied.tie_word_embeddings = False
    profiler = MemoryProfiler()
    tied_count = profiler.profile_model(Model(tied))["param_count"]
    untied_count = profiler.profile_model(Model(untied))["param_count"]
    assert tied_count == expected_params(tied)
    assert untied_count - tied_count == tied.vocab_size * tied.hidden_size


# Logits through the cache equal one full pass up to float32 rounding. MLX's CUDA backend does
# float32 matmuls at TF32 precision (seen on an H200, MLX 0.32.4: 2.6e-3 apart), so the bound
# on a GPU is looser; a cache that is wrong is off by about 1.
SAME_LOGITS = 1e-4 if mx.default_device() == mx.cpu else 1e-2


def float32_model() -> Model:
    mx.random.seed(3)
    model = Model(ModelArgs.small())
    mx.eval(model.parameters())
    return model


def test_decoding_through_the_cache_matches_one_full_pass() -> None:
    model = float32_model()
    tokens = mx.random.randint(0, 4096, (2, 24), key=mx.random.key(1))
    full = model(tokens)
    cache = model.make_cache()
    steps = [model(tokens[:, :8], cache=cache)]
    steps += [model(tokens[:, i : i + 1], cache=cache) for i in range(8, 24)]
    incremental = mx.concatenate(steps, axis=1)
    assert mx.abs(incremental - full).max().item() < SAME_LOGITS
    assert all(layer.offset == 24 for layer in cache)


@pytest.mark.slow
def test_chunked_prefill_after_a_cached_prefix_matches_one_full_pass() -> None:
    model = float32_model()
    tokens = mx.random.randint(0, 4096, (1, 300), key=mx.random.key(2))
    full = model(tokens)
    cache = model.make_cache()
    chunks = [model(tokens[:, :100], cache=cache), model(tokens[:, 100:], cache=cache)]
    assert mx.abs(mx.concatenate(chunks, axis=1) - full).max().item() < SAME_LOGITS


def test_decoding_without_the_cache_would_be_wrong() -> None:
    """The check above can fail: the seed's cache-less decode differs from a full pass."""
    model = float32_model()
    tokens = mx.random.randint(0, 4096, (1, 12), key=mx.random.key(4))
    full = model(tokens)
    last_without_cache = model(tokens[:, -1:])
    assert mx.abs(last_without_cache[:, 0] - full[:, -1]).max().item() > 1e-2


def test_cache_grows_past_its_step() -> None:
    cache = KVCache()
    keys = mx.ones((1, 2, KVCache.step + 3, 4))
    out_keys, _ = cache.update_and_fetch(keys, keys)
    out_keys, _ = cache.update_and_fetch(keys[:, :, :1], keys[:, :, :1])
    assert out_keys.shape == (1, 2, KVCache.step + 4, 4)
    assert cache.offset == KVCache.step + 4


def test_four_bit_weights_take_under_35_percent_of_float16() -> None:
    profiler = MemoryProfiler()
    f16 = profiler.profile_model(build_model(ModelArgs.small(), bits=16))
    q8 = profiler.profile_model(build_model(ModelArgs.small(), bits=8))
    q4 = profiler.profile_model(build_model(ModelArgs.small(), bits=4))
    assert q4["weight_memory_bytes"] < 0.35 * f16["weight_memory_bytes"]
    assert q4["weight_memory_bytes"] < q8["weight_memory_bytes"] < f16["weight_memory_bytes"]
    # Packed weights, scales and biases are all counted; the logical count is unchanged.
    assert q4["num_arrays"] > f16["num_arrays"]
    assert q4["param_count"] == q8["param_count"] == f16["param_count"]


def test_weights_are_random_but_reproducible() -> None:
    a = build_model(ModelArgs.small(), seed=7)
    b = build_model(ModelArgs.small(), seed=7)
    c = build_model(ModelArgs.small(), seed=8)
    wa, wb, wc = (m.model.embed_tokens.weight for m in (a, b, c))
    assert mx.array_equal(wa, wb)
    assert not mx.array_equal(wa, wc)


def test_unsupported_bits_are_refused() -> None:
    with pytest.raises(ValueError, match="bits"):
        build_model(ModelArgs.small(), bits=3)
