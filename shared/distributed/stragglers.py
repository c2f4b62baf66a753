"""Which rank holds a distributed cell back, and whether it is the rank's own compute or a link:
NVIDIA resiliency-ext's two straggler scores per rank, and a verdict. Pure.

Each rank of a group cell reports its `probe` (agent.profiling.straggler_probe): per probe step
the seconds it computed (its own work, the time it was not blocked in a collective) and the
seconds it waited in collectives, and the one-way time of a small message over each of the
ring's links (the fastest of its repetitions: a slow link is slow every time, a busy CPU
only at times). From them, per rank:
- relative score: the best rank's median compute ÷ this rank's (1.0 for the best rank);
- individual score: this rank's best step's compute ÷ its median (1.0: no slower than its best).

The verdict (docs/distributed.md, Stragglers):
- `compute`: one rank's relative score is under RELATIVE_FLOOR, even its fastest step is that
  far behind the fastest rank's (slow every step, not at a busy moment), it computes at least
  EXCESS_FLOOR_S a step more than the best rank, and the other ranks wait on it (their median
  wait is at least half that excess): a host outlier, named;
- `link`: every rank waits in its collectives at least as long as one link is slow, and that
  link's one-way time is LINK_FACTOR times its sibling links' (the median of their faster
  half, so a host whose cable slows two of three links is still seen; with no sibling: the
  one-way time netbench stored for it) and LINK_EXCESS_S above it: a link outlier, named, with
  netbench's stored figure for it where there is one;
- both, `compute+link`; `none` when nothing stands out; `unavailable` (with why) when a rank
  sent no probe.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared import shapes as s
from shared.distributed.netbench import SEND_RECV, link_name, ring_edges

PROBE_STEPS = 3
"""Probe steps a rank runs after a group cell's timed iterations (the same on every rank)."""
LINK_BYTES = 4096
"""The link probe's message: netbench's 4K size, so its stored figure compares."""
PROBE_MOST = 64
MAX_LINKS = 64
MAX_SECONDS = 86_400.0
MAX_TEXT = 65_536
"""A verdict's `why` and `link` over a group of 64 ranks and links, with room to spare."""
RELATIVE_FLOOR = 0.7
"""A rank computing more than 1/0.7 of the best rank's time a step is a compute straggler (0.7:
nvidia-resiliency-ext's default `gpu_relative_perf_threshold`) ..."""
EXCESS_FLOOR_S = 0.002
"""... when that is also at least 2 ms a step: below it, a tiny cell's scheduling noise."""
LINK_FACTOR = 3.0
"""A link whose one-way time is 3x its siblings' median (or netbench's figure) is slow ..."""
LINK_EXCESS_S = 0.005
"""... and at least 5 ms slower: a busy machine's scheduler delays a wake-up by a few ms (2-4 ms
seen on loopback at load 6 on 2 cores), a link's hundreds of microseconds tripled are noise."""
COMPUTE, LINK, BOTH, NONE, UNAVAILABLE = "compute", "link", "compute+link", "none", "unavailable"
VERDICTS = (COMPUTE, LINK, BOTH, NONE, UNAVAILABLE)

_seconds = s.number(0, MAX_SECONDS)
_steps = s.list_of(_seconds, PROBE_MOST)
PROBE = s.fields(
    {"compute_s": _steps, "wait_s": _steps},
    {
        "links_s": s.map_of(s.list_of(_seconds, PROBE_MOST), MAX_LINKS),
        "untimed": s.integer(0, 2**31),
    },
)
"""A rank record's `probe` (docs/protocol.md §17): what its agent measured, checked as any field
a peer sends."""
_score = s.nil_or(s.number(0, 1))
STRAGGLERS = s.fields(
    {"verdict": s.one_of(VERDICTS), "why": s.text(MAX_TEXT)},
    {
        "rank": s.nil_or(s.integer(0, 255)),
        "host": s.nil_or(s.text(64)),
        "link": s.nil_or(s.text(MAX_TEXT)),
        "ranks": s.list_of(
            s.fields(
                {"rank": s.integer(0, 255), "host": s.text(64)},
                {
                    "compute_s": s.nil_or(_seconds),
                    "wait_s": s.nil_or(_seconds),
                    "relative": _score,
                    "individual": _score,
                },
            ),
            256,
        ),
        "links": s.list_of(
            s.fields(
                {"link": s.text(129), "one_way_s": _seconds},
                {"netbench_s": s.nil_or(_seconds)},
            ),
            MAX_LINKS,
        ),
    },
)
"""A group cell's `stragglers` as the coordinator stores it."""
UNEQUAL = " (the ranks hold unequal shares: their compute is not compared)"
RECORD_FIELDS = {"probe": PROBE, "stragglers": STRAGGLERS}


