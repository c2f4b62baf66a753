"""Which Mac is sick: each valid cell scored against its family and against its own past.

Pure. A host's **family** is what should make identical Macs equally fast: chip, GPU cores,
memory, power mode, macOS build, MLX version, and (per cell) the model's weights digest and the
cell's shape. Every `valid` cell of a stored run gets a **relative score** (its tok/s over its
family's median on that cell, with the family's robust spread) and an **individual score** (over
the host's own best on that cell in its recent runs), as NVIDIA resiliency-ext scores a rank
against the best rank and against its own best.

The flags (docs/performance.md, Fleet health, has the rules and their measured false-flag rate):

- `out-of-family`: a host's score in a run (the median of its cells' relative scores) falls
  short of its family's median by more than max(K x the robust spread of its family's host
  scores, FLOOR). Only valid cells count, only cell families of at least MIN_FAMILY hosts, and a
  host is judged only where at least MIN_FAMILY hosts of its family have a score.
- `degraded`: a host's score against its own past (the median over its cells of tok/s over its
  median on that cell in the RECENT runs before) falls short by more than max(K x the robust
  spread of those earlier runs, FLOOR), judged only with at least MIN_HISTORY earlier runs.

The robust spread is the median absolute deviation scaled by 1.4826 (a normal sample's
standard deviation), relative to the median: one sick host cannot widen its own yardstick.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.benchmark.results import OK
from shared.benchmark.verdict import VALID, judge

OUT_OF_FAMILY = "out-of-family"
DEGRADED = "degraded"
FLAGS = (OUT_OF_FAMILY, DEGRADED)
MIN_FAMILY = 3
"""Hosts a family needs before anyone in it is scored: with two, neither is the odd one."""
K = 3.0
"""Robust deviations a shortfall must pass: measured against seeded fleets (docs/performance.md)."""
FLOOR = 0.05
"""The least shortfall ever flagged (5 %): a family of near-identical figures has a spread near
zero, and a 1 % gap between Macs is no sickness."""
MIN_HISTORY = 3
"""Earlier runs of a host on a cell before its own past can judge it."""
RECENT = 10
"""Earlier runs of a host on a cell that its individual score looks back over."""
MAD_SCALE = 1.4826
NO_FAMILY = "no family"

HOST_FIELDS = ("chip", "gpu_cores", "memory_gb")
SETTING_FIELDS = ("power_mode", "os_build", "mlx_version")
SHAPE_FIELDS = ("name", "model", "bits", "batch_size", "n_depth", "mode", "n_prompt", "n_gen")


@dataclass(frozen=True)
class Observation:
    """One valid cell of one stored run."""

    run: str
    started: str
    """When its run started (RFC 3339, UTC): the order of a host's past."""
    host: str
    family: tuple[Any, ...]
    """What makes two hosts siblings (HOST_FIELDS then SETTING_FIELDS)."""
    cell: tuple[Any, ...]
    """The cell's shape (SHAPE_FIELDS) and its weights digest."""
    tokens_per_sec: float


def family_of(machine: Mapping[str, Any] | None, settings: Mapping[str, Any] | None) -> tuple:
    machine, settings = machine or {}, settings or {}
    return tuple(machine.get(key) for key in HOST_FIELDS) + tuple(
        settings.get(key) for key in SETTING_FIELDS
    )


def family_label(family: Sequence[Any]) -> str:
    """`M2 Max 38-core 64 GB normal 24A335 mlx 0.29.1`, unknowns as `?`."""
    chip, cores, memory, mode, build, mlx = (("?" if v is None else v) for v in family)
    if isinstance(memory, (int, float)):
        memory = f"{memory:.0f}"
    return f"{chip} {cores}-core {memory} GB {mode} {build} mlx {mlx}"


def observation(
    run: str,
    started: str,
    host: str,
    machine: Mapping[str, Any] | None,
    record: Mapping[str, Any],
) -> Observation | None:
    """The cell as an observation, None unless it is ok, valid (judged again from its own
    fields: a stored verdict is not trusted) and has a positive tok/s. A group's cell (it has
    `ranks`) is a straggler's matter, not a host's; a sustained cell (`sustain`) measures
    minutes of load, throttling included, not the burst its shape's other cells measure."""
    if record.get("status") != OK or record.get("ranks") or record.get("sustain"):
        return None
    speed = record.get("tokens_per_sec")
    if not isinstance(speed, (int, float)) or isinstance(speed, bool) or not speed > 0:
        return None
    if judge(dict(record))["verdict"] != VALID:
        return None
    family = family_of(machine, record.get("settings"))
    return Observation(run, started, host, family, cell_key(record), float(speed))


