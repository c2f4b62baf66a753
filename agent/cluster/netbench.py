"""One rank of `coordinator netbench`: MLX's own `all_sum` over the whole ring and a
send/receive ping-pong over each of the ring's links, at each message size, timed around
`mx.eval` after warm-up. Every rank takes part in every step (a collective waits for all);
the timings are gathered with one more `all_sum` so that rank 0 can report them all.

    MLX_RANK=R MLX_HOSTFILE=hosts.json python -m agent.cluster.netbench SPEC_JSON

SPEC_JSON: {"sizes": [bytes...], "repetitions": N, "warmup": N, "hosts": [names...]}; rank 0
prints one JSON line: {"all_sum": {size: [seconds...]}, "send_recv": {"a↔b": {size: [...]}}}.
Under an agent, each rank writes its progress (the units done) to the file PROGRESS names.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence

import mlx.core as mx

from agent.cluster.lifeline import exit_with_parent
from agent.cluster.rank_process import PROGRESS
from shared.distributed.netbench import ELEMENT_BYTES, link_name, ops_per_repetition, ring_edges


class Progress:
    """Units of the run done (shared.distributed.netbench.progress_step names them), written over
    the file the agent names in PROGRESS so it can tell a rank that moves from one blocked in a
    collective. One small pwrite each, always between timed regions; without PROGRESS (a rank
    started by hand) it only counts."""

    def __init__(self, path: str | None) -> None:
        self.done = 0
        self._fd = None if not path else os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def advance(self, units: int = 1) -> None:
        self.done += units
        if self._fd is not None:
            os.pwrite(self._fd, f"{self.done:<20}\n".encode(), 0)  # fixed width: no stale tail


def timed(
    step: Callable[[], list[mx.array]],
    warmup: int,
    repetitions: int,
    ops: int,
    done: Callable[[], None],
) -> list[float]:
    """Seconds per operation of each repetition: `ops` back-to-back `step`s (each evaluated),
    their time over `ops`, as nccl-tests times its iterations; `warmup` repetitions first,
    untimed; `done` after each, outside its timing."""
    seconds = []
    for index in range(warmup + repetitions):
        start = time.perf_counter()
        for _ in range(ops):
            mx.eval(*step())
        if index >= warmup:
            seconds.append((time.perf_counter() - start) / ops)
        done()
    return seconds


def all_sum_seconds(
    group: mx.distributed.Group,
    message: mx.array,
    warmup: int,
    repetitions: int,
    ops: int,
    done: Callable[[], None],
) -> list[float]:
    """The repetitions back to back after the one barrier before them: a barrier before each
    would add its own wake-up to the first operation after it (3 ms on loopback here,
    bench/bench_netbench.py), which a training loop's back-to-back all_sums do not pay."""

    def reduce() -> list[mx.array]:
        return [mx.distributed.all_sum(message, group=group)]

    return timed(reduce, warmup, repetitions, ops, done)


def barrier(group: mx.distributed.Group) -> None:
    """Wait for every rank: a one-element all_sum."""
    mx.eval(mx.distributed.all_sum(mx.zeros((1,)), group=group))


def ping_pong_seconds(
    group: mx.distributed.Group,
    message: mx.array,
    edge: tuple[int, int],
    warmup: int,
    repetitions: int,
    ops: int,
    progress: Progress,
) -> list[float]:
    """One-way seconds over `edge`: half a round trip, timed by its first rank; its second
    echoes, counting each repetition's echoes as it goes; the ranks off the edge count its
    repetitions at once and wait at the next collective."""
    first, second = edge
    rank = group.rank()
    if rank == first:

        def there_and_back() -> list[mx.array]:
            mx.eval(mx.distributed.send(message, second, group=group))
            return [mx.distributed.recv_like(message, second, group=group)]

        timings = timed(there_and_back, warmup, repetitions, ops, progress.advance)
        return [s / 2 for s in timings]
    if rank == second:
        for _ in range(warmup + repetitions):
            for _ in range(ops):
                echoed = mx.distributed.recv_like(message, first, group=group)
                mx.eval(mx.distributed.send(echoed, first, group=group))
            progress.advance()
    else:
        progress.advance(warmup + repetitions)
    return []


def gathered(
    group: mx.distributed.Group, mine: Sequence[float], owner: int, count: int
) -> list[float]:
    """`owner`'s `count` timings on every rank, through an all_sum of zeros elsewhere."""
    values = mx.array(list(mine) if group.rank() == owner else [0.0] * count, dtype=mx.float32)
    summed = mx.distributed.all_sum(values, group=group)
    mx.eval(summed)
    return summed.tolist()


def run(spec: dict, progress: Progress) -> dict:
    """Every size's all_sum, then each link's ping-pong, each preceded by a barrier so every
    rank starts it together and followed by the gathering of its timings; `progress` advanced
    through the units shared.distributed.netbench.progress_step names."""
    group = mx.distributed.init(strict=True)
    hosts = spec["hosts"]
    if group.size() != len(hosts):
        raise SystemExit(f"netbench: {group.size()} ranks for {len(hosts)} hosts")
    progress.advance()
    warmup, reps = int(spec["warmup"]), int(spec["repetitions"])
    result: dict = {"all_sum": {}, "send_recv": {}}
    for size in spec["sizes"]:
        message = mx.ones((size // ELEMENT_BYTES,), dtype=mx.float32)
        mx.eval(message)
        ops = ops_per_repetition(size)
        barrier(group)
        progress.advance()
        seconds = all_sum_seconds(group, message, warmup, reps, ops, progress.advance)
        result["all_sum"][str(size)] = gathered(group, seconds, 0, reps)
        progress.advance()
        for edge in ring_edges(hosts):
            barrier(group)
            progress.advance()
            mine = ping_pong_seconds(group, message, edge, warmup, reps, ops, progress)
            link = result["send_recv"].setdefault(link_name(hosts, edge), {})
            link[str(size)] = gathered(group, mine, edge[0], reps)
            progress.advance()
    return result


def main(argv: Sequence[str]) -> int:
    exit_with_parent()
    result = run(json.loads(argv[0]), Progress(os.environ.get(PROGRESS)))
    if mx.distributed.init().rank() == 0:
        print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
