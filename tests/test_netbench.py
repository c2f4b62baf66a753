"""The link benchmark: its sizes and bandwidths as nccl-tests defines them (pure), and the
rank job timing MLX's own all_sum and send/recv over three real ring ranks on loopback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shared.distributed.netbench import (
    ALL_SUM,
    DEFAULT_SIZES,
    SEND_RECV,
    Measured,
    NetbenchError,
    format_bytes,
    measured_from,
    parse_sizes,
    progress_step,
    progress_total,
    ring_edges,
    slow_links,
    stalled,
)
from tests.ring_support import run_ranks


def test_the_default_sizes_run_from_1_kib_to_256_mib() -> None:
    assert format_bytes(DEFAULT_SIZES[0]) == "1 KiB"
    assert format_bytes(DEFAULT_SIZES[-1]) == "256 MiB"
    assert parse_sizes("1K,64KiB,1M,1g") == (1024, 65536, 1 << 20, 1 << 30)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "no message sizes given"),
        ("1K,1K", "sizes must increase: 1 KiB follows 1 KiB"),
        ("1M,64K", "sizes must increase: 64 KiB follows 1 MiB"),
        ("2G", "size 2 GiB is outside 4 B … 1 GiB"),
        ("0", "size 0 B is outside 4 B … 1 GiB"),
        ("6", "size 6 B is not a whole number of float32 elements"),
        ("1.5M", "size '1.5M' is not a byte count like 4096, 64K or 1M"),
        ("64X", "size '64X' is not a byte count like 4096, 64K or 1M"),
    ],
)
def test_bad_sizes_are_named(text: str, problem: str) -> None:
    with pytest.raises(NetbenchError) as caught:
        parse_sizes(text)
    assert str(caught.value) == problem


def test_bus_bandwidth_is_nccl_tests_share_of_the_algorithm_bandwidth() -> None:
    # 1 GB in 0.5 s is 2 GB/s; an all-reduce over 4 ranks moves 2(n-1)/n of it on each link
    ring = Measured(ALL_SUM, 10**9, 4, (0.5, 0.5)).summary()
    assert ring["algbw_gbps"] == pytest.approx(2.0)
    assert ring["busbw_gbps"] == pytest.approx(3.0)
    assert ring["time_us"] == pytest.approx(5e5) and ring["time_us_std"] == 0
    link = Measured(SEND_RECV, 10**9, 2, (0.25, 0.5)).summary()
    # from the mean time (0.375 s), not the mean of the rates (3 GB/s): nccl-tests' way
    assert link["busbw_gbps"] == link["algbw_gbps"] == pytest.approx(10 / 3.75)
    assert link["busbw_gbps_std"] == pytest.approx(10 / 3.75 * 0.17678 / 0.375, rel=1e-3)
    assert Measured(SEND_RECV, 4, 2, (0.1,)).summary()["busbw_gbps_std"] is None


def test_only_the_link_well_below_its_siblings_is_slow() -> None:
    flagged = slow_links({"a↔b": 1.0, "b↔c": 0.95, "c↔a": 0.5})
    assert flagged == {"c↔a": "0.5 GB/s, 49% below its siblings' median of 0.975 GB/s"}
    assert slow_links({"a↔b": 1.0, "b↔c": 0.8, "c↔a": 0.9}) == {}
    assert slow_links({"a↔b": 0.1}) == {}  # one link has no siblings


def test_a_ring_uses_each_link_once() -> None:
    assert ring_edges(["a"]) == []
    assert ring_edges(["a", "b"]) == [(0, 1)]
    assert ring_edges(["a", "b", "c"]) == [(0, 1), (1, 2), (2, 0)]


@pytest.mark.slow
def test_three_ring_ranks_time_every_size_and_every_link(tmp_path: Path) -> None:
    spec = {"sizes": [1024, 65536], "repetitions": 3, "warmup": 1, "hosts": ["a", "b", "c"]}
    argv = [sys.executable, "-m", "agent.cluster.netbench", json.dumps(spec)]
    outputs = run_ranks(tmp_path, 3, argv)
    assert outputs[1] == outputs[2] == ""  # rank 0 alone reports
    result = json.loads(outputs[0])
    assert set(result["send_recv"]) == {"a↔b", "b↔c", "c↔a"}
    for by_size in [result["all_sum"], *result["send_recv"].values()]:
        assert set(by_size) == {"1024", "65536"}
        assert all(len(times) == 3 and min(times) > 0 for times in by_size.values())


def test_a_report_is_checked_against_what_was_asked() -> None:
    hosts = ["a", "b"]
    good = {"all_sum": {"1024": [0.1, 0.2]}, "send_recv": {"a↔b": {"1024": [0.01, 0.02]}}}
    found = measured_from(good, [1024], hosts, 2)
    assert [(m.operation, m.where, m.ranks, m.seconds) for m in found] == [
        (ALL_SUM, "a+b", 2, (0.1, 0.2)),
        (SEND_RECV, "a↔b", 2, (0.01, 0.02)),
    ]
    bad = [
        ([], "the report is not a map"),
        ({"all_sum": {}}, "the report has no send_recv map"),
        ({"all_sum": {}, "send_recv": {"a↔c": {}}}, "the report's links ['a↔c'] are not ['a↔b']"),
        ({**good, "all_sum": {"1024": [0.1]}}, "a+b at 1 KiB: expected 2 positive timings"),
        ({**good, "all_sum": {"1024": [0.1, -1]}}, "a+b at 1 KiB: expected 2 positive timings"),
        ({**good, "all_sum": {"1024": [0.1, True]}}, "a+b at 1 KiB: expected 2 positive timings"),
        ({**good, "all_sum": None}, "a+b: no timings"),
    ]
    for raw, problem in bad:
        with pytest.raises(NetbenchError) as caught:
            measured_from(raw, [1024], hosts, 2)
        assert str(caught.value) == problem


def test_a_member_carries_its_rdma_devices_only_where_the_hostfile_gave_them() -> None:
    from coordinator.hosts.link import Target
    from coordinator.runs.netbench import member_body, member_of

    plain = member_of(Target("mac1:5555", "10.0.0.1:5555", None))
    assert member_body(plain) == {"name": "mac1:5555", "ips": ["10.0.0.1"]}
    rdma = member_of(Target("mac2", "10.0.0.2:5555", None, ("10.0.1.2",), ("rdma_en3", None)))
    assert member_body(rdma) == {"name": "mac2", "ips": ["10.0.1.2"], "rdma": ["rdma_en3", None]}


def test_each_unit_of_progress_names_its_step() -> None:
    hosts, sizes = ["a", "b", "c"], [1024, 4096]
    total = progress_total(sizes, hosts, 1, 2)
    assert total == 1 + 2 * 4 * (1 + 2 + 2)
    steps = [progress_step(done, sizes, hosts, 1, 2) for done in range(total + 1)]
    assert steps[:7] == [
        "forming the ring",
        "the barrier before all_sum at 1 KiB",
        "all_sum at 1 KiB, warm-up 1 of 1",
        "all_sum at 1 KiB, repetition 1 of 2",
        "all_sum at 1 KiB, repetition 2 of 2",
        "the all_sum gathering the timings of all_sum at 1 KiB",
        "the barrier before send_recv a↔b at 1 KiB",
    ]
    assert steps[18] == "send_recv c↔a at 1 KiB, repetition 1 of 2"
    assert steps[-2] == "the all_sum gathering the timings of send_recv c↔a at 4 KiB"
    assert steps[-1] == "reporting, every step done"


def test_a_run_stalls_only_when_no_rank_moves() -> None:
    # rank 2 waits off the link the others measure: its own stillness is no stall
    assert stalled([(7, 0.5), (7, 0.4), (9, 30.0)], 10.0) is None
    # nobody moved for 10 s: the rank the others wait on, the fewest units done, is named
    assert stalled([(9, 12.0), (7, 11.0), (7, 11.5)], 10.0) == 1
    assert stalled([None, (3, 50.0)], 10.0) == 1
    assert stalled([None, None], 10.0) is None  # agents that do not say: their bound alone


@pytest.mark.parametrize(
    ("elapsed", "progress", "age", "said"),
    [
        (100.0, 40, 1.0, None),  # within its bound
        (300.0, 400, 2.0, None),  # past it, still moving: a slow link at work
        (300.0, 400, 90.0, "ran past its bound of 188 s, with no progress for 90 s"),
        (300.0, 0, 300.0, "ran past its bound of 188 s"),  # its peer never came
        (90000.0, 9000, 1.0, "still progressing: its links are slower than the bound assumed"),
    ],
    ids=["within", "slow-link", "stalled", "never-started", "at-the-most"],
)
def test_past_its_bound_a_rank_runs_on_while_its_progress_moves(
    elapsed: float, progress: int, age: float, said: str | None
) -> None:
    """Issue 42: at 20 Mbit/s a working run failed `ran past its bound` after 188 s; the
    no-progress rule already catches a stuck one."""
    from shared.distributed.netbench import past_bound
    from shared.distributed.rank_shapes import MAX_BOUND_S

    why = past_bound(2, elapsed, 188.0, progress, age, MAX_BOUND_S)
    assert (why is None) if said is None else (why is not None and said in why), why
    if said is not None:
        assert why is not None and why.startswith("rank 2 ran past its bound of 188 s")


def test_past_its_bound_a_rank_a_coordinator_still_asks_about_runs_on() -> None:
    """A rank off a slow link (or one 256 MiB repetition over 20 Mbit/s, 200 s) has no progress
    of its own for minutes; its coordinator, still asking, fails the run if no rank moves."""
    from shared.distributed.netbench import past_bound

    quiet = (2, 300.0, 188.0, 400, 150.0, 86400.0)
    assert past_bound(*quiet, watched_age_s=0.3) is None
    assert past_bound(*quiet) == "rank 2 ran past its bound of 188 s, with no progress for 150 s"
    gone = past_bound(*quiet, watched_age_s=90.0)  # its coordinator stopped asking
    assert gone == "rank 2 ran past its bound of 188 s, with no progress for 150 s"
    unformed = past_bound(2, 300.0, 188.0, 0, 300.0, 86400.0, watched_age_s=0.3)
    assert unformed == "rank 2 ran past its bound of 188 s"  # its peer never came


def test_a_ranks_bound_leaves_the_ring_twice_the_host_timeout_to_form() -> None:
    """The coordinator's no-progress rule (one host timeout) fails a ring that never forms
    before any agent's bound does: its line names the host and the step."""
    from coordinator.runs.netbench import WORST_LINK_BYTES_S, NetbenchPlan

    plan = NetbenchPlan((1024,), repetitions=1, warmup=0, port=7000, backend="ring")
    moved = 1024 * 20 * 1 * (2 + 2 * 1)  # 20 operations a repetition, two ranks: one link
    assert plan.bound_s(2, 10.0) == pytest.approx(20.0 + moved / WORST_LINK_BYTES_S)
    assert plan.bound_s(2, 120.0) - plan.bound_s(2, 10.0) == pytest.approx(220.0)


def test_the_progress_line_names_the_slowest_ranks_step() -> None:
    """Issue 42: five minutes of `A running, B running, C running (294 s)` looked hung."""
    from coordinator.hosts.link import Target
    from coordinator.runs.netbench import NetbenchPlan, RankWatch, progress_text

    plan = NetbenchPlan((1024, 1 << 20), repetitions=5, warmup=1, port=7000, backend="ring")
    watches = [RankWatch(Target(name, f"{name}:5555", None)) for name in ("A", "B", "C")]
    assert progress_text(watches, plan, 3.2) == (
        f"netbench {plan.job}: A starting, B starting, C starting (3 s)"
    )
    hosts = ["A", "B", "C"]
    for watch, done in zip(watches, (40, 31, 35), strict=True):
        watch.state, watch.progress = "running", done
    line = progress_text(watches, plan, 294.0)
    assert line.startswith(f"netbench {plan.job}: A running, B running, C running (294 s); ")
    assert line.endswith(f"slowest B: {plan.step(31, hosts)}")
    assert "repetition" in plan.step(31, hosts) or "barrier" in plan.step(31, hosts)
