"""Is our profiler's clock honest, is our model as fast as mlx-lm's, and what does a matrix cost
beyond what it times? Each comparison runs both sides in every round, interleaved, repeated;
figures are median (min–max) over the rounds, ratios taken round by round (1.00 = identical).

  1. our prompt processing (pp) latency vs a bare prompt pass as mlx-lm's generate_step makes
     it, on the same model;
  2. our decode time per token vs a bare greedy loop through the same KV cache, queued with
     `mx.async_eval` as mlx-lm's generator does;
  3. our model's decode tok/s vs mlx-lm's llama with identical dimensions and weights, both
     timed by our profiler (when the `lm` extra is installed, float16 only);
  4. a whole matrix through the runner (`agent bench`'s path, imports done; pp at the sequence
     length and twice it, and tg64, each at depth 0 and at the sequence length, -r 5): its
     wall time against the sum of the iterations it times plus one model build, with no
     warm-up iterations (-w 0, so that every iteration is timed and all the rest is the
     harness's own cost: token generation, a depth filled once per cell and its cache copies,
     clearing MLX's cache).

    .venv/bin/python bench/bench_profiling.py [--config small|full] [--bits 16] [--seq-len 128]
        [--decode-tokens 32] [--repeats 5] [--quick]
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx
from support import interleave, machine, parse_model_options, parser, round_count, run, spread

from agent.model import BUILTIN_CONFIGS, build_model
from agent.profiling import SpeedProfiler
from agent.profiling.memory import random_tokens
from agent.profiling.runner import run_matrix
from agent.profiling.serving import llama_twin
from agent.profiling.speed import new_cache
from shared.benchmark.matrix import MatrixSpec, count_cells


def bare_prefill_samples(model, tokens: mx.array, warmup: int, iterations: int) -> list[float]:
    """Seconds of each timed bare prompt pass, as mlx-lm's generate_step makes it: all but the
    last token into a fresh cache (one step: the prompt is shorter than its 2048), evaluating
    the cache only, then the last token's logits; after `warmup` untimed ones."""
    samples = []
    for step in range(warmup + iterations):
        cache = new_cache(model)
        start = time.perf_counter()
        model(tokens[:, :-1], cache=cache)
        mx.eval([layer.state for layer in cache])
        mx.eval(mx.argmax(model(tokens[:, -1:], cache=cache)[:, -1, :], axis=-1))
        if step >= warmup:
            samples.append(time.perf_counter() - start)
    return samples


def bare_decode_samples(
    model, context: mx.array, tokens: int, warmup: int, iterations: int
) -> list[float]:
    """Seconds of each timed decode: prefill (untimed), then `tokens` greedy steps queued with
    async_eval, one final eval."""
    samples = []
    for step in range(warmup + iterations):
        cache = new_cache(model)
        token = mx.argmax(model(context, cache=cache)[:, -1, :], axis=-1)
        mx.eval(token, [layer.state for layer in cache])
        start = time.perf_counter()
        for _ in range(tokens):
            token = mx.argmax(model(token[:, None], cache=cache)[:, -1, :], axis=-1)
            mx.async_eval(token)
        mx.eval(token)
        if step >= warmup:
            samples.append(time.perf_counter() - start)
    return samples


def bare_prefill_s(model, tokens: mx.array, warmup: int, iterations: int) -> float:
    return statistics.median(bare_prefill_samples(model, tokens, warmup, iterations))


def bare_decode_s_per_token(
    model, context: mx.array, tokens: int, warmup: int, iterations: int
) -> float:
    samples = bare_decode_samples(model, context, tokens, warmup, iterations)
    return statistics.median(samples) / tokens


def mlx_lm_twin(ours):
    """mlx-lm's llama with our dimensions, holding our very weights; None without mlx-lm."""
    try:
        twin = llama_twin(ours)
    except ImportError:
        return None
    mx.eval(twin.parameters())
    return twin


