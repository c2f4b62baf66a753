"""Does a group's cell in `coordinator benchmark` agree with mlx-lm's own distributed benchmark?

Two real `agent serve` processes on loopback (127.0.0.2 and 127.0.0.3, each its own data dir,
CURVE keys exchanged, as bench_netbench.py starts them) and one mlx-lm model directory on the
disk both read. Each round runs three sides, in an order that rotates from round to round
(bench/support.py):
  - ours: `coordinator benchmark --hosts A+B --model DIR -p P -n 0 -r T -w 1` (the group's
    pp<P>) and `-p 0 -n G -d P -r T -w 1` (tg<G> @ d<P>: mlx-lm generates after its P-token
    prompt), each agent running one rank of MLX's ring backend; the group's cell is rank 0's;
  - mlx-lm's: `mlx.launch --backend ring --hostfile H -- -m mlx_lm benchmark --model DIR -p P
    -g G -n T` with H naming the same two loopback addresses (both ranks on this machine,
    mlx.launch starts a rank locally when its ssh host is 127.0.0.1), which loads the model
    with mlx_lm's sharded_load (tensor-parallel, or --pipeline) and prints rank 0's averages
    over T trials after one warm-up;
  - the same `mlx_lm benchmark` on two ranks started by hand with mlx.launch's environment,
    which shows what mlx.launch's own busy I/O threads cost the ranks (by_hand).
Each figure prints as median (min-max) over the rounds, and the ratios ours / each mlx-lm side
round by round, target 0.95-1.05. mlx-lm's generation_tps counts G tokens over the G-1 steps
after the first (bench_mlx_lm.py): the tg ratio expected from counting alone is (G-1)/G.

With no --model, the 16m Llama shape of bench_mlx_lm.py (4 layers, an 8k vocabulary, random
float16 weights, a word-level tokenizer) is written to a temporary directory. Needs the `lm`
extra (pip install -e '.[lm]').

    .venv/bin/python bench/bench_distributed.py [--model DIR] [-p 128] [-g 32] [--trials 3]
        [--sharding tensor|pipeline] [--repeats 3] [--quick]
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack, suppress
from pathlib import Path

from bench_mlx_lm import (
    LLAMA_16M,
    QUICK_SHAPES,
    averages,
    benchmark_args,
    chip,
    parse_workload,
    workload_options,
    write_model,
)
from bench_netbench import ADDRESSES, agent_with_key_added, free_run
from support import (
    BenchError,
    interleave,
    machine,
    require_loopback,
    round_count,
    run,
    spread,
)

from shared.distributed.group import SHARDINGS
from shared.distributed.rank_env import RING, Member, rank_launch

BIN = Path(sys.executable).parent
TIMEOUT_S = 1800
"""The most one side's command may take before the bench gives up on it."""


def run_session(command: Sequence[str], env: dict[str, str]) -> str:
    """`command`'s stdout, run in its own session so that every process it starts (mlx.launch's
    ranks) is killed with it, however it ends; BenchError when it fails."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BenchError(f"{' '.join(command[:3])} ... ran past {TIMEOUT_S} s") from None
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    if process.returncode:
        raise BenchError(
            f"{' '.join(command[:3])} ... exited {process.returncode}: {stderr.strip()[-600:]}"
        )
    return stdout


def group_cell(
    hosts: list[str], model: Path, matrix: list[str], trials: int, sharding: str
) -> float:
    """tok/s of the one group cell `coordinator benchmark --hosts A+B MATRIX` measures."""
    command = [str(BIN / "coordinator"), "benchmark", "--hosts", "+".join(hosts)]
    command += ["--model", str(model), *matrix, "-r", str(trials), "-w", "1"]
    command += ["--sharding", sharding, "--backend", "ring", "--no-cool-start", "-o", "json"]
    command += ["--port", str(free_run(len(hosts)))]
    report = json.loads(run_session(command, dict(os.environ)))
    cells = [cell for cell in report["cells"] if "+" in cell.get("host", "")]
    if len(cells) != 1:
        raise BenchError(f"expected one group cell, got {len(cells)}: {report.get('status')}")
    (cell,) = cells
    if cell.get("error") or cell.get("tokens_per_sec") is None:
        raise BenchError(f"the group's {cell['test']} failed: {cell.get('error')}")
    return float(cell["tokens_per_sec"])


def ours(hosts: list[str], model: Path, p: int, g: int, trials: int, sharding: str) -> tuple:
    """One round of our side: the group's pp<p>, then its tg<g> @ d<p>."""
    prompt = group_cell(hosts, model, ["-p", str(p), "-n", "0"], trials, sharding)
    matrix = ["-p", "0", "-n", str(g), "-d", str(p)]
    return prompt, group_cell(hosts, model, matrix, trials, sharding)


def theirs(hostfile: Path, model: Path, p: int, g: int, trials: int, sharding: str) -> tuple:
    """One round of mlx-lm's side: its benchmark on two ring ranks started by mlx.launch."""
    command = [str(BIN / "mlx.launch"), "--backend", "ring", "--hostfile", str(hostfile)]
    command += ["--starting-port", str(free_run(2)), "--python", sys.executable]
    command += ["--", *benchmark_args(model, p, g, trials)]
    if sharding == "pipeline":
        command.append("--pipeline")
    return averages(run_session(command, {**os.environ, "HF_HUB_OFFLINE": "1"}))


