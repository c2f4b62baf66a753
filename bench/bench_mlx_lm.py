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

With no --model, Llama-shaped models with random float16 weights and a word-level tokenizer
are written to a temporary directory (mlx-lm's own llama, saved as its conversion saves it), by
default two shapes measured in the same rounds and printed side by side: 40m (8 layers, a 32k
vocabulary) and 16m (issue 26's: 4 layers, an 8k vocabulary), or Llama-3.2-1B's shape with
--shape 1b; --shape takes a comma-separated list.
Needs the `lm` extra (pip install -e '.[lm]').

    .venv/bin/python bench/bench_mlx_lm.py [--model DIR | --shape 40m,16m|1b] [-p 512] [-g 128]
        [--repeats 5] [--trials 3] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
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
LLAMA_16M = LLAMA | {"num_hidden_layers": 4, "vocab_size": 8192}
"""Issue 26's second shape: 4 layers, an 8k vocabulary (16M parameters), where a new user read
our pp 1.2-1.3x mlx-lm's from two separate runs. The work is the same; mlx-lm's prompt clock
also holds the queueing of its next decode step, a fixed cost that weighs more the cheaper the
prompt pass (docs/performance.md)."""
SHAPES = {"40m": LLAMA, "16m": LLAMA_16M, "1b": LLAMA_1B}
DEFAULT_SHAPES = "40m,16m"
QUICK_LLAMA = LLAMA | {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}
"""--quick: seconds, only checking that both tools still run and print their figures."""
QUICK_SHAPES = {
    "40m": QUICK_LLAMA,
    "16m": QUICK_LLAMA | {"num_hidden_layers": 1, "vocab_size": 500},
}
"""--quick's stand-in for each shape (1b's is 40m's)."""


def shape_list(text: str) -> list[str]:
    """--shape's comma-separated names, each one of SHAPES."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SHAPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown shape {', '.join(unknown) or text!r}: choose from {', '.join(SHAPES)}"
        )
    return list(dict.fromkeys(names))


def write_model(directory: Path, config: dict, eos: int = 0) -> None:
    """config.json, model.safetensors and a word-level tokenizer mlx-lm can load offline, `w<eos>`
    its end of text (at the vocabulary's size, a word the model never generates)."""
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
    vocab = {f"w{i}": i for i in range(max(config["vocab_size"], eos + 1))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": f"w{eos}"})
    )


def output_of(command: Sequence[str], env: dict[str, str]) -> str:
    """`command`'s stdout; BenchError with the end of its stderr when it fails."""
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        raise BenchError(
            f"{' '.join(command[:4])} ... exited {done.returncode}: {done.stderr.strip()[-500:]}"
        )
    return done.stdout


def benchmark_args(model: Path, prompt: int, generated: int, trials: int) -> list[str]:
    """`-m mlx_lm benchmark ...` as the interpreter takes it, here or behind mlx.launch
    (bench_distributed.py)."""
    command = ["-m", "mlx_lm", "benchmark", "--model", str(model)]
    return command + ["-p", str(prompt), "-g", str(generated), "-n", str(trials)]


def averages(stdout: str) -> tuple[float, float]:
    """(prompt_tps, generation_tps) from the "Averages" line `mlx_lm benchmark` prints (its
    rank 0 alone prints when distributed)."""
    found = AVERAGES.search(stdout)
    if found is None:
        raise BenchError(f"mlx_lm benchmark printed no averages: {stdout[-500:]}")
    return float(found.group(1)), float(found.group(2))


def mlx_lm(model: Path, prompt: int, generated: int, trials: int) -> tuple[float, float]:
    """(prompt_tps, generation_tps) as `mlx_lm benchmark` reports their averages."""
    command = [sys.executable, *benchmark_args(model, prompt, generated, trials)]
    return averages(output_of(command, {**os.environ, "HF_HUB_OFFLINE": "1"}))


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


def workload_options(
    doc: str, prompt_tokens: int, generation_tokens: int, timed_per: str
) -> argparse.ArgumentParser:
    """The options of a bench against mlx-lm: a model directory and pp<P>, tg<G> @ d<P>, each
    timed --trials times per `timed_per` in a round."""
    args = parser(doc)
    args.add_argument("--model", type=Path, help="an mlx-lm model directory (with tokenizer)")
    args.add_argument("-p", "--prompt-tokens", type=int, default=prompt_tokens)
    args.add_argument("-g", "--generation-tokens", type=int, default=generation_tokens)
    args.add_argument("--trials", type=int, default=3, help=f"timed runs per {timed_per} per round")
    return args


def parse_workload(args: argparse.ArgumentParser) -> argparse.Namespace:
    """workload_options()' options, parsed once mlx-lm is there to compare with; --quick
    shrinks the workload to seconds."""
    opts = args.parse_args()
    if importlib.util.find_spec("mlx_lm") is None:
        raise BenchError("mlx-lm is not installed: pip install -e '.[lm]'")
    if opts.quick:
        opts.prompt_tokens, opts.generation_tokens, opts.trials = 16, 4, 1
    return opts


def main() -> None:
    args = workload_options(__doc__.splitlines()[0], 512, 128, "tool")
    args.add_argument(
        "--shape",
        type=shape_list,
        default=shape_list(DEFAULT_SHAPES),
        help=f"the models written without --model, comma-separated: {', '.join(SHAPES)} "
        f"(default {DEFAULT_SHAPES})",
    )
    opts = parse_workload(args)
    configs = {name: SHAPES[name] for name in opts.shape}
    if opts.quick:
        configs = {name: QUICK_SHAPES.get(name, QUICK_LLAMA) for name in opts.shape}
    repeats = round_count(opts)
    p, g = opts.prompt_tokens, opts.generation_tokens
    print(f"machine: {machine()}")
    print(f"chip: {chip()}")
    with tempfile.TemporaryDirectory(prefix="bench-mlx-lm-") as scratch:
        models: dict[str, Path] = {}
        if opts.model is not None:
            models["model"] = opts.model
            print(f"model: {opts.model}")
        for name, config in configs.items() if opts.model is None else ():
            models[name] = Path(scratch) / name
            models[name].mkdir()
            write_model(models[name], config)
            print(f"model {name}: mlx-lm llama, random float16 weights, {json.dumps(config)}")
        print(f"pp{p} and tg{g} @ d{p}; {repeats} interleaved rounds, {opts.trials} trials each")
        home = Path(scratch) / "home"
        sides = {}
        for name, model in models.items():
            sides[f"ours {name}"] = ours(model, p, g, opts.trials, home)
            sides[f"mlx-lm {name}"] = theirs(model, p, g, opts.trials)
        rounds = interleave(sides, repeats)
    print(
        f"{'shape':<7} {'test':<14} {'ours tok/s':>22} {'mlx-lm tok/s':>22} {'ours / mlx-lm':>22}"
    )
    for index, test in enumerate((f"pp{p}", f"tg{g} @ d{p}")):
        for name in models:
            ours_figures = rounds.figures(f"ours {name}", index)
            theirs_figures = rounds.figures(f"mlx-lm {name}", index)
            ratios = rounds.ratios(f"ours {name}", f"mlx-lm {name}", index)
            figures = (
                spread(ours_figures, 1, 1),
                spread(theirs_figures, 1, 1),
                spread(ratios, 1, 3),
            )
            print(f"{name:<7} {test:<14}" + "".join(f" {figure:>22}" for figure in figures))
    print(
        f"target 0.95-1.05; tg from mlx-lm's counting alone (G-1)/G = {(g - 1) / g:.3f}; "
        "median (min-max) over the rounds, ratios round by round"
    )


def ours(model: Path, p: int, g: int, trials: int, home: Path) -> Callable[[], tuple]:
    """One round of our side: pp<p>, then tg<g> @ d<p> (mlx-lm generates after its prompt)."""
    return lambda: (
        agent_bench(model, ["-p", str(p), "-n", "0"], trials, home),
        agent_bench(model, ["-p", "0", "-n", str(g), "-d", str(p)], trials, home),
    )


def theirs(model: Path, p: int, g: int, trials: int) -> Callable[[], tuple]:
    """One round of mlx-lm's side: `mlx_lm benchmark -p P -g G -n T`."""
    return lambda: mlx_lm(model, p, g, trials)


if __name__ == "__main__":
    run(main)
