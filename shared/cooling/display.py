"""Text renderings of temperatures that `agent temp --watch` and `coordinator monitor` share, so
an arrow or a colour means the same on a Mac's terminal and on the lab's dashboard."""

from __future__ import annotations

from collections.abc import Sequence

from shared.cooling.policy import CoolingState

_SPARKS = "▁▂▃▄▅▆▇█"
STATE_STYLES = {
    CoolingState.OK: "green",
    CoolingState.REDUCE_BATCH: "yellow",
    CoolingState.PACE: "bold cyan",
    CoolingState.PAUSE: "bold dark_orange",
    CoolingState.STOP: "bold red",
}


def trend_arrow(per_minute: float | None) -> str:
    """↑/↓ beyond a dead band of ±0.5 °C/min, → inside it, blank without a trend."""
    if per_minute is None:
        return ""
    return "↑" if per_minute > 0.5 else "↓" if per_minute < -0.5 else "→"


def sparkline(values: Sequence[float | None]) -> str:
    """One block per value scaled between the lowest and highest; a gap (None) is a space, so
    a silence stays visible instead of being drawn as a reading."""
    known = [v for v in values if v is not None]
    low, high = min(known, default=0.0), max(known, default=0.0)
    span = (high - low) or 1.0
    return "".join(
        " " if v is None else _SPARKS[round((v - low) / span * (len(_SPARKS) - 1))] for v in values
    )
