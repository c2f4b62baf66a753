"""agent.cluster.collective_clock on real MLX: a collective is timed apart from the work before
it, and one inside mx.compile (as mlx_lm's trainer compiles its step) runs untimed and counted,
where evaluating would raise MLX's `[eval] Attempting to eval an array during function
transformations` (it did: a gang's mlx_lm lora rank died of it)."""

from __future__ import annotations

import mlx.core as mx

from agent.cluster.collective_clock import CollectiveClock


def test_a_collective_is_timed_and_one_inside_compile_runs_untimed() -> None:
    clock = CollectiveClock()
    original = mx.distributed.all_sum
    with clock.timing():
        summed = mx.distributed.all_sum(mx.ones((4,)) * 3)
        assert clock.wait_s > 0 and clock.untimed == 0
        doubled = mx.compile(lambda x: mx.distributed.all_sum(x) * 2)(mx.ones((4,)))
        mx.eval(doubled)
    assert summed.tolist() == [3.0] * 4 and doubled.tolist() == [2.0] * 4
    assert clock.untimed == 1
    assert mx.distributed.all_sum is original  # uninstalled
