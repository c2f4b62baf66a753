"""Groups in the host list and a group's cell made from its ranks' records: the pure parts of
distributed benchmark cells (docs/distributed.md), on hand-made input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent.daemon.benchmark.jobs import group_stalled
from coordinator.hosts.hostfile import (
    GroupEntry,
    HostEntry,
    HostfileError,
    parse_hostfile,
    parse_hostfile_and_groups,
    parse_hosts,
    parse_hosts_and_groups,
)
from shared.distributed.group import BenchGroup, group_label
from shared.reports.benchmark import flags
from shared.reports.group_cells import (
    PEER_LOST,
    SERVER_PEER_FAILED,
    mark_groups,
    merge_ranks,
    tokens_check,
)
from shared.shapes import Invalid


def test_hosts_and_a_group_of_them() -> None:
    entries = parse_hosts_and_groups("a,b:6000,a+b:6000")
    a, b = HostEntry("a", 5555), HostEntry("b", 6000)
    assert entries == [a, b, GroupEntry((a, b))]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,a+", "a group joins two or more hosts with +"),
        ("a+a", "a group lists a:5555 twice"),
        ("a+b,b+a,a+b", "the group a:5555+b:5555 is listed twice"),
        ("a+b+", "a group joins two or more hosts with +"),
    ],
)
def test_bad_groups_are_one_line(text: str, message: str) -> None:
    with pytest.raises(HostfileError, match=re.escape(message)):
        parse_hosts_and_groups(text)


def test_commands_other_than_benchmark_refuse_groups(tmp_path: Path) -> None:
    with pytest.raises(HostfileError, match="runs only in `coordinator benchmark`"):
        parse_hosts("a,a+b")
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps([{"host": "a"}, {"host": "b"}, {"group": ["a", "b"]}]))
    with pytest.raises(HostfileError, match="runs only in `coordinator benchmark`"):
        parse_hostfile(path)


def test_a_hostfile_group_names_its_members_entries(tmp_path: Path) -> None:
    path = tmp_path / "hosts.json"
    hosts = [
        {"ssh": "mac1", "ips": ["10.0.0.1"], "rdma": [None, "rdma_en3"]},
        {"ssh": "mac2", "ips": ["10.0.0.2"], "rdma": ["rdma_en3", None]},
        {"group": ["mac1", "mac2"]},
    ]
    path.write_text(json.dumps(hosts))
    first, second, group = parse_hostfile_and_groups(path)
    assert isinstance(group, GroupEntry)
    assert group.members == (first, second)  # ips and rdma kept
    path.write_text(json.dumps([hosts[0], {"group": ["mac1", "mac3"]}]))
    with pytest.raises(HostfileError, match="entry 2 .*mac3: no host entry of that name"):
        parse_hostfile_and_groups(path)
    path.write_text(json.dumps([hosts[0], {"group": ["mac1"]}]))
    with pytest.raises(HostfileError, match="a group needs at least two members"):
        parse_hostfile_and_groups(path)


def group_body(**changes: object) -> dict[str, object]:
    body: dict[str, object] = {
        "job": "g-1",
        "rank": 1,
        "members": [{"name": "a", "ips": ["10.0.0.1"]}, {"name": "b", "ips": ["10.0.0.2"]}],
        "backend": "ring",
        "port": 32323,
        "sharding": "tensor",
        "stall_s": 240.0,
    }
    body.update(changes)
    return body


def test_a_group_body_round_trips_and_refuses_by_field() -> None:
    group = BenchGroup.from_wire(group_body())
    assert group.host == "b" and group.names == ["a", "b"]
    assert BenchGroup.from_wire(group.to_wire()) == group
    assert group.launch().env == {"MLX_RANK": "1"}
    for changes, where in [
        ({"rank": 2}, "group.rank is 2"),
        ({"sharding": "data"}, "group.sharding"),
        ({"backend": "auto"}, "group.backend"),
        ({"members": [{"name": "a", "ips": ["10.0.0.1"]}] * 2}, "lists 'a' twice"),
        ({"members": [{"name": "a", "ips": ["mac1"]}, {"name": "b", "ips": []}]}, "not an IP"),
        ({"stall_s": 0.5}, "group.stall_s"),
    ]:
        with pytest.raises(Invalid, match=where):
            BenchGroup.from_wire(group_body(**changes))
    assert group_label(["a", "b"], "tensor", "ring") == "a+b (2 ranks, tensor, ring)"


def rank_record(rank: int, **fields: object) -> dict[str, object]:
    record: dict[str, object] = {
        "name": "small/f16 pp32 b1",
        "model": "small",
        "bits": 16,
        "status": "ok",
        "error": None,
        "tokens_per_sec": 100.0,
        "ci95_tokens_per_sec": 1.0,
        "peak_memory_gb": 0.5 + rank,
        "active_memory_gb": 0.4,
        "warmup_iterations": 1,
        "slept_s": 0.0,
        "pause_s": 0.0,
        "flags": [],
        "soc_temp_c": None,
        "energy_j": None,
        "energy_note": "no power source",
        "greedy_tokens": [5, 6, 7],
        "settings": {"power_source": "ac"},
        "rank": {"rank": rank},
    }
    record.update(fields)
    return record


def merged_pair(first: dict[str, object], second: dict[str, object]) -> dict[str, object]:
    """merge_ranks of rank 0 on host a and rank 1 on host b (ring, tensor sharding), neither
    rank's weight bytes known."""
    return merge_ranks([first, second], ["a", "b"], [None, None], "ring", "tensor")


