"""The memory-bandwidth probe of `coordinator doctor --level 2`, as figures: how large an array
it times, its GB/s over the repetitions (median and spread), what that is a fraction of, and
how it is judged against its family's earlier level-2 results. Pure: the timing runs in the
agent's device-probe child (agent.profiling.device_probe --bandwidth), the judging in the
coordinator, from the child's raw seconds (an agent's figures are not trusted).

Two kernels on MLX's default device, each timed around mx.eval after a warm-up: `read` sums a
float32 array (each byte read once) and `copy` writes twice the array to a new one (each byte
read once and written once, counted as 2 bytes moved as STREAM counts its scale kernel).
Gigabytes are 10^9 bytes, as Apple quotes bandwidth. What the figure is depends on the
device (docs/performance.md, Diagnostic levels): under Metal, the GPU's path to unified
memory, the one decode reads weights over, so its read is a fraction of the chip's published
bandwidth (the roofline's table); on MLX's CPU device (Linux, or a Mac without a Metal device)
the CPU's memory path, never compared with a chip's specification.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from shared import shapes as s
from shared.benchmark.health import band
from shared.benchmark.roofline import bandwidth

MIB = 1024 * 1024
MIN_BYTES = 64 * MIB
"""The smallest array timed: past the largest system-level cache of an M-series chip."""
MAX_BYTES = 1024 * MIB
"""The largest: at 800 GB/s a read still takes over a millisecond, far above mx.eval's cost."""
FREE_SHARE = 8
"""The array takes at most this share of the available memory: the copy holds two of them
and the machine keeps room for everything else it runs."""
WARMUP = 1
REPETITIONS = 5
KERNELS = ("read", "copy")
BYTES_MOVED = {"read": 1, "copy": 2}
"""Bytes moved per byte of the array: a read reads it; a copy reads and writes it."""
GPU, CPU = "gpu", "cpu"


def probe_bytes(available: int) -> tuple[int | None, str | None]:
    """The array's size for `available` bytes of free memory: a 1/FREE_SHARE share, within
    MIN_BYTES to MAX_BYTES, whole MiB; (None, why) when even MIN_BYTES would not fit."""
    if available // FREE_SHARE < MIN_BYTES:
        return None, (
            f"too little free memory to probe bandwidth: {available / MIB:.0f} MiB available, "
            f"the probe needs {FREE_SHARE * MIN_BYTES / MIB:.0f} MiB"
        )
    return min(MAX_BYTES, available // FREE_SHARE) // MIB * MIB, None


SECONDS = s.list_of(s.number(1e-9, 3600.0), 64)
MEASURED = s.fields(
    {
        "bytes": s.integer(MIN_BYTES, MAX_BYTES),
        "backend": s.one_of((GPU, CPU)),
        "read_s": SECONDS,
        "copy_s": SECONDS,
    }
)
UNMEASURED = s.fields({"error": s.text(2000, 1)})
RAW = s.either(MEASURED, UNMEASURED)
"""What an agent sends (docs/protocol.md §14, `bandwidth`): the array's bytes, the device and
each timed repetition's seconds per kernel; or the one line saying why there are none."""


def rates(size: int, kernel: str, seconds: Sequence[float]) -> dict[str, float | int | None]:
    """One kernel's GB/s: the median over its repetitions, the slowest and fastest, and the
    spread ((fastest - slowest) / median)."""
    speeds = sorted(size * BYTES_MOVED[kernel] / t / 1e9 for t in seconds)
    if not speeds:
        return {"gbs": None, "low_gbs": None, "high_gbs": None, "spread": None, "repetitions": 0}
    middle = statistics.median(speeds)
    return {
        "gbs": middle,
        "low_gbs": speeds[0],
        "high_gbs": speeds[-1],
        "spread": (speeds[-1] - speeds[0]) / middle,
        "repetitions": len(speeds),
    }


def figures(raw: Any, machine: Mapping[str, Any] | None) -> dict[str, Any]:
    """An agent's `bandwidth` (checked against RAW: a bad one is said, never used) as figures:
    each kernel's rates, what was measured (`path`), the chip's specified GB/s and the read's
    fraction of it where both mean something, and `why` where they do not."""
    try:
        RAW(raw)
    except s.Invalid as exc:
        return unmeasured(f"the agent's bandwidth report is invalid: {exc}")
    if "error" in raw:
        return unmeasured(raw["error"])
    found: dict[str, Any] = {
        "bytes": raw["bytes"],
        "backend": raw["backend"],
        **{kernel: rates(raw["bytes"], kernel, raw[f"{kernel}_s"]) for kernel in KERNELS},
    }
    return found | meaning(found["read"]["gbs"], raw["backend"], machine or {})


def meaning(read_gbs: float | None, backend: str, machine: Mapping[str, Any]) -> dict[str, Any]:
    """What the figure measured and what it is a fraction of: the chip's published bandwidth
    under Metal (unknown chip: none, said); on the CPU device the CPU's memory path, with
    no fraction."""
    if backend == CPU:
        where = "a Linux machine" if str(machine.get("os") or "").startswith("Linux") else "here"
        return {
            "path": "the CPU's memory path (MLX's CPU device)",
            "spec_gbs": None,
            "fraction": None,
            "why": f"MLX runs on the CPU on {where}: the figure is the CPU's memory path, not "
            "a chip's specified unified-memory bandwidth, so there is no fraction",
        }
    spec, why = bandwidth(machine.get("chip"), machine.get("gpu_cores"))
    return {
        "path": "unified memory, read by the GPU (Metal)",
        "spec_gbs": spec,
        "fraction": read_gbs / spec if spec and read_gbs is not None else None,
        "why": None if spec else f"{why}: no fraction",
    }


def unmeasured(why: str) -> dict[str, Any]:
    return {
        "bytes": None,
        "backend": None,
        "read": rates(0, "read", []),
        "copy": rates(0, "copy", []),
        "path": None,
        "spec_gbs": None,
        "fraction": None,
        "why": why,
    }


def judge(read_gbs: float | None, history: Sequence[float]) -> tuple[tuple | None, str | None]:
    """The family's band for the read GB/s (shared.benchmark.health.band over its earlier
    level-2 figures) and, when the figure falls below it, why that fails the host."""
    found = band(history)
    if found is None or read_gbs is None or read_gbs >= found[0]:
        return found, None
    return found, (
        f"memory read {read_gbs:.1f} GB/s below its family's band ({found[0]:.1f} to "
        f"{found[1]:.1f} GB/s, from {len(history)} level-2 results; median "
        f"{statistics.median(history):.1f})"
    )


def summary(found: Mapping[str, Any]) -> str:
    """`412 GB/s read (±2 %), 380 copy; 75 % of 546 GB/s`, or what stands in for it."""
    read, copy = found["read"], found["copy"]
    if read["gbs"] is None:
        return f"unavailable: {found['why']}"
    text = f"{read['gbs']:.1f} GB/s read (spread {read['spread']:.0%}), {copy['gbs']:.1f} copy"
    if found["fraction"] is not None:
        return f"{text}; {found['fraction']:.0%} of {found['spec_gbs']:g} GB/s"
    return f"{text}; {'CPU memory path' if found['backend'] == CPU else 'no spec known'}"
