"""A rank's environment as mlx.launch writes it (shared.distributed.rank_env), checked by MLX
itself: two ranks started with nothing but that environment form a ring and sum across it. JACCL
cannot run here (macOS 26.2+, Thunderbolt 5): its hostfile rules are checked as mlx.launch checks
them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from shared.distributed.rank_env import (
    JACCL,
    RING,
    Member,
    RankEnvError,
    backends_of,
    chosen_backend,
    listens_on,
    ports_used,
    rank_launch,
    ring_hostfile_at,
)
from tests.ring_support import run_ranks

SUM_ACROSS = (
    "import mlx.core as mx\n"
    "g = mx.distributed.init(strict=True, backend='ring')\n"
    "s = mx.distributed.all_sum(mx.array([g.rank() + 1.0]), group=g)\n"
    "print(g.rank(), g.size(), s.item())\n"
)


def test_the_ring_hostfile_counts_ports_up_by_rank_and_address() -> None:
    members = [Member("mac1", ("10.0.0.1", "10.0.1.1")), Member("mac2", ("10.0.0.2",))]
    launch = rank_launch(members, 1, RING, starting_port=40000)
    assert launch.env == {"MLX_RANK": "1"}
    assert json.loads(launch.files["MLX_HOSTFILE"]) == [
        ["10.0.0.1:40000", "10.0.1.1:40001"],
        ["10.0.0.2:40002"],
    ]
    assert ports_used(members, 40000) == range(40000, 40003)
    assert listens_on(members, 0, RING, 40000) == [("10.0.0.1", 40000), ("10.0.1.1", 40001)]
    assert listens_on(members, 1, RING, 40000) == [("10.0.0.2", 40002)]


def test_a_ring_hostfile_at_the_ports_each_rank_chose() -> None:
    members = [Member("mac1", ("10.0.0.1", "fe80::1")), Member("mac2", ("10.0.0.2",))]
    assert ring_hostfile_at(members, [[5001, 6002], [7003]]) == [
        ["10.0.0.1:5001", "[fe80::1]:6002"],
        ["10.0.0.2:7003"],
    ]
    with pytest.raises(RankEnvError, match="mac2: ports \\[0\\] for 1 IPs"):
        ring_hostfile_at(members, [[5001, 6002], [0]])
    with pytest.raises(RankEnvError, match="mac2: the ring backend needs its IP address"):
        ring_hostfile_at([members[0], Member("mac2", ())], [[5001, 6002], []])


@pytest.mark.slow
def test_two_ranks_started_with_that_environment_sum_across_the_ring(tmp_path: Path) -> None:
    outputs = run_ranks(tmp_path, 2, [sys.executable, "-c", SUM_ACROSS])
    assert sorted(output.strip() for output in outputs) == ["0 2 3.0", "1 2 3.0"]


def test_jaccl_takes_mlx_launchs_device_matrix_and_rank_0_as_coordinator() -> None:
    members = [
        Member("mac1", ("10.0.0.1",), (None, "rdma_en2")),
        Member("mac2", ("10.0.0.2",), ("rdma_en2", None)),
    ]
    launch = rank_launch(members, 0, JACCL, starting_port=40000)
    assert launch.env == {"MLX_RANK": "0", "MLX_JACCL_COORDINATOR": "10.0.0.1:40000"}
    assert json.loads(launch.files["MLX_IBV_DEVICES"]) == [[None, "rdma_en2"], ["rdma_en2", None]]
    assert listens_on(members, 0, JACCL, 40000) == [("10.0.0.1", 40000)]  # the coordinator
    assert listens_on(members, 1, JACCL, 40000) == []  # only connects


@pytest.mark.parametrize(
    ("members", "backend", "problem"),
    [
        ([Member("a", ("10.0.0.1",))], RING, "a distributed group needs at least two members"),
        ([Member("a", ()), Member("b", ("10.0.0.2",))], RING, "a: the ring backend needs its IP"),
        (
            [Member("a", ("1",), (None,)), Member("b", ("2",), ("x", None))],
            JACCL,
            "a: 1 RDMA devices listed for 2 ranks",
        ),
        (
            [Member("a", ("1",), ("x", "y")), Member("b", ("2",), ("x", None))],
            JACCL,
            "a: its RDMA device towards itself must be null",
        ),
        (
            [Member("a", ("1",), (None, None)), Member("b", ("2",), ("x", None))],
            JACCL,
            "a: no RDMA device towards b",
        ),
        ([Member("a", ("1",)), Member("b", ("2",))], "tcp", "unknown backend 'tcp'"),
    ],
)
def test_a_group_that_cannot_launch_is_named(
    members: list[Member], backend: str, problem: str
) -> None:
    with pytest.raises(RankEnvError) as caught:
        rank_launch(members, 0, backend)
    assert str(caught.value).startswith(problem)


def test_auto_is_jaccl_only_where_every_member_has_it() -> None:
    assert chosen_backend("auto", {"a": ["ring", "jaccl"], "b": ["ring", "jaccl"]}) == JACCL
    assert chosen_backend("auto", {"a": ["ring", "jaccl"], "b": ["ring"]}) == RING
    with pytest.raises(RankEnvError) as caught:
        chosen_backend("jaccl", {"a": ["ring", "jaccl"], "b": ["ring"]})
    assert str(caught.value) == (
        "b: no jaccl backend (JACCL needs macOS 26.2 or later, Thunderbolt 5 and RDMA enabled)"
    )


def test_a_host_runs_jaccl_only_on_macos_26_2_with_its_devices_given() -> None:
    assert backends_of({"macos_version": "26.2"}, rdma_given=True) == [RING, JACCL]
    assert backends_of({"macos_version": "26.10.1"}, rdma_given=True) == [RING, JACCL]
    assert backends_of({"macos_version": "26.1"}, rdma_given=True) == [RING]
    assert backends_of({"macos_version": "26.2"}, rdma_given=False) == [RING]
    assert backends_of({"macos_version": None, "os": "Linux 6.1"}, rdma_given=True) == [RING]
