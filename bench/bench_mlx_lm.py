"""Do our pp and tg agree with `mlx_lm benchmark` on the same model directory?

Each round runs, in an order that rotates from round to round (so drift in the machine's speed
and a neighbour's load hit both alike):
  - `python -m mlx_lm benchmark --model DIR -p P -g G -n T` (its prompt_tps and generation_tps,
    which mlx_lm/benchmark.py averages over T trials after one warm-up), and
  - `agent bench --model DIR -p P -n 0 -r T -w 1` (pp<P>) and `agent bench --model DIR -p 0
    -n G -d P -r T -w 1` (tg<G> @ d<P>: mlx-lm generates after its P-token prompt),
and prints each figure as median (min-max) over the rounds, with the ratio ours / mlx-lm taken
round by round. The target is 0.95-1.05 for both.

mlx-lm's generation_tps counts G tokens over the time of the G-1 steps after the first token
(mlx_lm/generate.py stream_generate restarts its clock when the first token arrives), where ours
counts G tokens over G steps: the tg ratio expected from the counting alone is (G-1)/G (0.992 at
G = 128), printed beside it.

With no --model, a Llama-shaped model with random float16 weights and a word-level tokenizer
is written to a temporary directory (mlx-lm's own llama, saved as its conversion saves it).
Needs the `lm` extra (pip install -e '.[lm]').

    .venv/bin/python bench/bench_mlx_lm.py [--model DIR] [-p 512] [-g 128] [--rounds 5]
        [--trials 3] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

AVERAGES = re.compile(r"Averages: prompt_tps=([\d.]+), generation_tps=([\d.]+)")
LLAMA = {
    "model_type": "llama",
    "hidden_size": 512,
    "num_hidden_layers": 8,
    "intermediate_size": 1408,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-5,
    "vocab_size": 32000,
    "tie_word_embeddings": True,
}
"""About 36M parameters and a 32k vocabulary: the projection a full-logits prompt pass pays for
every position is a large share of its work, as in a real 1-3B model, so a pp that computed it
would show here."""
QUICK_LLAMA = LLAMA | {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}
"""--quick: seconds, only checking that both tools still run and print their figures."""


class BenchError(RuntimeError):
    """A side that could not be measured; the message says why."""


def write_model(directory: Path, config: dict) -> None:
    """config.json, model.safetensors and a word-level tokenizer mlx-lm can load offline."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = llama.Model(llama.ModelArgs.from_dict(config))
    model.set_dtype(mx.float16)
    mx.eval(model.parameters())
    mx.save_safetensors(
        str(directory / "model.safetensors"), dict(tree_flatten(model.parameters()))
    )
    (directory / "config.json").write_text(json.dumps(config))
    vocab = {f"w{i}": i for i in range(config["vocab_size"])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "w0"})
    )


def output_of(command: Sequence[str], env: dict[str, str]) -> str:
    """`command`'s stdout; BenchError with the end of its stderr when it fails."""
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        raise BenchError(
            f"{' '.join(command[:4])} ... exited {done.returncode}: {done.stderr.strip()[-500:]}"
        )
    return done.stdout


def mlx_lm(model: Path, prompt: int, generated: int, trials: int) -> tuple[float, float]:
    """(prompt_tps, generation_tps) as `mlx_lm benchmark` reports their averages."""
    command = [sys.executable, "-m", "mlx_lm", "benchmark", "--model", str(model)]
    command += ["-p", str(prompt), "-g", str(generated), "-n", str(trials)]
    stdout = output_of(command, {**os.environ, "HF_HUB_OFFLINE": "1"})
    found = AVERAGES.search(stdout)
    if found is None:
        raise BenchError(f"mlx_lm benchmark printed no averages: {stdout[-500:]}")
    return float(found.group(1)), float(found.group(2))