def probe_problem(probe: Any) -> str | None:
    """Why a rank's `probe` cannot be used, or None: its shape, and as many wait as compute
    figures, at least one."""
    try:
        PROBE(probe)
    except s.Invalid as exc:
        return f"probe{exc}" if str(exc).startswith(".") else f"probe {exc}"
    if probe.get("untimed"):
        return (
            f"{probe['untimed']} of its collectives ran inside a compiled function, where "
            "nothing can be timed: its compute and wait are not told apart"
        )
    if not probe["compute_s"] or len(probe["compute_s"]) != len(probe["wait_s"]):
        return "probe has no step, or not one wait per compute figure"
    return None


def same_link(name: str) -> frozenset[str]:
    """`a↔b` and `b↔a` are one link."""
    return frozenset(name.split("↔"))


def analyse(
    hosts: Sequence[str],
    probes: Sequence[Mapping[str, Any] | None],
    netbench: Mapping[str, float] | None = None,
    injected: Sequence[Sequence[str]] = (),
    equal_shares: bool = True,
) -> dict[str, Any]:
    """The group's `stragglers` from each rank's probe (in rank order; None: the rank sent
    none) and, where stored, netbench's one-way seconds per link name; `injected` each rank's
    injected faults (MLX_FLEET_INJECT), said beside a rank named for them. Ranks that do not
    hold equal shares of the work (a pipeline's: rank 0 holds the head, a stage waits for the
    one before it by design) are scored but never named for their compute."""
    problems = [probe_problem(probe) if probe else "no probe" for probe in probes]
    missing = [f"rank {rank} ({hosts[rank]}): {why}" for rank, why in enumerate(problems) if why]
    if missing:
        return {"verdict": UNAVAILABLE, "why": "; ".join(missing)}
    valid = [p for p in probes if p is not None]
    compute = [statistics.median(p["compute_s"]) for p in valid]
    waits = [statistics.median(p["wait_s"]) for p in valid]
    best = min(compute)
    fastest = [min(p["compute_s"]) for p in valid]
    ranks = [
        {
            "rank": rank,
            "host": hosts[rank],
            "compute_s": compute[rank],
            "wait_s": waits[rank],
            "relative": _ratio(best, compute[rank]),
            "individual": _ratio(min(valid[rank]["compute_s"]), compute[rank]),
        }
        for rank in range(len(valid))
    ]
    ring = {link_name(hosts, edge) for edge in ring_edges(hosts)}  # a peer's others: ignored
    measured = {k: v for k, v in (valid[0].get("links_s") or {}).items() if k in ring}
    links = _links(measured, netbench or {})
    found = [
        finding
        for finding in (
            _compute(ranks, fastest, injected) if equal_shares else None,
            _slow_links(links, waits),
        )
        if finding is not None
    ]
    result: dict[str, Any] = {"verdict": NONE, "rank": None, "host": None, "link": None}
    if not found:
        result["why"] = "no rank or link stands out" + ("" if equal_shares else UNEQUAL)
    else:
        for finding in found:
            result.update({k: v for k, v in finding.items() if k != "why"})
        result["verdict"] = BOTH if len(found) == 2 else found[0]["verdict"]
        result["why"] = "; ".join(finding["why"] for finding in found)
    return {**result, "ranks": ranks, "links": links}


def netbench_one_way(records: Iterable[Mapping[str, Any]], hosts: Sequence[str]) -> dict:
    """One stored netbench run's one-way seconds (the mean) per link between two of `hosts`, at
    LINK_BYTES, else at the smallest size it measured (stored records: netbench's cells)."""
    found: dict[str, tuple[tuple[bool, int], float]] = {}
    for record in records:
        where, size, seconds = record.get("where"), record.get("size"), record.get("seconds")
        if record.get("operation") != SEND_RECV or not isinstance(where, str):
            continue
        if not same_link(where) <= set(hosts) or not isinstance(size, int) or not seconds:
            continue
        rank = (size != LINK_BYTES, size)
        if where not in found or rank < found[where][0]:
            found[where] = (rank, statistics.fmean(seconds))
    return {where: seconds for where, (_, seconds) in found.items()}


def _ratio(better: float, this: float) -> float:
    return 1.0 if this <= 0 else min(1.0, better / this)