def by_hand(root: Path, model: Path, p: int, g: int, trials: int, sharding: str) -> tuple:
    """mlx-lm's side without mlx.launch: its two ranks started here with the environment
    mlx.launch gives them (MLX_RANK, MLX_HOSTFILE), as bench_netbench's bare loop. mlx.launch's
    I/O thread per rank selects on the rank's stdin pipe, always writable, so it never sleeps:
    up to a core spent beside the ranks, which on a machine with few cores slows them."""
    members = [Member(name, (address,)) for name, address in zip("ab", ADDRESSES, strict=True)]
    port = free_run(2)
    command = [sys.executable, *benchmark_args(model, p, g, trials)]
    if sharding == "pipeline":
        command.append("--pipeline")
    ranks = []
    for rank in range(2):
        launch = rank_launch(members, rank, RING, port)
        hostfile = root / f"by-hand-{rank}.json"
        hostfile.write_text(launch.files["MLX_HOSTFILE"])
        env = {**os.environ, **launch.env, "MLX_HOSTFILE": str(hostfile), "HF_HUB_OFFLINE": "1"}
        ranks.append(
            subprocess.Popen(
                command,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )  # fmt: skip
        )
    try:
        outputs = [rank.communicate(timeout=TIMEOUT_S) for rank in ranks]
    except subprocess.TimeoutExpired:
        raise BenchError(f"mlx_lm benchmark's ranks ran past {TIMEOUT_S} s") from None
    finally:
        for rank in ranks:
            with suppress(ProcessLookupError):
                os.killpg(rank.pid, signal.SIGKILL)
            rank.wait()
    for rank, (_, stderr) in zip(ranks, outputs, strict=True):
        if rank.returncode:
            raise BenchError(f"an mlx_lm rank exited {rank.returncode}: {stderr[-500:]}")
    return averages(outputs[0][0])


def launch_hostfile(path: Path) -> None:
    """mlx.launch's JSON hostfile: one rank per loopback address, both started here."""
    hosts = [{"ssh": "127.0.0.1", "ips": [address]} for address in ADDRESSES]
    path.write_text(json.dumps({"backend": "ring", "hosts": hosts}))


def main() -> None:
    args = workload_options(__doc__.splitlines()[0], 128, 32, "side")
    args.add_argument(
        "--sharding",
        choices=SHARDINGS,
        default="tensor",
        help="pipeline needs a --model whose mlx-lm class has model.pipeline() (llama has none)",
    )
    opts = parse_workload(args)
    config = QUICK_SHAPES["16m"] if opts.quick else LLAMA_16M
    repeats = round_count(opts, default=3)
    p, g, trials, sharding = opts.prompt_tokens, opts.generation_tokens, opts.trials, opts.sharding
    require_loopback(ADDRESSES)
    print(f"machine: {machine()}")
    print(f"chip: {chip()}")
    with tempfile.TemporaryDirectory(prefix="bench-distributed-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        model = opts.model
        if model is None:
            model = root / "16m"
            model.mkdir()
            write_model(model, config)
            print(f"model 16m: mlx-lm llama, random float16 weights, {json.dumps(config)}")
        else:
            print(f"model: {model}")
        hostfile = root / "hosts.json"
        launch_hostfile(hostfile)
        os.environ["MLX_FLEET_HOME"] = str(root / "coordinator")
        hosts = [
            agent_with_key_added(stack, root / f"agent{i}", a) for i, a in enumerate(ADDRESSES)
        ]
        print(
            f"2 ring ranks on {' and '.join(ADDRESSES)}, {sharding}-parallel; pp{p} and tg{g} @ "
            f"d{p}; {repeats} interleaved rounds, {trials} trials each; load average "
            f"{os.getloadavg()[0]:.1f} at the start"
        )
        rounds = interleave(
            {
                "ours": lambda: ours(hosts, model, p, g, trials, sharding),
                "mlx-lm": lambda: theirs(hostfile, model, p, g, trials, sharding),
                "by hand": lambda: by_hand(root, model, p, g, trials, sharding),
            },
            repeats,
        )
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(
        f"{'test':<14} {'ours (A+B) tok/s':>22} {'mlx.launch tok/s':>22} {'ours / mlx.launch':>22}"
        f" {'ranks by hand tok/s':>22} {'ours / by hand':>22}"
    )
    for index, test in enumerate((f"pp{p}", f"tg{g} @ d{p}")):
        figures = (
            spread(rounds.figures("ours", index), 1, 1),
            spread(rounds.figures("mlx-lm", index), 1, 1),
            spread(rounds.ratios("ours", "mlx-lm", index), 1, 3),
            spread(rounds.figures("by hand", index), 1, 1),
            spread(rounds.ratios("ours", "by hand", index), 1, 3),
        )
        print(f"{test:<14}" + "".join(f" {figure:>22}" for figure in figures))
    print(
        f"target 0.95-1.05; tg from mlx-lm's counting alone (G-1)/G = {(g - 1) / g:.3f}; "
        "median (min-max) over the rounds, ratios round by round"
    )


if __name__ == "__main__":
    run(main)
