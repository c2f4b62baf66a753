"""Does an idle gap before a timed iteration slow decode, and does the re-warm undo it? Decode
(tg) on a built-in model, three sides in every round, interleaved: no gap between iterations;
a gap (2 s) before each timed iteration with the profiler's re-warm on (one untimed iteration
after a gap past agent.profiling.speed.REWARM_GAP_S); the same gap with the re-warm off.
Figures are median (min–max) decode tok/s over the rounds, ratios taken round by round against
no gap; "within spread" says whether the gap side's median lies inside the no-gap side's
min–max over all its timed iterations.

On macOS the GPU's wired memory is let go after about a second idle and the next decode runs
several times slower (llama.cpp PR #10119, issue #17766): there the re-warm-off side shows the
cost and the re-warm-on side should match no gap. On Linux CPU there is no such effect: all three
agree, which shows only that the re-warm costs the figures nothing (docs/performance.md).

    .venv/bin/python bench/bench_idle_gap.py [--config small|full] [--bits 16]
        [--decode-tokens 32] [--gap-s 2] [--repeats 3] [--quick]
"""

from __future__ import annotations

import math
import statistics
import time

from support import (
    BenchError,
    interleave,
    machine,
    parse_model_options,
    parser,
    round_count,
    run,
    spread,
)

from agent.model import BUILTIN_CONFIGS, build_model
from agent.profiling import SpeedProfiler


def decode_side(model, tokens: int, warmup: int, iterations: int, gap_s: float, rewarm: bool):
    """One measurement: decode tok/s per timed iteration, and the re-warms it ran."""
    samples: list[float] = []
    rewarms: list[int] = []

    def gate(step: int) -> None:
        if gap_s and step >= warmup:
            time.sleep(gap_s)  # idle, as a cooling pause is

    def side() -> float:
        profiler = SpeedProfiler(before_iteration=gate)
        if not rewarm:
            profiler.rewarm_gap_s = math.inf
        result = profiler.benchmark_autoregressive(
            model, total_tokens=tokens, num_warmup=warmup, num_iterations=iterations
        )
        samples.extend(tokens * 1000 / ms for ms in result["samples_ms"])
        rewarms.append(result["rewarm_iterations"])
        return result["tokens_per_sec"]

    return side, samples, rewarms


def main() -> None:
    args = parser(__doc__.splitlines()[0])
    args.add_argument("--gap-s", type=float, default=2.0)
    opts = parse_model_options(args, iterations=3)
    repeats = round_count(opts, default=3)
    model = build_model(BUILTIN_CONFIGS[opts.config](), bits=opts.bits)
    g, w, i = opts.decode_tokens, opts.warmup, opts.iterations
    print(f"{opts.config} model, {opts.bits} bits, tg{g}, -w {w} -r {i}; {repeats} rounds")
    print(f"machine: {machine()}")
    sides, samples, rewarms = {}, {}, {}
    for name, gap, rewarm in (
        ("no gap", 0.0, True),
        (f"{opts.gap_s:g} s gap, re-warm on", opts.gap_s, True),
        (f"{opts.gap_s:g} s gap, re-warm off", opts.gap_s, False),
    ):
        sides[name], samples[name], rewarms[name] = decode_side(model, g, w, i, gap, rewarm)
    rounds = interleave(sides, repeats)
    base = "no gap"
    low, high = min(samples[base]), max(samples[base])
    print(f"{'side':<28} {'decode tok/s':>24} {'ratio to no gap':>20} {'re-warms':>9}  spread")
    for name in sides:
        figures = rounds.figures(name)
        if not all(figures):
            raise BenchError(f"{name}: no decode rate was measured")
        within = low <= statistics.median(figures) <= high
        ratio = spread(rounds.ratios(name, base))
        print(
            f"{name:<28} {spread(figures, 1, 1):>24} {ratio:>20} {sum(rewarms[name]):>9}  "
            f"{'within' if within else 'outside'} no gap's {low:.1f}–{high:.1f}"
        )


if __name__ == "__main__":
    run(main)
