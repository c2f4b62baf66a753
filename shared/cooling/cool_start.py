"""A cell waiting to start cool (MatrixSpec.cool_start_s): what the wait reports as it goes, on
the wire (`bench.progress`'s `cooling`) and in words. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class CoolWait:
    """The latest reading, the threshold it must get below (the policy's max_speed_temp), and
    the seconds waited of the most allowed. `done` when the wait ends: cool, or past the limit
    (`hot`: the cell then runs, flagged hot-start). `injected`: the readings are
    MLX_FLEET_INJECT=hot-start's, not a sensor's."""

    celsius: float | None
    pressure: str | None
    target_c: float
    waited_s: float
    limit_s: float
    done: bool = False
    hot: bool = True
    injected: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CoolWait:
        """From a map already checked against its shape (shared.wire.agent_shapes)."""
        return cls(**{key: data[key] for key in cls.__dataclass_fields__})


def _reading(wait: CoolWait) -> str:
    if wait.celsius is not None:
        return f"{wait.celsius:.1f} °C"
    return f"thermal pressure {wait.pressure}" if wait.pressure else "no reading"


def cool_wait_line(wait: CoolWait) -> str:
    """`waiting to cool: 88.0 °C → 75.0 °C (0 of up to 120 s)` while it waits; how it ended
    after. An injected wait says so."""
    return _line(wait) + (" [injected]" if wait.injected else "")


def _line(wait: CoolWait) -> str:
    if not wait.done:
        return (
            f"waiting to cool: {_reading(wait)} → {wait.target_c:.1f} °C "
            f"({wait.waited_s:.0f} of up to {wait.limit_s:.0f} s)"
        )
    if wait.hot:
        return (
            f"still {_reading(wait)} after {wait.waited_s:.0f} s: the cell runs, flagged hot-start"
        )
    return f"cooled to {_reading(wait)} in {wait.waited_s:.0f} s"
