"""A training-shaped MLX ring job with a known result: STEPS steps, each an `all_sum` of a
vector of ones (as mlx_lm's trainer averages gradients every step), checked against the world
size. Each rank writes its step count to $PROGRESS_DIR/rank-R (so a test sees it advance or
stand still) and `ok` to $PROGRESS_DIR/rank-R.done when every step summed right.

    MLX_RANK=R MLX_HOSTFILE=hosts.json STEPS=400 PROGRESS_DIR=DIR python ring_steps.py

GATE=step checks agent.cooling.step_gate.StepGate before each step, GATE=scheduler the seed's
CoolingScheduler over a RemoteMonitor (which follows the gang under `agent run`): cooperative
ranks that park at a step boundary instead of being stopped mid-collective.

FINISH_FILE=PATH: the ranks end (done, `ok`) after the step in which any of them saw PATH: each
step also sums who saw it, so every rank ends after the same step. A test that has seen what it
waited for (a pause, a resume) says so by creating PATH, instead of waiting out STEPS chosen long
enough for the slowest machine.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx


def main() -> int:
    group = mx.distributed.init(strict=True, backend="ring")
    rank, world = group.rank(), group.size()
    steps = int(os.environ.get("STEPS", "400"))
    progress = Path(os.environ["PROGRESS_DIR"]) / f"rank-{rank}"
    check = gate(os.environ.get("GATE"))
    finish = os.environ.get("FINISH_FILE")
    for step in range(1, steps + 1):
        check(step)
        summed = mx.distributed.all_sum(mx.ones((1024,)), group=group)
        mx.eval(summed)
        if not bool(mx.all(summed == world).item()):
            print(f"rank {rank}: step {step} summed {summed[0].item()}, not {world}")
            return 1
        told = finish is not None and told_to_finish(Path(finish), group)
        if step % 10 == 0 or step == steps or told:
            progress.write_text(str(step))
        if told:
            break
    progress.with_suffix(".done").write_text("ok")
    return 0


def told_to_finish(path: Path, group: mx.distributed.Group) -> bool:
    """Whether any rank has seen `path`: the same answer on every rank (a collective)."""
    seen = mx.distributed.all_sum(mx.array([1.0 if path.exists() else 0.0]), group=group)
    return bool(seen.item() > 0)


def gate(kind: str | None) -> Callable[[int], None]:
    if kind == "step":
        from agent.cooling.step_gate import StepGate

        return StepGate().check_before_step
    if kind == "scheduler":
        from agent.cooling.remote import RemoteMonitor
        from agent.cooling.scheduler import CoolingScheduler

        monitor = RemoteMonitor(poll_interval=0.2)
        monitor.start()
        return CoolingScheduler(monitor).check_before_step
    return lambda step: None


if __name__ == "__main__":
    sys.exit(main())