def cell_key(record: Mapping[str, Any]) -> tuple[Any, ...]:
    """The cell's shape (SHAPE_FIELDS) and its weights digest: what two hosts must share for
    their figures to be compared."""
    settings = record.get("settings") or {}
    return tuple(record.get(key) for key in SHAPE_FIELDS) + (settings.get("weights_digest"),)


def robust_spread(values: Sequence[float]) -> float:
    """1.4826 x the median absolute deviation, over the median (0 for one value)."""
    middle = statistics.median(values)
    mad = statistics.median(abs(value - middle) for value in values)
    return MAD_SCALE * mad / middle if middle else 0.0


def threshold(spread: float) -> float:
    """The shortfall below 1.0 a score must pass to be flagged."""
    return max(K * spread, FLOOR)


@dataclass
class CellScore:
    host: str
    cell: tuple[Any, ...]
    tokens_per_sec: float
    family_size: int
    family_median: float | None = None
    family_spread: float | None = None
    relative: float | None = None
    """None: fewer than MIN_FAMILY hosts of its family ran the cell (`no family`)."""
    best: float | None = None
    individual: float | None = None
    """Over the host's own best on the cell in its RECENT earlier runs; None without any."""
    history: int = 0


@dataclass
class HostScore:
    host: str
    family: tuple[Any, ...]
    cells: list[CellScore] = field(default_factory=list)
    relative: float | None = None
    family_hosts: int = 0
    family_spread: float | None = None
    individual: float | None = None
    own_spread: float | None = None
    history: int = 0
    flags: list[str] = field(default_factory=list)
    why: list[str] = field(default_factory=list)


def score_run(run: str, observations: Iterable[Observation]) -> dict[str, HostScore]:
    """Every host of run `run` scored (its cells against their families in that run, and each
    against the host's RECENT earlier runs in `observations`) and flagged."""
    seen = list(observations)
    now = [o for o in seen if o.run == run]
    if not now:
        return {}
    started = now[0].started
    hosts: dict[str, HostScore] = {}
    for item in now:
        hosts.setdefault(item.host, HostScore(item.host, item.family))
    by_cell: dict[tuple, list[Observation]] = {}
    for item in now:
        by_cell.setdefault((item.family, item.cell), []).append(item)
    for (_, cell), members in by_cell.items():
        speeds = [member.tokens_per_sec for member in members]
        size = len({member.host for member in members})
        middle = statistics.median(speeds)
        for member in members:
            score = CellScore(member.host, cell, member.tokens_per_sec, size)
            if size >= MIN_FAMILY:
                score.family_median = middle
                score.family_spread = robust_spread(speeds)
                score.relative = member.tokens_per_sec / middle
            _score_past(score, member, seen, started)
            hosts[member.host].cells.append(score)
    _judge_families(hosts)
    for host in hosts.values():
        _judge_past(host, seen, started)
    return hosts


def _earlier(item: Observation, seen: list[Observation], started: str) -> list[float]:
    """The host's tok/s on the cell in its RECENT runs before `started`, one per run (the
    run's best)."""
    runs: dict[str, tuple[str, float]] = {}
    for other in seen:
        if other.host != item.host or other.cell != item.cell or other.started >= started:
            continue
        kept = runs.get(other.run)
        if kept is None or other.tokens_per_sec > kept[1]:
            runs[other.run] = (other.started, other.tokens_per_sec)
    newest = sorted(runs.values(), reverse=True)[:RECENT]
    return [speed for _, speed in newest]


def _score_past(score: CellScore, item: Observation, seen: list, started: str) -> None:
    past = _earlier(item, seen, started)
    score.history = len(past)
    if past:
        score.best = max(past)
        score.individual = item.tokens_per_sec / score.best


def _judge_families(hosts: dict[str, HostScore]) -> None:
    families: dict[tuple, list[HostScore]] = {}
    for host in hosts.values():
        relatives = [cell.relative for cell in host.cells if cell.relative is not None]
        if relatives:
            host.relative = statistics.median(relatives)
            families.setdefault(host.family, []).append(host)
    for members in families.values():
        spread = robust_spread([member.relative for member in members])  # type: ignore[misc]
        for member in members:
            member.family_hosts = len(members)
            if len(members) < MIN_FAMILY:
                continue
            member.family_spread = spread
            limit = threshold(spread)
            if member.relative is not None and member.relative < 1.0 - limit:
                member.flags.append(OUT_OF_FAMILY)
                member.why.append(
                    f"{(1 - member.relative) * 100:.1f} % below its {len(members)}-host family's "
                    f"median (flagged past {limit * 100:.1f} %)"
                )


