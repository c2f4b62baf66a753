"""Do our pp and tg agree with `mlx_lm benchmark` on the same model directory?

Each round runs both tools, in an order that rotates from round to round (bench/support.py: so
drift in the machine's speed and a neighbour's load hit both alike):
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
is written to a temporary directory (mlx-lm's own llama, saved as its conversion saves it):
40M parameters, or Llama-3.2-1B's shape with --shape 1b.
Needs the `lm` extra (pip install -e '.[lm]').

    .venv/bin/python bench/bench_mlx_lm.py [--model DIR | --shape 40m|1b] [-p 512] [-g 128]
        [--repeats 5] [--trials 3] [--quick]
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from support import BenchError, interleave, machine, parser, round_count, run, spread

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
"""About 40M parameters and a 32k vocabulary: the projection a full-logits prompt pass pays for
every position is a large share of its work, as in a real 1-3B model, so a pp that computed it
would show here."""
LLAMA_1B = LLAMA | {
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "rope_theta": 500000.0,
}
"""--shape 1b: Llama-3.2-1B's dimensions (1.24B parameters; its rope scaling left out), for a
machine with the memory and speed for it (a GPU)."""
SHAPES = {"40m": LLAMA, "1b": LLAMA_1B}
QUICK_LLAMA = LLAMA | {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}
"""--quick: seconds, only checking that both tools still run and print their figures."""


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
    command = [sys.executable, "-m", "agent", "bench", "--model", str(model), *matrix]
    command += ["-r", str(trials), "-w", "1", "-o", "json", "--no-cooling"]
    report = json.loads(output_of(command, {**os.environ, "MLX_FLEET_HOME": str(home)}))
    (cell,) = report["cells"]
    if cell.get("error"):
        raise BenchError(f"agent bench {cell['test']} failed: {cell['error']}")
    return cell["tokens_per_sec"]


def chip() -> str:
    """The chip, memory and mlx-lm version the figures come from (agent bench's own facts)."""
    from agent.profiling.machine import machine_info

    facts = machine_info()
    return (
        f"{facts['chip']} ({facts['backend']}), {facts['memory_gib']} GiB, "
        f"mlx-lm {facts['mlx_lm_version']}"
    )


def main() -> None:
    args = parser(__doc__.splitlines()[0])
    args.add_argument("--model", type=Path, help="an mlx-lm model directory (with tokenizer)")
    args.add_argument("-p", "--prompt-tokens", type=int, default=512)
    args.add_argument("-g", "--generation-tokens", type=int, default=128)
    args.add_argument("--trials", type=int, default=3, help="timed runs per tool per round")
    args.add_argument(
        "--shape", choices=list(SHAPES), default="40m", help="the model written without --model"
    )
    opts = args.parse_args()
    if importlib.util.find_spec("mlx_lm") is None:
        raise BenchError("mlx-lm is not installed: pip install -e '.[lm]'")
    config = SHAPES[opts.shape]
    if opts.quick:
        config, opts.prompt_tokens, opts.generation_tokens, opts.trials = QUICK_LLAMA, 16, 4, 1
    repeats = round_count(opts)
    p, g = opts.prompt_tokens, opts.generation_tokens
    print(f"machine: {machine()}")
    print(f"chip: {chip()}")
    with tempfile.TemporaryDirectory(prefix="bench-mlx-lm-") as scratch:
        model = opts.model
        if model is None:
            model = Path(scratch) / "model"
            model.mkdir()
            write_model(model, config)
            print(f"model: mlx-lm llama, random float16 weights, {json.dumps(config)}")
        else:
            print(f"model: {model}")
        print(f"pp{p} and tg{g} @ d{p}; {repeats} interleaved rounds, {opts.trials} trials each")
        home = Path(scratch) / "home"
        rounds = interleave(
            {
                "ours": lambda: (
                    agent_bench(model, ["-p", str(p), "-n", "0"], opts.trials, home),
                    agent_bench(model, ["-p", "0", "-n", str(g), "-d", str(p)], opts.trials, home),
                ),
                "mlx-lm": lambda: mlx_lm(model, p, g, opts.trials),
            },
            repeats,
        )
    print(f"{'test':<14} {'ours tok/s':>22} {'mlx-lm tok/s':>22} {'ours / mlx-lm':>22}")
    for index, test in enumerate((f"pp{p}", f"tg{g} @ d{p}")):
        ours, theirs = rounds.figures("ours", index), rounds.figures("mlx-lm", index)
        ratios = rounds.ratios("ours", "mlx-lm", index)
        figures = (spread(ours, 1, 1), spread(theirs, 1, 1), spread(ratios, 1, 3))
        print(f"{test:<14}" + "".join(f" {figure:>22}" for figure in figures))
    print(
        f"target 0.95-1.05; tg from mlx-lm's counting alone (G-1)/G = {(g - 1) / g:.3f}; "
        "median (min-max) over the rounds, ratios round by round"
    )


if __name__ == "__main__":
    run(main)
