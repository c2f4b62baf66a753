"""`coordinator doctor --level 3`, the burn-in, as data: its sustained run's plan, the links it
measures, and how each host is judged from its sustained cell and its links. Pure; the runs
are coordinator.commands.doctor_burn_in's.

A host fails level 3 for what fails level 2, and for: a sustained cell that failed, is invalid,
or reached no steady state; a steady tok/s below the band its family's earlier level-3 runs set
(shared.benchmark.health.band); a link of it that failed its netbench, or that is slow beside the
others (shared.distributed.netbench.slow_links over every link's best bus bandwidth at the
largest size). A throttle on its own fails nothing: a fanless Mac throttles by design, and its
family's band says whether it throttles more than its siblings.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.benchmark.health import band
from shared.benchmark.sustain import DEFAULT_WINDOW_S, STEADY_WINDOWS, SustainPlan, steady_unknown
from shared.benchmark.verdict import VALID, verdict_text
from shared.distributed.netbench import KIB, MIB, slow_links

DEFAULT_DURATION_S = 15 * 60.0
"""The sustained run's length by default: long enough for a Mac's die and case to settle."""
WINDOWS = 2 * (STEADY_WINDOWS + 1)
"""The fewest windows a burn-in's duration is cut into, so a short one still has a steady
state (STEADY_WINDOWS full windows after the first) and some to spare."""
LINK_SIZES = (4 * KIB, MIB, 64 * MIB)
"""Each link's latency, a middle size, and a size that measures the wire."""
LINK_REPETITIONS = 3
LINK_WARMUP = 1
NAMES = ("--duration", "its window")
"""What a plan's refusal calls the duration and the window (derived, never given)."""


def burn_in_plan(duration_s: float) -> SustainPlan:
    """The sustained run's plan: `duration_s` in windows of DEFAULT_WINDOW_S, shorter where the
    duration would hold fewer than WINDOWS; SustainError naming --duration past its bounds."""
    plan = SustainPlan(duration_s, min(DEFAULT_WINDOW_S, duration_s / WINDOWS))
    plan.check(names=NAMES)
    return plan


def every_link(hosts: Sequence[str]) -> list[tuple[str, str]]:
    """Every pair of hosts, each measured as a two-rank netbench of its own: a ring over all of
    them would measure only its neighbours' links."""
    return list(itertools.combinations(hosts, 2))


@dataclass
class Link:
    """One pair's netbench: its best bus bandwidth at the largest size, or why there is none."""

    hosts: tuple[str, str]
    busbw_gbps: float | None = None
    error: str | None = None
    run_id: str | None = None

    @property
    def name(self) -> str:
        return f"{self.hosts[0]}↔{self.hosts[1]}"

    def peer(self, host: str) -> str:
        """The other end from `host`."""
        return self.hosts[1] if host == self.hosts[0] else self.hosts[0]


def judge_links(host: str, links: Sequence[Link]) -> tuple[list[dict[str, Any]], list[str]]:
    """The host's links as rows ({link, peer, busbw_gbps, error, slow, run_id}) and why they
    fail it: a link that failed, or one slow beside all the links measured."""
    slow = slow_links({link.name: link.busbw_gbps for link in links if link.busbw_gbps})
    rows, why = [], []
    for link in links:
        if host not in link.hosts:
            continue
        rows.append(
            {
                "link": link.name,
                "peer": link.peer(host),
                "busbw_gbps": link.busbw_gbps,
                "error": link.error,
                "slow": slow.get(link.name),
                "run_id": link.run_id,
            }
        )
        if link.error is not None:
            why.append(f"link to {link.peer(host)} failed: {link.error}")
        elif link.name in slow:
            why.append(f"link to {link.peer(host)} is slow: {slow[link.name]}")
    return rows, why


def judge_sustained(
    cell: Mapping[str, Any] | None, history: Sequence[float], missing: str
) -> tuple[dict[str, Any], list[str]]:
    """A host's sustained cell as figures (first and steady tok/s, their ratio, when it
    throttled, its family's band) and why it fails; `missing` says why there is no cell."""
    found: dict[str, Any] = {
        "first_tokens_per_sec": None,
        "steady_tokens_per_sec": None,
        "throttle_ratio": None,
        "time_to_throttle_s": None,
        "steady_band": band(history),
        "steady_band_runs": len(history),
    }
    if cell is None:
        return found, [missing]
    sustain = cell.get("sustain") or {}
    for key in ("first_tokens_per_sec", "steady_tokens_per_sec", "throttle_ratio"):
        found[key] = sustain.get(key)
    found["time_to_throttle_s"] = sustain.get("time_to_throttle_s")
    if cell.get("verdict") != VALID:
        return found, [f"the sustained run is {verdict_text(dict(cell))}"]
    steady = found["steady_tokens_per_sec"]
    if steady is None:
        return found, [f"no steady state: {steady_unknown(sustain) if sustain else 'no windows'}"]
    low_high = found["steady_band"]
    if low_high is not None and steady < low_high[0]:
        return found, [
            f"steady {steady:.1f} tok/s below its family's band ({low_high[0]:.1f} to "
            f"{low_high[1]:.1f}, from {len(history)} level-3 results; median "
            f"{statistics.median(history):.1f})"
        ]
    return found, []