def _compute(
    ranks: list[dict[str, Any]], fastest: Sequence[float], injected: Sequence[Sequence[str]]
) -> dict[str, Any] | None:
    slowest = min(ranks, key=lambda rank: (rank["relative"], -rank["rank"]))
    best = min(rank["compute_s"] for rank in ranks)
    excess = slowest["compute_s"] - best
    others = [rank["wait_s"] for rank in ranks if rank is not slowest]
    if slowest["relative"] >= RELATIVE_FLOOR or excess < EXCESS_FLOOR_S:
        return None
    if fastest[slowest["rank"]] * RELATIVE_FLOOR < min(fastest):
        return None  # slow at times, not every step: a busy moment, not the rank's compute
    if statistics.median(others) < excess / 2:
        return None
    return {
        "verdict": COMPUTE,
        "rank": slowest["rank"],
        "host": slowest["host"],
        "why": (
            f"rank {slowest['rank']} ({slowest['host']}) computes {_ms(slowest['compute_s'])} a "
            f"step, {slowest['compute_s'] / best:.1f}x the best rank's {_ms(best)}; the others "
            f"wait {_ms(statistics.median(others))} a step in collectives, it "
            f"{_ms(slowest['wait_s'])}" + _injected(injected, slowest["rank"])
        ),
    }


def _injected(injected: Sequence[Sequence[str]], rank: int) -> str:
    kinds = injected[rank] if rank < len(injected) else []
    return f" (injected: {', '.join(kinds)})" if kinds else ""


def _links(measured: Mapping[str, Sequence[float]], netbench: Mapping[str, float]) -> list[dict]:
    stored = {same_link(name): seconds for name, seconds in netbench.items()}
    return [
        {
            "link": name,
            "one_way_s": min(seconds),  # a slow link is slow every time, a busy CPU at times
            "netbench_s": stored.get(same_link(name)),
        }
        for name, seconds in measured.items()
        if seconds
    ]


def _slow_links(links: list[dict[str, Any]], waits: Sequence[float]) -> dict[str, Any] | None:
    slow = []
    for link in links:
        siblings = sorted(other["one_way_s"] for other in links if other is not link)
        faster = siblings[: max(1, len(siblings) // 2)]  # a host's slow cable slows two links
        reference = statistics.median(faster) if siblings else link["netbench_s"]
        if reference is None:
            continue
        excess = link["one_way_s"] - reference
        if link["one_way_s"] >= LINK_FACTOR * reference and excess >= LINK_EXCESS_S:
            slow.append((link, reference, excess))
    if not slow or len(slow) == len(links) > 1 or min(waits) < min(e for _, _, e in slow):
        return None  # all slow is no outlier; ranks that do not wait are not held by it
    named = ", ".join(link["link"] for link, _, _ in slow)
    parts = [
        f"{link['link']} takes {_ms(link['one_way_s'])} one way, "
        f"{link['one_way_s'] / reference:.0f}x {'its siblings' if len(links) > 1 else 'netbench'}"
        f" ({_ms(reference)}){_netbench_note(link)}"
        for link, reference, _ in slow
    ]
    shared = frozenset.intersection(*(same_link(link["link"]) for link, _, _ in slow))
    if len(slow) > 1 and len(shared) == 1:
        parts.append(f"every slow link touches {next(iter(shared))}: its own cable or port")
    return {
        "verdict": LINK,
        "link": named,
        "why": f"{'; '.join(parts)}; every rank waits at least {_ms(min(waits))} a step",
    }


def _netbench_note(link: Mapping[str, Any]) -> str:
    stored = link.get("netbench_s")
    if stored is None:
        return "; netbench has no figure for it"
    if link["one_way_s"] >= LINK_FACTOR * stored:
        return f"; netbench measured {_ms(stored)} on it: slower now"
    return f"; netbench measured it slow too ({_ms(stored)})"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def mark(record: Mapping[str, Any]) -> str | None:
    """The fleet table's flag for a group cell with a straggler, None without one."""
    found = record.get("stragglers") or {}
    verdict = found.get("verdict")
    if verdict not in (COMPUTE, LINK, BOTH):
        return None
    marks = []
    if found.get("host") is not None:
        marks.append(f"straggler rank {found['rank']} ({found['host']}): compute")
    if found.get("link"):
        marks.append(f"slow link {found['link']}")
    return ", ".join(marks)


def straggler_line(record: Mapping[str, Any]) -> str | None:
    """The line a run prints as a group cell with a straggler lands: `pp32: straggler rank 2
    (c): compute: rank 2 (c) computes ...`; None without one."""
    found = mark(record)
    if found is None:
        return None
    return f"{record.get('name')}: {found}: {record['stragglers'].get('why')}"