def matrix_overhead(config: str, bits: int, spec: MatrixSpec) -> float:
    """The runner's wall time over (the sum of its timed iterations + one build)."""
    began = time.perf_counter()
    build_model(BUILTIN_CONFIGS[config](), bits=bits)
    build = time.perf_counter() - began
    began = time.perf_counter()
    records = list(run_matrix(spec))
    wall = time.perf_counter() - began
    timed = sum(sum(record["samples_ms"]) for record in records) / 1000
    return wall / (timed + build)


def main() -> None:
    args = parser(__doc__.splitlines()[0])
    args.add_argument("--seq-len", type=int, default=128)
    opts = parse_model_options(args, iterations=5)
    if opts.quick:
        opts.seq_len = 16
    repeats = round_count(opts)
    config = BUILTIN_CONFIGS[opts.config]()
    model = build_model(config, bits=opts.bits)
    tokens = random_tokens(model, 1, opts.seq_len)
    mx.eval(tokens)
    profiler = SpeedProfiler()
    w, i, n, g = opts.warmup, opts.iterations, opts.seq_len, opts.decode_tokens
    print(f"{opts.config} model, {opts.bits} bits; {repeats} interleaved rounds")
    print(f"machine: {machine()}")

    def ours_decode(target) -> float:
        result = profiler.benchmark_autoregressive(target, g, n, w, i)
        return result["median_latency_ms"] / 1000 / g

    sides = {
        "prefill ours": lambda: (
            profiler.benchmark_tokens_per_sec(model, n, w, i)["median_latency_ms"] / 1000
        ),
        "prefill bare": lambda: bare_prefill_s(model, tokens, w, i),
        "decode ours": lambda: ours_decode(model),
        "decode bare": lambda: bare_decode_s_per_token(model, tokens, g, w, i),
    }
    twin = mlx_lm_twin(model) if opts.bits == 16 else None
    if twin is not None:
        sides["decode mlx-lm"] = lambda: ours_decode(twin)
    # -r 5 as agent bench's default, tg64, but -w 0: then every iteration is timed
    matrix_tokens = g if opts.quick else 64
    spec = MatrixSpec(
        n_prompt=(n, 2 * n),
        n_gen=(matrix_tokens,),
        n_depth=(0, n),
        models=(opts.config,),
        bits=(opts.bits,),
        warmup=0,
        iterations=i,
    )
    sides["matrix"] = lambda: matrix_overhead(opts.config, opts.bits, spec)
    rounds = interleave(sides, repeats)
    values = rounds.values
    print(f"{'measurement':<46} {'ours':>24} {'reference':>24} {'ratio':>20}")
    for label, ours, reference, scale, unit in (
        (f"prompt pp{n} vs bare prompt pass", "prefill ours", "prefill bare", 1000, "ms"),
        (f"decode tg{g}@d{n} per token vs bare loop", "decode ours", "decode bare", 1000, "ms"),
    ):
        print(
            f"{label:<46} {spread(values[ours], scale) + ' ' + unit:>24} "
            f"{spread(values[reference], scale) + ' ' + unit:>24} "
            f"{spread(rounds.ratios(ours, reference)):>20}"
        )
    if twin is None:
        print("decode vs mlx-lm: skipped (needs the `lm` extra and --bits 16)")
    else:
        drift = mx.abs(twin(tokens) - model(tokens)).max().item()
        speed = rounds.ratios("decode mlx-lm", "decode ours")  # tok/s ours / tok/s theirs
        print(
            f"{'decode tok/s: our model vs mlx-lm llama':<46} "
            f"{spread([1 / s for s in values['decode ours']], 1, 1) + ' tok/s':>24} "
            f"{spread([1 / s for s in values['decode mlx-lm']], 1, 1) + ' tok/s':>24} "
            f"{spread(speed):>20}"
        )
        print(f"(same weights: max |logit difference| between the two models = {drift:.2e})")
    cells = count_cells(spec)
    print(
        f"{f'matrix wall / (timed + 1 build), {cells} cells':<46} {'':>24} {'':>24} "
        f"{spread(values['matrix']):>20}"
    )


if __name__ == "__main__":
    run(main)