def agent_bench(model: Path, matrix: list[str], trials: int, home: Path) -> float:
    """tok/s of the one cell `agent bench --model DIR MATRIX` measures."""
    agent = Path(sys.executable).with_name("agent")
    command = [str(agent), "bench", "--model", str(model), *matrix]
    command += ["-r", str(trials), "-w", "1", "-o", "json", "--no-cooling"]
    report = json.loads(output_of(command, {**os.environ, "MLX_FLEET_HOME": str(home)}))
    (cell,) = report["cells"]
    if cell.get("error"):
        raise BenchError(f"agent bench {cell['test']} failed: {cell['error']}")
    return cell["tokens_per_sec"]


def spread(values: Sequence[float], digits: int = 1) -> str:
    """`median (min-max)`."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid:.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def machine() -> str:
    """The chip, cores, memory and versions the figures come from (agent bench's own facts)."""
    from agent.machine import machine_info

    facts = machine_info()
    return (
        f"{facts['chip']} ({facts['backend']}), {facts['cpu_count']} cores, "
        f"{facts['memory_gib']} GiB, {facts['os']}, Python {facts['python']}, "
        f"MLX {facts['mlx_version']}, mlx-lm {facts['mlx_lm_version']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, help="an mlx-lm model directory (with tokenizer)")
    parser.add_argument("-p", "--prompt-tokens", type=int, default=512)
    parser.add_argument("-g", "--generation-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--trials", type=int, default=3, help="timed runs per tool per round")
    parser.add_argument("--quick", action="store_true", help="seconds: checks the script runs")
    opts = parser.parse_args()
    if importlib.util.find_spec("mlx_lm") is None:
        raise BenchError("mlx-lm is not installed: pip install -e '.[lm]'")
    config = LLAMA
    if opts.quick:
        config, opts.prompt_tokens, opts.generation_tokens = QUICK_LLAMA, 16, 4
        opts.rounds, opts.trials = 1, 1
    p, g = opts.prompt_tokens, opts.generation_tokens
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="bench-mlx-lm-") as scratch:
        model = opts.model
        if model is None:
            model = Path(scratch) / "model"
            model.mkdir()
            write_model(model, config)
            print(f"model: mlx-lm llama, random float16 weights, {json.dumps(config)}")
        else:
            print(f"model: {model}")
        print(
            f"pp{p} and tg{g} @ d{p}; {opts.rounds} rounds of {opts.trials} trials per tool",
            flush=True,
        )
        home = Path(scratch) / "home"
        sides: dict[str, Callable[[], tuple[float, ...]]] = {
            "mlx-lm": lambda: mlx_lm(model, p, g, opts.trials),
            "ours": lambda: (
                agent_bench(model, ["-p", str(p), "-n", "0"], opts.trials, home),
                agent_bench(model, ["-p", "0", "-n", str(g), "-d", str(p)], opts.trials, home),
            ),
        }
        figures: dict[str, list[tuple[float, ...]]] = {name: [] for name in sides}
        for index in range(opts.rounds):
            names = list(sides)[index % 2 :] + list(sides)[: index % 2]
            for name in names:
                figures[name].append(sides[name]())
            (pp, tg), (lm_pp, lm_tg) = figures["ours"][-1], figures["mlx-lm"][-1]
            print(
                f"round {index + 1} ({' first, '.join(names)} second): pp {pp:.1f} vs "
                f"{lm_pp:.1f}, tg {tg:.1f} vs {lm_tg:.1f} tok/s",
                flush=True,
            )
    print(f"{'test':<14} {'ours tok/s':>22} {'mlx-lm tok/s':>22} {'ours / mlx-lm':>22}")
    for column, test in ((0, f"pp{p}"), (1, f"tg{g} @ d{p}")):
        ours = [values[column] for values in figures["ours"]]
        theirs = [values[column] for values in figures["mlx-lm"]]
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        print(f"{test:<14} {spread(ours):>22} {spread(theirs):>22} {spread(ratios, 3):>22}")
    print(
        f"target 0.95-1.05; tg from mlx-lm's counting alone (G-1)/G = {(g - 1) / g:.3f}; "
        "ratios median (min-max) over rounds"
    )


if __name__ == "__main__":
    try:
        main()
    except BenchError as exc:
        sys.exit(f"bench failed: {exc}")
