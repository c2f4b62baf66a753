"""Does timing every token cost the engine anything? Our in-process serving cell against a bare
BatchGenerator loop on the same requests. Both sides drive mlx-lm's BatchGenerator with the same
closed loop (N clients, each sending its next request as its last completes) over the same
synthetic requests of the built-in model (as mlx-lm's llama holding its arrays,
agent.profiling.serving.llama_twin): the bare side only counts the tokens and reads the clock at
its start and end; ours is a ServingCell's timed pass, reading the clock at every token handed
over and keeping each request's stream. Figures are output tok/s (output tokens over the time
from the first request sent to the last token), median (min–max) over the rounds, the ratio
ours/bare taken round by round (target 0.95–1.05: the client's clock costs the engine nothing
measurable). docs/performance.md (Serving cells) holds the figures.

    .venv/bin/python bench/bench_serving.py [--config small] [--concurrency 4] [--requests 16]
        [--prompt 32] [--gen 32] [--repeats 5] [--quick]
"""

from __future__ import annotations

import time

from support import BenchError, interleave, machine, parser, round_count, run, spread

from agent.model import BUILTIN_CONFIGS, build_model
from agent.profiling.serving import ServingCell
from shared.benchmark.matrix import MatrixSpec, expand
from shared.benchmark.serving import ServingSpec
from shared.benchmark.serving_figures import Slo, serving_figures

BARE = "bare BatchGenerator"


def bare_loop(cell: ServingCell, clients: int, count: int) -> float:
    """The same requests through the same generator, the clock read twice: output tok/s."""
    requests = cell.requests(0, count)
    generator = cell.generator
    start = time.perf_counter()
    sent, done, tokens = 0, 0, 0
    for request in requests[:clients]:
        generator.insert([request.prompt], max_tokens=[request.max_tokens])
        sent += 1
    while done < len(requests):
        for response in generator.next()[1]:
            tokens += 1
            if response.finish_reason is not None:
                done += 1
                if sent < len(requests):
                    request = requests[sent]
                    generator.insert([request.prompt], max_tokens=[request.max_tokens])
                    sent += 1
    return tokens / (time.perf_counter() - start)


def our_pass(cell: ServingCell) -> float:
    """One timed pass of the serving cell: its output tok/s over its window."""
    cell.passes.clear()
    cell.run_pass(timed=True)
    slo = Slo(cell.serving.slo_ttft_ms, cell.serving.slo_tpot_ms)
    rate = serving_figures(cell.passes[0], slo).output_tok_s
    if rate is None:
        raise BenchError("the serving pass timed no token")
    return rate


def main() -> None:
    args = parser(__doc__.splitlines()[0])
    args.add_argument("--config", choices=list(BUILTIN_CONFIGS), default="small")
    args.add_argument("--concurrency", type=int, default=4)
    args.add_argument("--requests", type=int, default=16)
    args.add_argument("--prompt", type=int, default=32)
    args.add_argument("--gen", type=int, default=32)
    opts = args.parse_args()
    if opts.quick:
        opts.requests, opts.prompt, opts.gen = 4, 8, 4
    repeats = round_count(opts, default=5)
    serving = ServingSpec(concurrency=(opts.concurrency,), requests=opts.requests)
    spec = MatrixSpec(
        n_prompt=(opts.prompt,), n_gen=(opts.gen,), models=(opts.config,), serving=serving
    )
    (cell_spec,) = expand(spec)
    model = build_model(BUILTIN_CONFIGS[opts.config](), bits=16)
    cell = ServingCell(model, cell_spec, spec)
    c, n = opts.concurrency, opts.requests
    print(f"{opts.config} model, f16, serve c{c}: {n} requests of pp{opts.prompt}+tg{opts.gen}")
    print(f"machine: {machine()}; {repeats} rounds")
    try:
        cell.run_pass(timed=False)  # warm: kernels compiled before either side is timed
        sides = {BARE: lambda: bare_loop(cell, c, n), "serving cell": lambda: our_pass(cell)}
        rounds = interleave(sides, repeats)
    finally:
        cell.close()
    print(f"{'side':<22} {'output tok/s':>26} {'ratio to bare':>22}")
    for name in sides:
        ratio = "" if name == BARE else spread(rounds.ratios(name, BARE), 1, 3)
        print(f"{name:<22} {spread(rounds.figures(name), 1, 1):>26} {ratio:>22}")


if __name__ == "__main__":
    run(main)
