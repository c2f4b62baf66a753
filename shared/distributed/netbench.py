"""What `coordinator netbench` measures over a ring of hosts and how it reads the timings: the
message sizes, nccl-tests' two bandwidths, and the rule that names a slow link. Pure: the
timing itself runs in the ranks, through MLX's distributed backend (agent.cluster).

The bandwidths follow nccl-tests' doc/PERFORMANCE.md: the algorithm bandwidth is the bytes of
the message over the time, the bus bandwidth that times the share of the data each link really
carries, 2(n-1)/n for an all-reduce and 1 for a send/receive, so that a ring and a single link
read on the same scale as the wire's speed. Gigabytes are 10**9 bytes, as nccl-tests prints.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.stats import spread

KIB = 1024
MIB = KIB * KIB
ELEMENT_BYTES = 4
"""Messages are float32 vectors: a size is a whole number of them."""
SMALLEST_BYTES = ELEMENT_BYTES
LARGEST_BYTES = 1024 * MIB
DEFAULT_SIZES = tuple(KIB * 4**step for step in range(10))
"""1 KiB … 256 MiB, each four times the one before: latency at the small end, the link's
bandwidth at the large end."""
ALL_SUM, SEND_RECV = "all_sum", "send_recv"
BUS_SHARE = {ALL_SUM: lambda ranks: 2 * (ranks - 1) / ranks, SEND_RECV: lambda ranks: 1.0}
OPS_MOST = 20
"""nccl-tests' default iterations: back-to-back operations per timed repetition."""
OPS_BYTES = 64 * MIB
"""Fewer operations per repetition for large messages, so one moves at most this much."""
SLOW_SHARE = 0.30
"""A link whose bus bandwidth is at least this far below the median of its siblings' is slow."""

_UNITS = {
    "": 1,
    "b": 1,
    "k": KIB,
    "kib": KIB,
    "m": MIB,
    "mib": MIB,
    "g": 1024 * MIB,
    "gib": 1024 * MIB,
}
_SIZE = re.compile(r"(\d+)\s*([a-z]*)")


