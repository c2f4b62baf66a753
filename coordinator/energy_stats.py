"""What recorded telemetry says about a host's energy over a stretch of time: pure, over the
sample bodies `coordinator history` reads (each sample stands for its span, as in
coordinator.telemetry_stats, so a silence never counts as power drawn)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def host_energy(samples: Sequence[dict[str, Any]], spans: Sequence[float]) -> dict[str, Any]:
    """Joules (the sum of each sample's watts over its span), the mean watts over the time a
    power source read, those seconds, and which sources read (simulated ones said)."""
    metered = [
        (sample, span)
        for sample, span in zip(samples, spans, strict=True)
        if sample.get("power_w") is not None
    ]
    seconds = sum(span for _, span in metered)
    joules = sum(sample["power_w"] * span for sample, span in metered) if metered else None
    powers = [sample.get("power") or {} for sample, _ in metered]
    return {
        "energy_j": joules,
        "mean_power_w": joules / seconds if joules is not None and seconds > 0 else None,
        "metered_s": seconds,
        "power_sources": sorted({power.get("source") or "?" for power in powers}),
        "power_simulated": any(power.get("simulated") for power in powers),
    }
