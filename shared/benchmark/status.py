"""What a benchmark is doing, in words: the progress label of `agent bench` and of each host of
`coordinator benchmark` (a model being built, the idle baseline, a cell, a cooling pause), and the
warnings a run owes its reader where protection is off or a backend is slow. Pure: every time
and fact comes in as an argument; the commands print."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from shared.cooling.sources import read_from, short_source

QUANTIZED_BITS = (4, 8)
"""The --bits MLX quantizes to: on its CPU backend they have no fast matmul kernel."""
NO_SENSOR_SOURCES = ("none",)
"""Thermal sources that give no reading: the cooling policy cannot act on them."""


def duration_text(seconds: float) -> str:
    """`7s`, `1m02s`, `1h05m`: whole seconds, as a label's clock shows them."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def params_text(count: int | None) -> str:
    """`3.21B params`, `0.12B params`... None: unknown (a directory's model before it loads)."""
    if count is None:
        return ""
    if count >= 1e9:
        return f"{count / 1e9:.2f}B params"
    if count >= 1e6:
        return f"{count / 1e6:.1f}M params"
    return f"{count} params"


def build_label(label: str, param_count: int | None) -> str:
    """`building full/q4 (3.21B params)`: the model as its cells name it, and its size."""
    size = params_text(param_count)
    return f"building {label}" + (f" ({size})" if size else "")


def baseline_label(seconds: float) -> str:
    """The idle-power baseline, which measures nothing of a cell: `idle baseline 10s`."""
    return f"idle baseline {duration_text(seconds)}"


@dataclass(frozen=True)
class PauseView:
    """A cooling pause as a label shows it and the wire carries it (bench.progress `pause`):
    the reading that paused (or the latest in the pause), its source and sensor, seconds paused
    so far; `done` when the pause ended."""

    celsius: float | None
    pressure: str | None
    source: str
    sensor: str | None
    paused_s: float
    done: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PauseView:
        """From a map already checked against its shape (shared.wire.agent_shapes)."""
        return cls(**{key: data.get(key) for key in cls.__dataclass_fields__})


def _reading(celsius: float | None, pressure: str | None) -> str:
    if celsius is not None:
        return f"{celsius:.1f} °C"
    return f"thermal pressure {pressure}" if pressure else "no reading"


def pause_label(pause: PauseView, paused_s: float | None = None) -> str:
    """`paused at 86.1 °C (smc · TCMz), 1m02s`: the reading, source · sensor, time paused so far
    (`paused_s` when the caller's clock is fresher than the pause's)."""
    where = read_from(short_source(pause.source), pause.sensor or None)
    seconds = pause.paused_s if paused_s is None else paused_s
    return (
        f"paused at {_reading(pause.celsius, pause.pressure)} ({where}), {duration_text(seconds)}"
    )


def pause_line(pause: PauseView) -> str:
    """The `cooling:` line on stderr as a pause starts or ends: the source named whole."""
    where = read_from(pause.source, pause.sensor or None)
    if pause.done:
        return f"cooling: resume after {duration_text(pause.paused_s)} ({where})"
    return f"cooling: pause at {_reading(pause.celsius, pause.pressure)} ({where})"


def activity_label(activity: str, elapsed_s: float, pause: PauseView | None = None) -> str:
    """The label: a pause when one is under way, else what runs and for how long."""
    if pause is not None and not pause.done:
        return pause_label(pause)
    return f"{activity} {duration_text(elapsed_s)}" if activity else ""


def no_sensor_warning(source: str) -> str | None:
    """Why the cooling policy is inert on a source that gives no reading, or None; the words of
    `agent run`'s warning (agent/commands/run.py)."""
    if source not in NO_SENSOR_SOURCES:
        return None
    return (
        f"warning: thermal source {source}: no thermal sensor, so the cooling policy cannot "
        "act; cells run without thermal enforcement (no pause, no stop)"
    )


def quantized_cpu_warning(bits: Iterable[int | None], backend: str | None) -> str | None:
    """Once per run and host: quantized cells on MLX's CPU backend are slow, and why; None
    where none are asked for or the backend is not the CPU."""
    wanted = sorted({b for b in bits if b in QUANTIZED_BITS})
    if not wanted or (backend or "").lower() != "cpu":
        return None
    asked = "/".join(f"q{b}" for b in wanted)
    return (
        f"warning: {asked} cells run on MLX's CPU backend, which has no fast quantized matmul "
        "kernels: expect them 50-400x slower than f16 (small/q8 pp32: about 1.4 tok/s here)"
    )
