"""Does `coordinator netbench` report the all_sum MLX really does?

Two real `agent serve` processes on loopback (127.0.0.2, 127.0.0.3, each its own data dir,
CURVE keys exchanged) and, side by side in rotating rounds: `coordinator netbench --hosts
A,B -o json` (each agent starts its rank through rank.start) against a bare MLX loop on two
ring ranks started by hand with mlx.launch's environment (MLX_RANK, MLX_HOSTFILE), timing
`mx.eval(mx.distributed.all_sum(x))` back to back, as many as netbench times (its repetitions
× its operations per repetition), with no barrier. The bare loop's bus bandwidth is its mean
time per all_sum turned into GB/s as netbench does.

    python bench/bench_netbench.py [--repeats 5] [--quick]

Printed per size: each side's all_sum bus bandwidth, median (min–max) over the rounds, and
netbench / bare round by round (target ≥ 0.95: the barrier before each of netbench's timed
repetitions must not make the link look faster or slower than it is). Nothing is asserted.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from support import (
    BenchError,
    interleave,
    machine,
    parser,
    require_loopback,
    round_count,
    run,
    spread,
    start_agent,
)

from shared.distributed.netbench import ALL_SUM, BUS_SHARE, format_bytes, ops_per_repetition
from shared.distributed.rank_env import RING, Member, rank_launch

BIN = Path(sys.executable).parent
ADDRESSES = ("127.0.0.2", "127.0.0.3")
BARE = """
import json, sys, time
import mlx.core as mx
group = mx.distributed.init(strict=True, backend="ring")
sizes, counts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {}
for size, count in zip(sizes, counts):
    x = mx.ones((size // 4,), dtype=mx.float32)
    for _ in range(count // 2):  # warm-up, as much as netbench's -w 1 of -r 2
        mx.eval(mx.distributed.all_sum(x, group=group))
    start = time.perf_counter()
    for _ in range(count):
        mx.eval(mx.distributed.all_sum(x, group=group))
    out[str(size)] = (time.perf_counter() - start) / count
if group.rank() == 0:
    print(json.dumps(out))
"""


def free_run(count: int) -> int:
    """The first of `count` consecutive ports free on every address now: a random base, as a
    fixed one is what a second run beside this one would pick too (the ranks listen on
    consecutive ports, one address each, as mlx.launch counts them)."""
    for _ in range(200):
        base = random.randint(20000, 32000 - count)  # under Linux's ephemeral range
        try:
            for host in ADDRESSES:
                for port in range(base, base + count):
                    with socket.socket() as sock:
                        sock.bind((host, port))
            return base
        except OSError:
            continue
    raise BenchError(f"no {count} consecutive free ports on {', '.join(ADDRESSES)}")


def agent_with_key_added(stack: ExitStack, home: Path, address: str) -> str:
    """An agent whose key this coordinator knows (`coordinator keys add`)."""
    address, key = start_agent(stack, home, address)
    added = subprocess.run(
        [str(BIN / "coordinator"), "keys", "add", address, key],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if added.returncode != 0:
        raise BenchError(f"coordinator keys add: {added.stderr.strip()}")
    return address


def netbench_side(hosts: list[str], sizes: list[int], reps: int) -> tuple[float, ...]:
    sizes_text = ",".join(str(size) for size in sizes)
    for _ in range(3):  # a port found free can be taken before the ranks bind it: another one
        result = subprocess.run(
            [str(BIN / "coordinator"), "netbench", "--hosts", ",".join(hosts), "--sizes",
             sizes_text, "-r", str(reps), "-w", "1", "--port", str(free_run(len(hosts))),
             "-o", "json"],
            capture_output=True, text=True, check=False, timeout=900,
        )  # fmt: skip
        if "is in use on this machine" not in result.stderr:
            break
    if result.returncode != 0:
        raise BenchError(f"coordinator netbench: {result.stderr.strip()[-400:]}")
    rows = json.loads(result.stdout)["results"]
    by_size = {row["size"]: row["busbw_gbps"] for row in rows if row["operation"] == ALL_SUM}
    return tuple(by_size[size] for size in sizes)


def bare_side(tmp: Path, sizes: list[int], reps: int) -> tuple[float, ...]:
    counts = [reps * ops_per_repetition(size) for size in sizes]  # as many as netbench times
    members = [Member(name, (address,)) for name, address in zip("ab", ADDRESSES, strict=True)]
    base = free_run(2)
    ranks = []
    for rank in range(2):
        launch = rank_launch(members, rank, RING, base)
        hostfile = tmp / f"bare-hosts-{rank}.json"
        hostfile.write_text(launch.files["MLX_HOSTFILE"])
        env = {**os.environ, **launch.env, "MLX_HOSTFILE": str(hostfile)}
        ranks.append(
            subprocess.Popen(
                [sys.executable, "-c", BARE, json.dumps(sizes), json.dumps(counts)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    outputs = [rank.communicate(timeout=900) for rank in ranks]
    for rank, (_, stderr) in zip(ranks, outputs, strict=True):
        if rank.returncode != 0:
            raise BenchError(f"a bare rank exited {rank.returncode}: {stderr[-400:]}")
    seconds = json.loads(outputs[0][0])
    share = BUS_SHARE[ALL_SUM](2)
    return tuple(size / seconds[str(size)] / 1e9 * share for size in sizes)


def main() -> None:
    opts = parser(__doc__).parse_args()
    sizes = [1024, 1 << 20] if opts.quick else [1024, 64 << 10, 1 << 20, 16 << 20]
    reps = 3 if opts.quick else 20
    require_loopback(ADDRESSES)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        root = Path(tmp)
        os.environ["MLX_FLEET_HOME"] = str(root / "coordinator")
        hosts = [
            agent_with_key_added(stack, root / f"agent{i}", a) for i, a in enumerate(ADDRESSES)
        ]
        rounds = interleave(
            {
                "netbench": lambda: netbench_side(hosts, sizes, reps),
                "bare": lambda: bare_side(root, sizes, reps),
            },
            round_count(opts),
        )
    print(f"machine: {machine()}")
    print(f"all_sum over 2 ring ranks on loopback, {reps} repetitions, busbw GB/s")
    print(f"{'size':>8}  {'netbench':>22}  {'bare loop':>22}  netbench / bare (target ≥ 0.95)")
    for index, size in enumerate(sizes):
        ours, bare = rounds.figures("netbench", index), rounds.figures("bare", index)
        ratio = rounds.ratios("netbench", "bare", index)
        print(
            f"{format_bytes(size):>8}  {spread(ours, digits=4):>22}  {spread(bare, digits=4):>22}"
            f"  {spread(ratio)}"
        )


if __name__ == "__main__":
    run(main)