def ops_per_repetition(size: int) -> int:
    """How many back-to-back operations one timed repetition runs at `size`: OPS_MOST, fewer
    above 3 MiB so a repetition moves at most OPS_BYTES, at least one."""
    return max(1, min(OPS_MOST, OPS_BYTES // size))


class NetbenchError(ValueError):
    """A netbench request that cannot be run: one line naming the problem."""


def parse_size(text: str) -> int:
    """`4096`, `64K`, `64KiB`, `1M`, `1G` (powers of 1024) as bytes."""
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None or match.group(2) not in _UNITS:
        raise NetbenchError(f"size {text.strip()!r} is not a byte count like 4096, 64K or 1M")
    return int(match.group(1)) * _UNITS[match.group(2)]


def parse_sizes(text: str) -> tuple[int, ...]:
    """A comma list of sizes, each a whole number of float32 elements within
    SMALLEST_BYTES..LARGEST_BYTES, strictly increasing."""
    sizes = tuple(parse_size(part) for part in text.split(",") if part.strip())
    if not sizes:
        raise NetbenchError("no message sizes given")
    for size in sizes:
        if not SMALLEST_BYTES <= size <= LARGEST_BYTES:
            raise NetbenchError(
                f"size {format_bytes(size)} is outside {format_bytes(SMALLEST_BYTES)} … "
                f"{format_bytes(LARGEST_BYTES)}"
            )
        if size % ELEMENT_BYTES:
            raise NetbenchError(f"size {size} B is not a whole number of float32 elements")
    for before, after in zip(sizes, sizes[1:], strict=False):
        if after <= before:
            raise NetbenchError(
                f"sizes must increase: {format_bytes(after)} follows {format_bytes(before)}"
            )
    return sizes


def format_bytes(size: int) -> str:
    """1024 → `1 KiB`, 268435456 → `256 MiB`; other counts in bytes."""
    for unit, scale in (("GiB", 1024 * MIB), ("MiB", MIB), ("KiB", KIB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


@dataclass(frozen=True)
class Measured:
    """One operation at one size over `where` (the ring's hosts, or one link): the time of
    each repetition, in seconds."""

    operation: str
    size: int
    ranks: int
    seconds: tuple[float, ...]
    where: str = ""

    def summary(self) -> dict[str, float | None]:
        """The mean time (µs) and its standard deviation over the repetitions; the algorithm
        and bus bandwidths (GB/s) from the mean time, as nccl-tests computes them (a mean of
        per-repetition rates would read high whenever the times spread), their ± the time's
        relative spread carried over (the delta method)."""
        if not self.seconds or min(self.seconds) <= 0:
            raise NetbenchError(f"{self.operation} {format_bytes(self.size)}: no positive timing")
        time_s = spread(self.seconds)
        mean, std = time_s["mean"], time_s["std"]
        assert mean is not None
        algbw = self.size / mean / 1e9
        busbw = algbw * BUS_SHARE[self.operation](self.ranks)
        relative = None if std is None else std / mean
        return {
            "time_us": mean * 1e6,
            "time_us_std": None if std is None else std * 1e6,
            "algbw_gbps": algbw,
            "algbw_gbps_std": None if relative is None else algbw * relative,
            "busbw_gbps": busbw,
            "busbw_gbps_std": None if relative is None else busbw * relative,
        }


def stored_measurement(measured: Measured) -> dict[str, object]:
    """A measurement as the run store keeps it (a cell record, named and `ok`): its raw
    timings, from which every figure is computed again when it is shown."""
    return {
        "name": f"{measured.operation} {measured.where} {format_bytes(measured.size)}",
        "status": "ok",
        "operation": measured.operation,
        "where": measured.where,
        "size": measured.size,
        "ranks": measured.ranks,
        "seconds": list(measured.seconds),
    }


def measurement_of(record: Mapping[str, Any]) -> Measured:
    """stored_measurement's record as the measurement again."""
    seconds = tuple(float(second) for second in record["seconds"])
    return Measured(record["operation"], record["size"], record["ranks"], seconds, record["where"])


def slow_links(busbw: Mapping[str, float], share: float = SLOW_SHARE) -> dict[str, str]:
    """The links at least `share` below the median bus bandwidth of the others, each with the
    figures that say so. One link alone has no siblings and is never called slow."""
    flagged: dict[str, str] = {}
    for link, value in busbw.items():
        others = [other for name, other in busbw.items() if name != link]
        if not others:
            continue
        typical = statistics.median(others)
        if typical > 0 and value <= (1 - share) * typical:
            flagged[link] = (
                f"{value:.3g} GB/s, {1 - value / typical:.0%} below its siblings' "
                f"median of {typical:.3g} GB/s"
            )
    return flagged


def ring_edges(hosts: Sequence[str]) -> list[tuple[int, int]]:
    """The links a ring over `hosts` uses: each rank to the next, the last back to the first
    (one link for two hosts)."""
    count = len(hosts)
    if count < 2:
        return []
    if count == 2:
        return [(0, 1)]
    return [(rank, (rank + 1) % count) for rank in range(count)]


def link_name(hosts: Sequence[str], edge: tuple[int, int]) -> str:
    """`mac1↔mac2`."""
    return f"{hosts[edge[0]]}↔{hosts[edge[1]]}"


def measured_from(
    raw: object, sizes: Sequence[int], hosts: Sequence[str], reps: int
) -> list[Measured]:
    """Rank 0's report (agent.cluster.netbench's JSON) checked against what was asked: every
    size of the ring's all_sum and of each of its links, `reps` positive finite timings each.
    A peer's report is not trusted: NetbenchError names the first thing wrong."""
    if not isinstance(raw, dict):
        raise NetbenchError("the report is not a map")
    found: list[Measured] = []
    links = raw.get("send_recv")
    if not isinstance(links, dict):
        raise NetbenchError("the report has no send_recv map")
    expected = {link_name(hosts, edge) for edge in ring_edges(hosts)}
    if set(links) != expected:
        raise NetbenchError(f"the report's links {sorted(links)} are not {sorted(expected)}")
    series = [(ALL_SUM, len(hosts), "+".join(hosts), raw.get("all_sum"))]
    series += [(SEND_RECV, 2, link, links[link]) for link in sorted(expected)]
    for operation, ranks, where, by_size in series:
        if not isinstance(by_size, dict):
            raise NetbenchError(f"{where}: no timings")
        for size in sizes:
            seconds = by_size.get(str(size))
            if not (
                isinstance(seconds, list)
                and len(seconds) == reps
                and all(
                    isinstance(s, (int, float)) and not isinstance(s, bool) and 0 < s < 1e6
                    for s in seconds
                )
            ):
                raise NetbenchError(
                    f"{where} at {format_bytes(size)}: expected {reps} positive timings"
                )
            timings = tuple(float(second) for second in seconds)
            found.append(Measured(operation, size, ranks, timings, where))
    return found


def progress_total(sizes: Sequence[int], hosts: Sequence[str], warmup: int, reps: int) -> int:
    """Units of progress a rank reports over a whole run (progress_step)."""
    return 1 + len(sizes) * (1 + len(ring_edges(hosts))) * (warmup + reps + 2)


def progress_step(
    done: int, sizes: Sequence[int], hosts: Sequence[str], warmup: int, reps: int
) -> str:
    """What a rank that reports `done` units is doing now: every rank counts the same units in
    the same order, each outside the timed regions: the ring formed; then at each size, for the
    all_sum and each link in turn, the barrier before it, each repetition (warm-ups first) and
    the all_sum that gathers its timings. A rank off a link counts that link's repetitions as
    it starts waiting for them, so `done` names the same step on every rank."""
    if done <= 0:
        return "forming the ring"
    if done >= progress_total(sizes, hosts, warmup, reps):
        return "reporting, every step done"
    per_op = warmup + reps + 2
    links = [link_name(hosts, edge) for edge in ring_edges(hosts)]
    op_index, within = divmod(done - 1, per_op)
    size_index, which = divmod(op_index, 1 + len(links))
    at = format_bytes(sizes[size_index])
    op = f"all_sum at {at}" if which == 0 else f"send_recv {links[which - 1]} at {at}"
    if within == 0:
        return f"the barrier before {op}"
    if within == per_op - 1:
        return f"the all_sum gathering the timings of {op}"
    if within <= warmup:
        return f"{op}, warm-up {within} of {warmup}"
    return f"{op}, repetition {within - warmup} of {reps}"


def stalled(progress: Sequence[tuple[int, float] | None], host_timeout: float) -> int | None:
    """The rank to name when no rank has progressed for longer than `host_timeout` (each given
    as (units done, seconds since its last), None where unknown): the one with the fewest
    units done, the step the others wait on, the first of those; None while any rank
    progressed within it. No rank alone is judged: a rank off a link waits, without progress,
    for as long as that link is measured."""
    heard = [(rank, seen) for rank, seen in enumerate(progress) if seen is not None]
    if not heard or min(age for _, (_, age) in heard) <= host_timeout:
        return None
    return min(heard, key=lambda item: item[1][0])[0]


def link_bandwidths(found: Sequence[Measured]) -> dict[str, float]:
    """Each link's best bus bandwidth (its fastest repetition) at the largest size measured:
    small sizes measure latency, not the wire, and a busy Mac slows some repetitions of any
    link, while a slow cable slows every one."""
    largest = max((m.size for m in found if m.operation == SEND_RECV), default=None)
    return {
        m.where: m.size / min(m.seconds) / 1e9 * BUS_SHARE[SEND_RECV](m.ranks)
        for m in found
        if m.operation == SEND_RECV and m.size == largest
    }


def report_of(found: Sequence[Measured]) -> dict[str, object]:
    """What `-o json` prints and a table is drawn from: every measurement with its figures,
    and the slow links with the figures that make them so."""
    rows = [
        {
            "operation": m.operation,
            "where": m.where,
            "size": m.size,
            "ranks": m.ranks,
            "seconds": list(m.seconds),
            **m.summary(),
        }
        for m in found
    ]
    links = link_bandwidths(found)
    return {"results": rows, "links_best_busbw_gbps": links, "slow_links": slow_links(links)}


MOVING_WITHIN_S = 60.0
"""Past its bound a rank runs on while its progress moved this recently (or within its bound,
when that is shorter): a bound sized for links of 5 MB/s must not end a working run over a
slower one (issue 42: a 20 Mbit/s link failed a working run after 188 s)."""


def past_bound(
    rank: int,
    elapsed_s: float,
    bound_s: float,
    progress: int,
    age_s: float,
    most_s: float,
    watched_age_s: float | None = None,
) -> str | None:
    """Why a rank that has run `elapsed_s` ends now, or None while it may run on: within its
    bound; past it while its progress (`progress` units, the last `age_s` ago) still moves, or,
    once its ring formed (progress above 0), while a coordinator still asks about it
    (`watched_age_s` since it last did: a watching coordinator fails a run no rank moves in, and
    a rank off a slow link, or one repetition of a large message over it, goes minutes without
    progress of its own), up to `most_s` (the protocol's MAX_BOUND_S). A ring that never formed
    is no slow link: it ends at its bound, asked about or not."""
    if elapsed_s <= bound_s:
        return None
    within = min(MOVING_WITHIN_S, bound_s)
    watched = progress > 0 and watched_age_s is not None and watched_age_s <= within
    moving = age_s <= within or watched
    if moving and elapsed_s <= most_s:
        return None
    said = f"rank {rank} ran past its bound of {bound_s:g} s"
    if moving:
        return (
            f"{said} and the most a rank may run ({most_s:g} s), still progressing: its links "
            "are slower than the bound assumed"
        )
    return said if progress == 0 else f"{said}, with no progress for {age_s:.0f} s"
