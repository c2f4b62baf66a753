"""Does our serving client agree with mlx-lm's server benchmark against the same mlx_lm.server?

One mlx_lm.server serves a model directory (agent.profiling.mlx_lm_server: a free port, ready
once it streams an answer). Each round, in an order that rotates from round to round
(bench/support.py), the same load goes to it twice:
  - ours: agent.profiling.http_load's closed loop of C clients sending R requests for M tokens
    each, timed by our client; its figures from shared.benchmark.serving_figures;
  - mlx-lm's: `python server_benchmark.py --url URL --concurrency C --total-requests R
    --max-tokens M --prompt-file FILE --output OUT` (ml-explore/mlx-lm,
    benchmarks/server_benchmark.py: not in the mlx-lm package; give its path with
    --server-benchmark or MLX_LM_SERVER_BENCHMARK; it needs aiohttp and tqdm), read from OUT;
and prints mean TTFT and aggregate output tok/s of each, median (min-max) over the rounds, with
the ratio ours / mlx-lm taken round by round. The target is 0.9-1.1 for both.

The two aggregate throughputs are not one estimator: ours is every output token over the
window from the first request sent to the last token received; mlx-lm's is the median over its
0.1 s bins of the token rate in the 1 s before each (its tokens_per_second), a steady-state rate
that leaves out the ramp at the start and the tail at the end. Both count a streamed chunk as a
token: with the word-level tokenizer written here every chunk is one token.

With no --model, a Llama-shaped model (4 layers, hidden 256, 8k vocabulary) with random
float16 weights and a word-level tokenizer whose end of text the model never generates is
written to a temporary directory, so every answer runs to M tokens.

    .venv/bin/python bench/bench_serve_http.py [--model DIR] [--server-benchmark PATH]
        [-c 4] [--requests 32] [-m 64] [--prompt-words 32] [--repeats 5] [--quick]
"""

from __future__ import annotations

import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench_mlx_lm import LLAMA_16M, QUICK_LLAMA, write_model
from support import BenchError, interleave, machine, parser, round_count, run, spread

from agent.profiling.http_load import HttpRequest, send_load
from agent.profiling.mlx_lm_server import MlxLmServer
from agent.profiling.openai_client import ServeUrl
from shared.benchmark.openai_stream import DEFAULT_MODEL
from shared.benchmark.serving_figures import SLO_PRESETS, serving_figures

