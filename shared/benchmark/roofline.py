"""A roofline on every generation cell: decode is memory-bound, so tok/s can be no more than
the chip's memory bandwidth over the bytes one decode step reads. Pure.

Bytes per step: the weights as the profiler counts them (`weight_memory_bytes`: every array
the model holds, quantization scales included; a tied LM head is read whole each step) plus,
per sequence, the KV cache read at that depth (the cell's depth and, on average, half its
generated tokens), where the agent reported the model's KV bytes per position. The fraction
is the step rate x bytes per step / bandwidth: above 1.0 a measurement bug, below 0.25 swap,
unwired memory, throttling or the wrong device (issue 43); either marks the cell `suspect`.
Published Mac results land at 40-60 % on Max and Ultra chips, up to ~85 % on base chips.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SUSPECT = "suspect"
HIGHEST = 1.0
LOWEST = 0.25
DECODE = "decode"

BANDWIDTH_GBS: dict[str, float | dict[int, float]] = {
    "M1": 68.25,
    "M1 Pro": 200.0,
    "M1 Max": 400.0,
    "M1 Ultra": 800.0,
    "M2": 100.0,
    "M2 Pro": 200.0,
    "M2 Max": 400.0,
    "M2 Ultra": 800.0,
    "M3": 100.0,
    "M3 Pro": 150.0,
    "M3 Max": {30: 300.0, 40: 400.0},
    "M3 Ultra": 819.0,
    "M4": 120.0,
    "M4 Pro": 273.0,
    "M4 Max": {32: 410.0, 40: 546.0},
    "M5": 153.0,
}
"""Unified memory bandwidth, GB/s (10^9 bytes), as Apple publishes it; where one chip ships at
two bandwidths, by its GPU cores. docs/performance.md (Roofline) cites Apple's page for each.
A chip not listed has no bandwidth here: said, never guessed."""


def bandwidth(chip: Any, gpu_cores: Any) -> tuple[float | None, str | None]:
    """(GB/s, None), or (None, why not): an unknown chip, or a chip sold at two bandwidths whose
    GPU core count is unknown or unlisted."""
    name = str(chip or "").removeprefix("Apple ").strip()
    found = BANDWIDTH_GBS.get(name)
    if found is None:
        return None, f"no memory bandwidth known for chip {name or 'unknown'!r}"
    if isinstance(found, dict):
        if gpu_cores not in found:
            listed = ", ".join(f"{cores}-core GPU: {gbs:g} GB/s" for cores, gbs in found.items())
            cores = "an unknown number of" if gpu_cores is None else gpu_cores
            return None, f"{name}'s bandwidth depends on its GPU cores ({listed}); it has {cores}"
        return found[gpu_cores], None
    return found, None


def bytes_per_step(
    weight_bytes: float,
    batch: int,
    depth: int,
    n_gen: int,
    kv_bytes_per_position: float | None,
) -> float:
    """What one decode step reads: the weights once, and each sequence's KV cache at the
    cell's depth plus half its generated tokens (the average over the cell)."""
    kv = (kv_bytes_per_position or 0.0) * (depth + n_gen / 2)
    return weight_bytes + batch * kv


def fraction(
    tokens_per_sec: float,
    batch: int,
    bytes_each_step: float,
    bandwidth_gbs: float,
) -> float:
    """The share of the bandwidth the measured rate implies (steps/s x bytes per step)."""
    return tokens_per_sec / batch * bytes_each_step / (bandwidth_gbs * 1e9)


def roofline(
    record: Mapping[str, Any],
    machine: Mapping[str, Any] | None,
    model: Mapping[str, Any] | None,
) -> dict[str, Any] | None:
    """A decode cell's roofline: {fraction, ceiling_tokens_per_sec, bandwidth_gbs,
    bytes_per_token, kv, why}, the fraction nil with `why` where it cannot be told; None for
    a cell that is not an ok decode cell."""
    speed = record.get("tokens_per_sec")
    if record.get("mode") != DECODE or record.get("status") != "ok" or not speed:
        return None
    machine, model = machine or {}, model or {}
    gbs, why = bandwidth(machine.get("chip"), machine.get("gpu_cores"))
    weights = model.get("weight_memory_bytes")
    if gbs is None:
        return _unknown(why)
    if not weights:
        return _unknown("the model's weight bytes are unknown")
    batch = int(record.get("batch_size") or 1)
    kv = model.get("kv_bytes_per_position")
    each = bytes_per_step(weights, batch, int(record.get("n_depth") or 0),
                          int(record.get("n_gen") or 0), kv)  # fmt: skip
    share = fraction(float(speed), batch, each, gbs)
    found = {
        "fraction": share,
        "ceiling_tokens_per_sec": batch * gbs * 1e9 / each,
        "bandwidth_gbs": gbs,
        "bytes_per_token": each / batch,
        "kv": "included" if kv else "unknown (weights alone: a lower bound)",
        "why": None,
    }
    if share > HIGHEST:
        found["why"] = (
            f"{share:.0%} of the {gbs:g} GB/s roofline ({speed:.1f} tok/s against a ceiling "
            f"of {found['ceiling_tokens_per_sec']:.1f}): a measurement bug"
        )
    elif share < LOWEST:
        found["why"] = (
            f"{share:.0%} of the {gbs:g} GB/s roofline ({speed:.1f} tok/s against a ceiling "
            f"of {found['ceiling_tokens_per_sec']:.1f}): swap, unwired memory, throttling or "
            "the wrong device?"
        )
    return found


def _unknown(why: str | None) -> dict[str, Any]:
    return {
        "fraction": None,
        "ceiling_tokens_per_sec": None,
        "bandwidth_gbs": None,
        "bytes_per_token": None,
        "kv": None,
        "why": why,
    }


def is_suspect(found: Mapping[str, Any] | None) -> bool:
    share = (found or {}).get("fraction")
    return share is not None and not LOWEST <= share <= HIGHEST


def mark_roofline(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Copies of a report's cells (a fleet's, or one Mac's: its `machine` and `models` at the
    top), each decode cell with its `roofline` (its host's machine, its model's info) and
    flagged `suspect` outside 0.25 to 1.0."""
    alone = {"host": None, "machine": report.get("machine"), "models": report.get("models")}
    hosts = report.get("hosts") or [alone]
    machines = {host.get("host"): host.get("machine") for host in hosts}
    models = {
        (host.get("host"), info.get("model"), info.get("bits")): info
        for host in hosts
        for info in host.get("models") or []
    }
    marked = []
    for record in report.get("cells") or []:
        host = record.get("host") if "hosts" in report else None
        found = roofline(
            record, machines.get(host), models.get((host, record.get("model"), record.get("bits")))
        )
        copy = dict(record)
        if found is not None:
            copy["roofline"] = found
            flags = [flag for flag in record.get("flags") or () if flag != SUSPECT]
            copy["flags"] = flags + ([SUSPECT] if is_suspect(found) else [])
        marked.append(copy)
    return marked
