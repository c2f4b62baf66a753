"""A canary across a rollout: the same cells on both sides of a macOS, MLX or mlx-lm update,
and the speed delta with a 95 % interval, as llama.cpp's compare-llama-bench.py compares two
builds, done here between software versions across hosts. Pure.

Each side is the valid cells whose setting (SPLITS) holds one value; a cell shape both sides
ran gives the ratio of their mean tok/s, its interval from Welch's standard error of the log
ratio (the delta method: se^2 = s_a^2 / (n_a mean_a^2) + s_b^2 / (n_b mean_b^2)). The cells
are pooled as the mean of their log ratios, the degrees of freedom Welch-Satterthwaite's over
all of them.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.benchmark.health import cell_key
from shared.benchmark.results import OK
from shared.benchmark.verdict import VALID, judge
from shared.stats import t975

SPLITS = {"macos": "os_build", "mlx": "mlx_version", "mlx-lm": "mlx_lm_version"}
"""`--split`'s choices and the cell setting each one reads (docs/protocol.md §5, Settings)."""


class CanaryError(ValueError):
    """The split cannot give a delta; the message says why in one line."""


@dataclass
class CellDelta:
    cell: str
    before: list[float]
    after: list[float]
    ratio: float
    se: float | None
    """Of the log ratio; None with fewer than two hosts on a side."""


@dataclass
class Canary:
    split: str
    before: str
    after: str
    delta: float
    """after / before - 1 over the pooled cells (-0.10: 10 % slower after)."""
    low: float | None
    high: float | None
    hosts: tuple[int, int]
    cells: list[CellDelta] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "before": self.before,
            "after": self.after,
            "delta": self.delta,
            "ci95": None if self.low is None else [self.low, self.high],
            "hosts": {"before": self.hosts[0], "after": self.hosts[1]},
            "cells": [
                {"cell": c.cell, "before": len(c.before), "after": len(c.after),
                 "delta": c.ratio - 1.0}
                for c in self.cells
            ],
        }  # fmt: skip


def version_order(value: str) -> tuple:
    """Natural order: 0.29.10 after 0.29.9, 24B83 after 24A335."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in re.findall(r"\d+|\D+", value)
    )


def side_of(record: Mapping[str, Any], split: str) -> str | None:
    value = (record.get("settings") or {}).get(SPLITS[split])
    return None if value is None else str(value)


def canary(records: Iterable[Mapping[str, Any]], split: str, before: str | None = None) -> Canary:
    """The delta between the two sides of `split` over `records` (each carrying its `host`);
    `before` names the old side (default: the lower version). CanaryError when the split is
    unknown, leaves one side empty or more than two, or no cell shape ran on both."""
    if split not in SPLITS:
        raise CanaryError(f"--split {split!r}: choose from {', '.join(SPLITS)}")
    sides: dict[str, dict[tuple, dict[str, float]]] = {}
    for record in records:
        value = side_of(record, split)
        speed = record.get("tokens_per_sec")
        if value is None or record.get("status") != OK or not speed:
            continue
        if judge(dict(record))["verdict"] != VALID:
            continue
        cells = sides.setdefault(value, {})
        cells.setdefault(cell_key(record), {})[str(record.get("host"))] = float(speed)
    if len(sides) != 2:
        found = ", ".join(sorted(sides, key=version_order)) or "none"
        raise CanaryError(
            f"--split {split} needs exactly two sides among valid cells; found {found}"
        )
    old, new = sorted(sides, key=version_order)
    if before is not None:
        if before not in sides:
            raise CanaryError(f"--before {before!r} is not a side (found {old}, {new})")
        old, new = before, new if before == old else old
    shared = [key for key in sides[old] if key in sides[new]]
    if not shared:
        raise CanaryError(f"no cell ran on both sides ({old}, {new}): pin the same cell on both")
    deltas = [_cell_delta(key, sides[old][key], sides[new][key]) for key in shared]
    return _pooled(split, old, new, deltas, sides)


def _cell_delta(key: tuple, before: Mapping[str, float], after: Mapping[str, float]) -> CellDelta:
    a, b = list(before.values()), list(after.values())
    ratio = statistics.fmean(b) / statistics.fmean(a)
    se = None
    if len(a) > 1 and len(b) > 1:
        se = math.sqrt(_share_var(a) + _share_var(b))
    return CellDelta(str(key[0]), a, b, ratio, se)


def _share_var(values: list[float]) -> float:
    """The variance of log(mean) by the delta method: s^2 / (n mean^2)."""
    return statistics.variance(values) / (len(values) * statistics.fmean(values) ** 2)


def _pooled(
    split: str, old: str, new: str, deltas: list[CellDelta], sides: Mapping[str, Mapping]
) -> Canary:
    logs = [math.log(d.ratio) for d in deltas]
    estimate = statistics.fmean(logs)
    hosts = tuple(len({h for cell in sides[side].values() for h in cell}) for side in (old, new))
    result = Canary(split, old, new, math.exp(estimate) - 1.0, None, None, hosts, deltas)  # type: ignore[arg-type]
    if any(d.se is None for d in deltas):
        return result  # a side with one host: no interval, said as nil
    variances = [d.se**2 for d in deltas]  # type: ignore[operator]
    se = math.sqrt(sum(variances)) / len(deltas)
    df = _welch_df(deltas)
    half = t975(max(1, round(df))) * se
    result.low, result.high = math.exp(estimate - half) - 1.0, math.exp(estimate + half) - 1.0
    return result


def _welch_df(deltas: list[CellDelta]) -> float:
    """Welch-Satterthwaite over every cell's two sides."""
    parts = [(_share_var(side), len(side) - 1) for d in deltas for side in (d.before, d.after)]
    total = sum(var for var, _ in parts)
    spread = sum(var**2 / df for var, df in parts if var > 0)
    return total**2 / spread if spread else float(sum(df for _, df in parts))
