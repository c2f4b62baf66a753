"""Fault injection for the verdicts, as DCGM's error injection (dcgmi test --inject): a way to
see every verdict on a machine that can produce none of them. Pure parsing; docs/performance.md
(Fault injection) documents it.

MLX_FLEET_INJECT holds comma-separated faults, each KIND[=VALUE][@CELL], CELL the 1-based
position of a cell in its run's matrix (every cell when absent):

  sleep[=SECONDS]        the sleep-inclusive clock jumps SECONDS (5) inside the first timed window
  gpu-error[=KIND]       the job process prints Metal's command-buffer error KIND (Timeout,
                         PageFault, ImpactingInteractivity) and aborts, as Metal does
  reboot                 the boot time read before the cell moves on (a reboot between cells)
  hot-start[=CELSIUS]    the cell's cool-start wait sees CELSIUS (90) throughout, so it waits
                         its whole --cool-start-limit and the cell runs flagged hot-start
  low-power              settings say Low Power Mode is on
  on-battery             settings say the Mac runs on battery
  slow=F (or slow:F)     every timed iteration sleeps until it took 1/F of its time, so the
                         cell runs at F (0 < F < 1) of its speed: a sick Mac for fleet health
  step-delay=SECONDS     every timed iteration (and a group cell's probe step, and a
  (or step-delay:S)      cooperative gang's step) sleeps SECONDS (0.1) before its work: one
                         slow rank of a group, a straggler
  late=SHARE             that share (0.3) of a serving cell's requests, drawn by its seed, is
                         held 1.5 TTFT SLOs before the engine sees it: each misses the SLO

An injected fault is recorded in the cell's `injected` list and flagged `injected`, so nothing
injected is ever shown as measured.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

ENV = "MLX_FLEET_INJECT"
GPU_ERROR_KINDS = ("Timeout", "PageFault", "ImpactingInteractivity")
DEFAULTS: dict[str, str | None] = {
    "sleep": "5",
    "gpu-error": "Timeout",
    "reboot": None,
    "hot-start": "90",
    "low-power": None,
    "on-battery": None,
    "slow": "0.5",
    "step-delay": "0.1",
    "late": "0.3",
}
INJECTED_FLAG = "injected"
NUMBERS = {
    "sleep": (0.0, 1e6),
    "hot-start": (0.0, 200.0),
    "slow": (0.0, 1.0),
    "step-delay": (0.0, 3600.0),
    "late": (0.0, 1.0),
}
"""The faults whose value is a number, with the open range it must lie in."""


@dataclass(frozen=True)
class Fault:
    kind: str
    value: str | None
    cell: int | None
    """1-based cell number in the run's matrix; None: every cell."""


def parse(text: str) -> tuple[Fault, ...]:
    """MLX_FLEET_INJECT's faults; ValueError with one line naming the first bad one."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        spec, _, where = item.partition("@")
        if "=" not in spec:
            spec = spec.replace(":", "=", 1)  # the spelling, slow:0.6
        kind, has_value, value = spec.partition("=")
        kind = kind.strip()
        if kind not in DEFAULTS:
            raise ValueError(f"{ENV}: unknown fault {kind!r} (known: {', '.join(DEFAULTS)})")
        if has_value and DEFAULTS[kind] is None:
            raise ValueError(f"{ENV}: {kind} takes no value")
        fault_value = value.strip() if has_value else DEFAULTS[kind]
        _check_value(kind, fault_value)
        faults.append(Fault(kind, fault_value, _cell_number(where) if where else None))
    return tuple(faults)


def _check_value(kind: str, value: str | None) -> None:
    if kind == "gpu-error" and value not in GPU_ERROR_KINDS:
        raise ValueError(f"{ENV}: gpu-error={value} (known: {', '.join(GPU_ERROR_KINDS)})")
    if kind in NUMBERS:
        try:
            number = float(value or "")
        except ValueError:
            raise ValueError(f"{ENV}: {kind}={value} is not a number") from None
        low, high = NUMBERS[kind]
        if not low < number < high:
            raise ValueError(f"{ENV}: {kind}={value} is out of range ({low:g} to {high:g})")


def _cell_number(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise ValueError(f"{ENV}: @{text} is not a cell number (1, 2, ...)")
    return int(text)


def from_environ(environ: Mapping[str, str] = os.environ) -> tuple[Fault, ...]:
    return parse(environ.get(ENV, ""))


def for_cell(faults: tuple[Fault, ...], number: int) -> dict[str, str | None]:
    """The faults injected into cell `number` (1-based): kind -> value."""
    return {f.kind: f.value for f in faults if f.cell is None or f.cell == number}
