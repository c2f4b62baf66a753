"""How long a rank waits in MLX's collectives, apart from its own work.

MLX evaluates lazily, so one `mx.eval` runs a rank's work and the collectives it asked for
(mlx.nn's sharded layers call `mx.distributed.all_sum`, our pipeline `send`/`recv_like`/
`all_gather`, a training loop its gradients' `all_sum`) as one graph, and no clock around it can
split them. While the clock is installed, every collective asked for through `mx.distributed`
evaluates its inputs first (this rank's own work up to it) and then itself, timed: that time is
the wait (a peer's lateness plus the transfer). The extra evaluation points cost a Python call
each and stop the collective's inputs from overlapping it: a clock for a probe or a training
step's few collectives, not for every timed iteration.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx

COLLECTIVES = (
    "all_sum",
    "all_gather",
    "all_max",
    "all_min",
    "sum_scatter",
    "send",
    "recv",
    "recv_like",
)
"""mx.distributed's operations that meet a peer (those this MLX has are timed)."""


class CollectiveClock:
    """`wait_s`: seconds spent in collectives while installed; `untimed`: collectives it could
    not time (reset both at will); `originals`: the untimed operations, for a caller's own
    collectives that are no wait.

    A collective inside a function MLX transforms (mx.compile, as mlx_lm's trainer compiles its
    step; vmap, grad) cannot be evaluated there: it runs untimed, counted in `untimed`, and a
    step with any such collective has no figure (its wait is inside another evaluation)."""

    def __init__(self) -> None:
        self.wait_s = 0.0
        self.untimed = 0
        self.originals: dict[str, Callable[..., Any]] = {}

    def install(self) -> None:
        self.originals = {
            name: getattr(mx.distributed, name)
            for name in COLLECTIVES
            if hasattr(mx.distributed, name)
        }
        for name, original in self.originals.items():
            setattr(mx.distributed, name, self._timed(original))

    def uninstall(self) -> None:
        for name, original in self.originals.items():
            setattr(mx.distributed, name, original)

    @contextmanager
    def timing(self) -> Iterator[None]:
        self.install()
        try:
            yield
        finally:
            self.uninstall()

    def _timed(self, original: Callable[..., mx.array]) -> Callable[..., mx.array]:
        def collective(*args: Any, **kwargs: Any) -> mx.array:
            try:
                mx.eval(*[value for value in args if isinstance(value, mx.array)])
            except ValueError:  # inside mx.compile and the like: "Attempting to eval an array
                self.untimed += 1  # during function transformations ... is not allowed"
                return original(*args, **kwargs)
            start = time.perf_counter()
            result = original(*args, **kwargs)
            mx.eval(result)
            self.wait_s += time.perf_counter() - start
            return result

        return collective