def test_the_group_cell_is_rank_zeros_timing_with_every_rank_kept() -> None:
    merged = merge_ranks(
        [rank_record(0, tokens_per_sec=180.0), rank_record(1, tokens_per_sec=179.0)],
        ["a", "b"],
        [1000, 900],
        "ring",
        "tensor",
    )
    assert merged["tokens_per_sec"] == 180.0 and merged["status"] == "ok"
    assert merged["group"] == {
        "members": ["a", "b"],
        "ranks": 2,
        "backend": "ring",
        "sharding": "tensor",
    }
    assert [r["weight_memory_bytes"] for r in merged["ranks"]] == [1000, 900]
    assert [r["peak_memory_gb"] for r in merged["ranks"]] == [0.5, 1.5]
    assert merged["peak_memory_gb"] == 1.5  # the most any member had to hold
    assert merged["energy_j"] is None and merged["energy_note"].startswith("rank 0 (a)")
    assert merged["greedy_tokens_agree"] is True
    assert "rank" not in merged and merged["verdict"] == "valid"


def test_what_invalidates_any_rank_invalidates_the_group() -> None:
    merged = merged_pair(
        rank_record(0),
        rank_record(1, flags=["paused"], pause_s=3.0, settings={"power_source": "battery"}),
    )
    assert merged["verdict"] == "invalid"
    assert {"paused", "on-battery"} <= set(merged["verdict_reasons"])


def test_energy_is_every_ranks_mac_summed() -> None:
    energy = {"energy_net_j": 1.0, "power_w": 10.0, "energy_source": "ioreport"}
    merged = merged_pair(
        rank_record(0, energy_j=4.0, tokens_per_joule=25.0, **energy),
        rank_record(1, energy_j=6.0, tokens_per_joule=10.0, **energy),
    )
    assert merged["energy_j"] == 10.0 and merged["power_w"] == 20.0
    assert merged["tokens_per_joule"] == pytest.approx(100 / 10.0)  # rank 0's tokens, all joules


def test_the_cause_is_named_before_the_ranks_that_lost_their_peer() -> None:
    merged = merged_pair(
        rank_record(0, status="failed", error=f"RuntimeError: [ring] {PEER_LOST}"),
        rank_record(1, status="failed", error="the job process died (SIGKILL)"),
    )
    assert merged["status"] == "failed"
    assert merged["error"].startswith("rank 1 (b): the job process died (SIGKILL) (then rank 0")


def test_a_serving_cells_joules_per_output_token_are_every_ranks_summed() -> None:
    """Rank 0 counted 40 output tokens; the group's joules are both Macs'."""
    served = {"serving": {"loop": "closed", "passes": 1, "figures": {"output_tokens": 40}}}
    energy = {"power_w": 10.0, "energy_source": "ioreport"}
    merged = merged_pair(
        rank_record(0, energy_j=4.0, energy_net_j=2.0, **energy, **served),
        rank_record(1, energy_j=6.0, energy_net_j=3.0, **energy, **served),
    )
    assert merged["joules_per_token"] == pytest.approx(10.0 / 40)
    assert merged["joules_per_output_token_net"] == pytest.approx(5.0 / 40)