def _judge_past(host: HostScore, seen: list[Observation], started: str) -> None:
    """The host against the median of its own earlier runs, cell by cell."""
    bests = [cell.individual for cell in host.cells if cell.individual is not None]
    if bests:
        host.individual = statistics.median(bests)
    shortfalls, spreads, histories = [], [], []
    for cell in host.cells:
        item = Observation("", started, host.host, host.family, cell.cell, cell.tokens_per_sec)
        past = _earlier(item, seen, started)
        if len(past) < MIN_HISTORY:
            continue
        shortfalls.append(cell.tokens_per_sec / statistics.median(past))
        spreads.append(robust_spread(past))
        histories.append(len(past))
    if not shortfalls:
        return
    host.own_spread = statistics.median(spreads)
    host.history = min(histories)
    own = statistics.median(shortfalls)
    limit = threshold(host.own_spread)
    if own < 1.0 - limit:
        host.flags.append(DEGRADED)
        host.why.append(
            f"{(1 - own) * 100:.1f} % below its own median of {host.history}+ earlier runs "
            f"(flagged past {limit * 100:.1f} %)"
        )


def as_dict(score: HostScore) -> dict[str, Any]:
    """A host's scores as `-o json` gives them: unknowns nil, `no family` said."""
    return {
        "host": score.host,
        "family": family_label(score.family),
        "family_hosts": score.family_hosts,
        "relative": score.relative,
        "family_spread": score.family_spread,
        "individual": score.individual,
        "own_spread": score.own_spread,
        "history": score.history,
        "flags": list(score.flags),
        "why": list(score.why),
        "state": None if score.relative is not None else NO_FAMILY,
    }


def mark_health(cells: list[dict[str, Any]], scores: Mapping[str, HostScore]) -> list[dict]:
    """Copies of a report's records with each scored cell's `relative_score` and
    `individual_score` (nil when it has none: `no family`, no past) and its host's flags among
    its `flags`, so every format shows them."""
    found = {(cell.host, cell.cell): cell for host in scores.values() for cell in host.cells}
    marked = []
    for record in cells:
        copy = dict(record)
        host = scores.get(str(record.get("host")))
        if host is not None and record.get("status") == OK:
            cell = found.get((host.host, cell_key(record)))
            if cell is not None:
                copy["relative_score"] = cell.relative
                copy["individual_score"] = cell.individual
            stale = [flag for flag in record.get("flags") or () if flag not in FLAGS]
            copy["flags"] = stale + list(host.flags)
        marked.append(copy)
    return marked


def band(history: Sequence[float]) -> tuple[float, float] | None:
    """The range a family's earlier figures on one cell allow (DCGM's diag with expected values
    learned from the fleet): their median x (1 -+ max(K x robust spread, FLOOR)); None with
    fewer than MIN_FAMILY figures."""
    if len(history) < MIN_FAMILY:
        return None
    middle = statistics.median(history)
    reach = threshold(robust_spread(history))
    return middle * (1 - reach), middle * (1 + reach)


DRIFT = "drift"
PANICKED = "panicked"
PANIC_WINDOW_S = 24 * 3600


def drifted(observations: Iterable[Observation], run: str) -> dict[str, str]:
    """Hosts of `run` whose macOS build or MLX version differs from what most of their
    hardware siblings (same chip, GPU cores, memory; at least MIN_FAMILY of them) run, each
    with why (config drift: exo#1599, mlx#3755)."""
    software: dict[str, tuple] = {}
    for item in observations:
        if item.run == run:
            software[item.host] = item.family
    by_hardware: dict[tuple, list[str]] = {}
    for host, family in software.items():
        by_hardware.setdefault(family[:3], []).append(host)
    found = {}
    for hosts in by_hardware.values():
        if len(hosts) < MIN_FAMILY:
            continue
        versions = [software[host][4:6] for host in hosts]
        usual = max(set(versions), key=versions.count)
        if versions.count(usual) * 2 <= len(versions):
            continue  # no majority: nobody is the odd one
        for host, version in zip(hosts, versions, strict=True):
            if version != usual:
                found[host] = (
                    f"macOS {version[0]}, MLX {version[1]} where {versions.count(usual)} of its "
                    f"{len(hosts)} siblings run macOS {usual[0]}, MLX {usual[1]}"
                )
    return found


def panicked(records: Iterable[Mapping[str, Any]], now: float) -> dict[str, str]:
    """Hosts whose cells carry a kernel panic report from the PANIC_WINDOW_S before `now`
    (Unix seconds), each with its newest panic's first line."""
    found: dict[str, tuple[float, str]] = {}
    for record in records:
        for panic in record.get("panics") or ():
            when = panic.get("time") if isinstance(panic, Mapping) else None
            if not isinstance(when, (int, float)) or now - when > PANIC_WINDOW_S:
                continue
            host = str(record.get("host"))
            if host not in found or when > found[host][0]:
                found[host] = (when, str(panic.get("panic_string") or panic.get("file")))
    return {host: f"kernel panic in the last 24 h: {text}" for host, (_, text) in found.items()}