ENVIRONMENT = "MLX_LM_SERVER_BENCHMARK"
LLAMA_SERVE = LLAMA_16M | {
    "hidden_size": 256,
    "intermediate_size": 704,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
"""bench_mlx_lm's 16m at half its width (4 layers, an 8k vocabulary, 3M parameters): a run of
the default load takes seconds, so many interleaved rounds fit while a shared machine's load
drifts, and still long enough for mlx-lm's 1 s moving window."""


class Prompts:
    """Fresh prompts for every run: `words` random words of the tokenizer written here (one
    token each), never sent before, so no request finds its prompt, or another's, in the
    server's prompt cache (mlx_lm.server keeps the last 10): each side's TTFT holds a whole
    prefill, never the other side's cached one."""

    def __init__(self, words: int, vocab: int) -> None:
        self.words, self.vocab = words, vocab
        self.draw = random.Random(46)

    def take(self, count: int) -> list[str]:
        return [
            " ".join(f"w{self.draw.randrange(1, self.vocab)}" for _ in range(self.words))
            for _ in range(count)
        ]


def children_cpu_s() -> float:
    """CPU seconds (user and system) of this process's ended children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def binned_median_rate(times: list[float]) -> float:
    """mlx-lm's server_benchmark.py aggregate rate, restated: 0.1 s bins laid from the whole
    second before the first token to the whole second after the last (floor and ceil of the
    clock's seconds), the tokens of the (up to) 10 bins ending at each bin over their span, and
    the median of those rates over every bin."""
    ordered = sorted(times)
    start, stop = math.floor(ordered[0]), math.ceil(ordered[-1])
    count = int(stop - start) * 10
    bins = [0] * count
    for when in ordered:
        bins[min(int(count * (when - start) / (stop - start)), count - 1)] += 1
    rates = []
    for index in range(count):
        window = bins[max(0, index - 9) : index + 1]
        rates.append(10 * sum(window) / len(window))
    return statistics.median(rates)


def ours(
    url: ServeUrl, prompts: Prompts, clients: int, requests: int, tokens: int
) -> Callable[[], tuple[float, float, float, float, float]]:
    """One run of our side: (mean TTFT s, aggregate output tok/s, the same again: our aggregate
    is over the window, mlx-lm's estimator on our token times, and our CPU seconds)."""

    def measure() -> tuple[float, float, float, float, float]:
        load = [HttpRequest(text, tokens) for text in prompts.take(requests)]
        cpu = time.process_time()  # nothing else runs in this process meanwhile
        timings = send_load(url, DEFAULT_MODEL, load, clients, None, None)
        cpu = time.process_time() - cpu
        failed = [t.error for t in timings if t.error is not None]
        if failed or len(timings) != requests:
            raise BenchError(f"ours: {len(failed)} of {requests} requests failed: {failed[:1]}")
        figures = serving_figures(timings, SLO_PRESETS["conversational"])
        if figures.ttft_ms is None or figures.output_tok_s is None:
            raise BenchError("ours: no figure")
        arrivals = [
            when for t in timings if t.first_token_s for when in (t.first_token_s, *t.later_token_s)
        ]
        rate = figures.output_tok_s
        return figures.ttft_ms.mean / 1000, rate, rate, binned_median_rate(arrivals), cpu

    return measure


def theirs(
    script: Path, url: ServeUrl, prompts: Prompts, clients: int, requests: int, tokens: int
) -> Callable[[], tuple[float, float, float, float, float]]:
    """One run of mlx-lm's side, its prompt file one fresh prompt per request: its mean TTFT
    (s), aggregate_tokens_per_sec, its total_tokens over its total_time (from its first request
    sent to its last token: our window), aggregate_tokens_per_sec again, and its CPU seconds."""

    def measure() -> tuple[float, float, float, float, float]:
        with tempfile.TemporaryDirectory(prefix="server-benchmark-") as scratch:
            out, prompt_file = Path(scratch) / "out.json", Path(scratch) / "prompts.txt"
            prompt_file.write_text("".join(f"{text}\n" for text in prompts.take(requests)))
            command = [
                sys.executable, str(script), "--url", str(url), "--model", DEFAULT_MODEL,
                "--concurrency", str(clients), "--total-requests", str(requests),
                "--max-tokens", str(tokens), "--prompt-file", str(prompt_file),
                "--output", str(out),
            ]  # fmt: skip
            cpu = children_cpu_s()
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
            cpu = children_cpu_s() - cpu
            if done.returncode != 0 or not out.exists():
                raise BenchError(
                    f"server_benchmark.py exited {done.returncode}: {done.stderr[-800:]}"
                )
            result = json.loads(out.read_text())
        if result["successful_requests"] != requests:
            raise BenchError(f"mlx-lm: {result['failed_requests']} of {requests} requests failed")
        return (
            result["aggregate_metrics"]["time_to_first_token"]["avg"],
            result["aggregate_tokens_per_sec"],
            result["total_tokens"] / result["total_time"],
            result["aggregate_tokens_per_sec"],
            cpu,
        )

    return measure


def main() -> None:
    args = parser(__doc__.splitlines()[0])
    args.add_argument("--model", type=Path, help="an mlx-lm model directory (with tokenizer)")
    args.add_argument(
        "--server-benchmark",
        type=Path,
        default=os.environ.get(ENVIRONMENT),
        help=f"mlx-lm's benchmarks/server_benchmark.py (default ${ENVIRONMENT})",
    )
    args.add_argument("-c", "--concurrency", type=int, default=4)
    args.add_argument("--requests", type=int, default=32, help="requests per side per round")
    args.add_argument("-m", "--max-tokens", type=int, default=64)
    args.add_argument("--prompt-words", type=int, default=32)
    opts = args.parse_args()
    if opts.server_benchmark is None or not opts.server_benchmark.is_file():
        raise BenchError(
            f"give mlx-lm's benchmarks/server_benchmark.py with --server-benchmark or "
            f"${ENVIRONMENT} (it is not in the mlx-lm package)"
        )
    config = LLAMA_SERVE
    if opts.quick:
        config = QUICK_LLAMA
        opts.requests, opts.max_tokens, opts.prompt_words = 4, 8, 8
    repeats = round_count(opts)
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="bench-serve-http-") as scratch:
        model = opts.model
        if model is None:
            model = Path(scratch) / "model"
            model.mkdir()
            write_model(model, config, eos=config["vocab_size"])
            print(f"model: mlx-lm llama, random float16 weights, {json.dumps(config)}")
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        prompts = Prompts(opts.prompt_words, vocab)
        c, n, m = opts.concurrency, opts.requests, opts.max_tokens
        print(
            f"concurrency {c}, {n} requests of {opts.prompt_words} words for {m} tokens, fresh "
            f"prompts each run; {repeats} interleaved rounds after one warm-up run; mlx-lm's "
            f"script: {opts.server_benchmark}"
        )
        with MlxLmServer(str(model)) as server:
            sides = {
                "ours": ours(server.url, prompts, c, n, m),
                "mlx-lm": theirs(opts.server_benchmark, server.url, prompts, c, n, m),
            }
            sides["ours"]()  # warm-up: the server's first batches compile and allocate
            rounds = interleave(sides, repeats)
    print(f"{'figure':<23} {'ours':>22} {'mlx-lm':>22} {'ours / mlx-lm':>22}")
    rows = (
        ("mean TTFT ms", 1000, 1),
        ("aggregate tok/s", 1, 1),
        ("tok/s over the window", 1, 1),
        ("tok/s, 1 s bins' median", 1, 1),
        ("client CPU s", 1, 2),
    )
    for index, (name, scale, digits) in enumerate(rows):
        theirs_figures = rounds.figures("mlx-lm", index)
        ratio = "unavailable (mlx-lm read 0)"
        if all(theirs_figures):  # its binned median reads 0 on a run shorter than its bins
            ratio = spread(rounds.ratios("ours", "mlx-lm", index), 1, 3)
        figures = (
            spread(rounds.figures("ours", index), scale, digits),
            spread(theirs_figures, scale, digits),
            ratio,
        )
        print(f"{name:<23}" + "".join(f" {figure:>22}" for figure in figures))
    met = all(
        all(rounds.figures("mlx-lm", index))
        and 0.9 <= statistics.median(rounds.ratios("ours", "mlx-lm", index)) <= 1.1
        for index in range(2)
    )
    print(
        f"target 0.9-1.1 on the first two: {'met' if met else 'NOT met'}; median (min-max) over "
        "the rounds, ratios round by round; the window row takes mlx-lm's total_tokens / "
        "total_time, our aggregate's estimator; the bins row takes our token times through "
        "mlx-lm's estimator; client CPU: ours its threads', mlx-lm's its whole process's "
        "(its interpreter's start and imports too)"
    )


if __name__ == "__main__":
    run(main)
