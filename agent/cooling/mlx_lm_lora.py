"""`python -m agent.cooling.mlx_lm_lora ARGS...`: mlx_lm's `lora`, its ranks parking at step
boundaries when their gang pauses (agent.cooling.step_gate), for `agent run` with
MLX_FLEET_COOPERATIVE=1:

    MLX_FLEET_COOPERATIVE=1 mlx.launch --hostfile hosts.json -- \\
        agent run -- python -m agent.cooling.mlx_lm_lora --model M --train --data D

mlx_lm's trainer (mlx_lm/tuner/trainer.py, `train`) pulls each step's batch from
`iterate_batches` after the previous step's `mx.eval` has returned, so nothing is in flight
there; its training callbacks run only every `steps_per_report` steps, and `lora.run` replaces
the one it is given. So the wrapper hands `train` an `iterate_batches` that checks the gate
before each batch: every step is a boundary, the same one on every rank. Outside a gang it is
mlx_lm's `lora`, unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from agent.cooling.step_gate import StepGate


def gated(iterate_batches: Callable[..., Iterator[Any]], gate: StepGate) -> Callable[..., Any]:
    """`iterate_batches` whose every batch waits for the gate first."""

    @functools.wraps(iterate_batches)
    def batches(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for step, batch in enumerate(iterate_batches(*args, **kwargs), start=1):
            gate.check_before_step(step)
            yield batch

    return batches


def main() -> None:
    import mlx_lm.lora as lora
    import mlx_lm.tuner.trainer as trainer

    if StepGate.wanted():
        gate = StepGate()
        train = lora.train
        lora.train = functools.partial(train, iterate_batches=gated(trainer.iterate_batches, gate))
    lora.main()


if __name__ == "__main__":
    main()