def test_a_rank_whose_server_followed_anothers_failure_is_named_after_it() -> None:
    stopped = f"GroupServingFailed: {SERVER_PEER_FAILED} rank 1 (b)"
    merged = merged_pair(
        rank_record(0, status="failed", error=stopped),
        rank_record(1, status="failed", error="GroupServingFailed: mlx_lm.server exited"),
    )
    assert merged["error"].startswith("rank 1 (b): GroupServingFailed: mlx_lm.server exited")


def test_speedup_and_tokens_against_the_members_alone() -> None:
    single_a = {**rank_record(0, tokens_per_sec=100.0), "host": "a"}
    single_b = {**rank_record(0, tokens_per_sec=120.0), "host": "b"}
    merged = merge_ranks(
        [rank_record(0, tokens_per_sec=180.0), rank_record(1)], ["a", "b"], [0, 0], "ring", "tensor"
    )
    group = {**merged, "host": "a+b"}
    marked = mark_groups([single_a, single_b, group])
    assert marked[2]["speedup"] == pytest.approx(1.5) and marked[2]["speedup_over"] == "b"
    assert marked[2]["speedup_separated"] is True  # 180 ± 1 against 120 ± 1
    assert marked[2]["tokens_check"] == "same as a"
    assert "speedup" not in marked[0]
    assert tokens_check({"greedy_tokens": [5, 9, 7]}, [single_a]) == "differ from a at token 2"
    assert tokens_check({"greedy_tokens": [5]}, []).startswith("no member ran this model alone")
    assert tokens_check({}, [single_a]) is None


def test_a_rank_is_ended_by_its_agent_only_when_it_and_its_coordinator_are_both_silent() -> None:
    assert group_stalled(60.0, active_at=0.0, heard_at=0.0, now=59.0) is None
    assert group_stalled(60.0, active_at=0.0, heard_at=50.0, now=100.0) is None  # still asked
    assert group_stalled(60.0, active_at=50.0, heard_at=0.0, now=100.0) is None  # still writing
    why = group_stalled(60.0, active_at=10.0, heard_at=20.0, now=100.0)
    assert why is not None and why.startswith("no progress with its group and no request")
    assert "for 80 s (limit 60 s)" in why


def test_a_metal_error_on_any_rank_is_the_group_cells_verdict() -> None:
    merged = merged_pair(
        rank_record(0, status="failed", error=f"RuntimeError: [ring] {PEER_LOST}"),
        rank_record(1, status="failed", error="gpu-error: timeout: Command buffer timed out"),
    )
    assert merged["verdict_reasons"] == ["gpu-error"]


def test_the_group_cell_names_its_straggler_and_carries_what_was_injected() -> None:
    steady = {"compute_s": [0.01] * 3, "wait_s": [0.2] * 3, "links_s": {"a↔b": [0.0001] * 3}}
    delayed = {**steady, "compute_s": [0.21] * 3, "wait_s": [0.001] * 3}
    records = [
        rank_record(0, probe=steady),
        rank_record(1, probe=delayed, injected=["step-delay"], flags=["injected"]),
    ]
    merged = merge_ranks(records, ["a", "b"], [1, 1], "ring", "tensor", {"a↔b": 0.0001})
    found = merged["stragglers"]
    assert found["verdict"] == "compute" and found["host"] == "b", found["why"]
    assert found["links"] == [{"link": "a↔b", "one_way_s": 0.0001, "netbench_s": 0.0001}]
    assert "probe" not in merged and merged["injected"] == ["step-delay"]
    assert "injected" in merged["flags"] and merged["verdict"] == "valid"
    assert "straggler rank 1 (b): compute" in flags(merged)
    records[1].pop("probe")  # an agent that predates the probe
    older = merge_ranks(records, ["a", "b"], [1, 1], "ring", "tensor")["stragglers"]
    assert older == {"verdict": "unavailable", "why": "rank 1 (b): no probe"}
