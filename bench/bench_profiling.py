"""Is our profiler's clock honest, and is our model as fast as mlx-lm's?

Measured side by side in one run, printed as ratios (1.00 = identical):
  1. our prompt processing latency vs a bare mlx-lm-style prompt pass on the same model;
  2. our decode time per token vs a bare cached greedy loop on the same model;
  3. our model's decode tok/s vs mlx-lm's llama with identical dimensions and weights
     (when the `lm` extra is installed).

    python bench/bench_profiling.py [--config small|full] [--bits 16] [--seq-len 128]
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
from mlx.utils import tree_flatten

from agent.model import BUILTIN_CONFIGS, ModelArgs, build_model
from agent.profiling import SpeedProfiler
from agent.profiling.memory import random_tokens
from agent.profiling.speed import new_cache


def bare_prefill_ms(model, tokens: mx.array, warmup: int, iterations: int) -> float:
    """A bare prompt pass as mlx-lm's generate_step makes it: all but the last token into a
    fresh cache (one step: the prompt is shorter than its 2048), evaluating the cache only,
    then the last token's logits."""
    samples = []
    for step in range(warmup + iterations):
        cache = new_cache(model)
        start = time.perf_counter()
        model(tokens[:, :-1], cache=cache)
        mx.eval([layer.state for layer in cache])
        mx.eval(mx.argmax(model(tokens[:, -1:], cache=cache)[:, -1, :], axis=-1))
        if step >= warmup:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def bare_decode_ms_per_token(
    model, context: mx.array, tokens: int, warmup: int, iterations: int
) -> float:
    samples = []
    for step in range(warmup + iterations):
        cache = new_cache(model)
        token = mx.argmax(model(context, cache=cache)[:, -1, :], axis=-1)
        mx.eval(token)
        start = time.perf_counter()
        for _ in range(tokens):
            token = mx.argmax(model(token[:, None], cache=cache)[:, -1, :], axis=-1)
            mx.eval(token)
        if step >= warmup:
            samples.append((time.perf_counter() - start) / tokens)
    return statistics.median(samples) * 1000


def mlx_lm_twin(ours, args: ModelArgs):
    """mlx-lm's llama with our dimensions, holding our very weights."""
    from mlx_lm.models import llama

    twin = llama.Model(
        llama.ModelArgs(
            model_type="llama",
            hidden_size=args.hidden_size,
            num_hidden_layers=args.num_hidden_layers,
            intermediate_size=args.intermediate_size,
            num_attention_heads=args.num_attention_heads,
            rms_norm_eps=args.rms_norm_eps,
            vocab_size=args.vocab_size,
            num_key_value_heads=args.num_key_value_heads,
            rope_theta=args.rope_theta,
            tie_word_embeddings=args.tie_word_embeddings,
        )
    )
    twin.load_weights(list(tree_flatten(ours.parameters())))
    mx.eval(twin.parameters())
    return twin


def row(name: str, ours: float, reference: float, unit: str) -> None:
    print(f"{name:<44} {ours:>10.3f} {reference:>10.3f} {unit:<8} {ours / reference:>6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=list(BUILTIN_CONFIGS), default="small")
    parser.add_argument("--bits", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=5)
    opts = parser.parse_args()

    args = BUILTIN_CONFIGS[opts.config]()
    model = build_model(args, bits=opts.bits)
    tokens = random_tokens(model, 1, opts.seq_len)
    profiler = SpeedProfiler()
    print(f"{opts.config} model, {opts.bits} bits, MLX {mx.__version__} on {mx.default_device()}")
    print(f"{'measurement':<44} {'ours':>10} {'reference':>10} {'unit':<8} {'ratio':>6}")

    ours = profiler.benchmark_tokens_per_sec(
        model, seq_len=opts.seq_len, num_warmup=opts.warmup, num_iterations=opts.iterations
    )
    bare = bare_prefill_ms(model, tokens, opts.warmup, opts.iterations)
    row(
        f"prompt pp{opts.seq_len} latency vs bare prompt pass",
        ours["median_latency_ms"],
        bare,
        "ms",
    )

    ours = profiler.benchmark_autoregressive(
        model,
        total_tokens=opts.decode_tokens,
        context_len=opts.seq_len,
        num_warmup=opts.warmup,
        num_iterations=opts.iterations,
    )
    bare = bare_decode_ms_per_token(model, tokens, opts.decode_tokens, opts.warmup, opts.iterations)
    row(
        f"decode tg{opts.decode_tokens}@d{opts.seq_len} per token vs bare loop",
        ours["median_latency_ms"] / opts.decode_tokens,
        bare,
        "ms/tok",
    )

    try:
        twin = mlx_lm_twin(model, args)
    except ImportError:
        print("mlx-lm comparison skipped: install the `lm` extra (pip install 'mlx-fleet[lm]')")
        return
    if opts.bits != 16:
        print("mlx-lm comparison runs on float16 weights only; rerun with --bits 16")
        return
    drift = mx.abs(twin(tokens) - model(tokens)).max().item()
    theirs = profiler.benchmark_autoregressive(
        twin,
        total_tokens=opts.decode_tokens,
        context_len=opts.seq_len,
        num_warmup=opts.warmup,
        num_iterations=opts.iterations,
    )
    row(
        "decode tok/s: our model vs mlx-lm llama",
        ours["tokens_per_sec"],
        theirs["tokens_per_sec"],
        "tok/s",
    )
    print(f"(same weights: max |logit difference| between the two models = {drift:.2e})")


if __name__ == "__main__":
    main()
