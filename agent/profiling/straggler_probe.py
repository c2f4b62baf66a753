"""A group cell's straggler probe (shared.distributed.stragglers reads what it sends): after the
cell's timed iterations, PROBE_STEPS more of the same iteration, untimed for the cell's figures,
each split into the rank's own compute and its wait in collectives; then a small message's
one-way time over each of the ring's links.

Compute and wait are told apart by agent.cluster.collective_clock; its extra evaluation points
are why the probe is not the timed iterations themselves: those stay as measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx

from agent.cluster.collective_clock import CollectiveClock
from agent.cluster.netbench import Progress, barrier, gathered, ping_pong_seconds
from agent.profiling.rank_group import RankGroup
from shared.distributed.netbench import ELEMENT_BYTES, link_name, ring_edges
from shared.distributed.stragglers import LINK_BYTES, PROBE_STEPS

LINK_WARMUP, LINK_REPETITIONS, LINK_OPS = 1, 5, 2

Step = Callable[[], Any]
"""One iteration of the cell, its inputs ready: runs and evaluates it."""


def probe(rank_group: RankGroup, next_step: Callable[[], Step]) -> dict[str, Any]:
    """PROBE_STEPS steps (`next_step` readies each, outside the clock), split, then the links:
    the rank record's `probe` (docs/protocol.md §17). Every rank runs the same collectives."""
    clock = CollectiveClock()
    compute, wait = [], []
    for _ in range(PROBE_STEPS):
        step = next_step()
        clock.wait_s = 0.0
        with clock.timing():
            start = time.perf_counter()
            step()
            elapsed = time.perf_counter() - start
        wait.append(clock.wait_s)
        compute.append(max(0.0, elapsed - clock.wait_s))
    links = link_seconds(rank_group)
    if clock.untimed:  # collectives inside a compiled function: the split is not known
        return {"compute_s": [], "wait_s": [], "untimed": clock.untimed, "links_s": links}
    return {"compute_s": compute, "wait_s": wait, "links_s": links}


def link_seconds(rank_group: RankGroup) -> dict[str, list[float]]:
    """Each ring link's one-way seconds for a LINK_BYTES message (netbench's ping-pong, shortened),
    on every rank."""
    group, names = rank_group.group, rank_group.spec.names
    message = mx.ones((LINK_BYTES // ELEMENT_BYTES,), dtype=mx.float32)
    mx.eval(message)
    links = {}
    for edge in ring_edges(names):
        barrier(group)
        mine = ping_pong_seconds(
            group, message, edge, LINK_WARMUP, LINK_REPETITIONS, LINK_OPS, Progress(None)
        )
        links[link_name(names, edge)] = gathered(group, mine, edge[0], LINK_REPETITIONS)
    return links
