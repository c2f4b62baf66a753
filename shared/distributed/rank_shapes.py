"""The wire shapes of a job across several Macs (docs/protocol.md §5, rank.*): what an agent
accepts in rank.start and what a coordinator accepts back. Pure; built on shared.shapes, so
every refusal names the field."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from shared import shapes as s
from shared.distributed.netbench import ELEMENT_BYTES, LARGEST_BYTES, SMALLEST_BYTES
from shared.distributed.rank_env import JACCL, RING, Member

KIND_NETBENCH = "netbench"
RANK_KINDS = (KIND_NETBENCH,)
MAX_MEMBERS = 64
MAX_ADDRESSES = 8
MAX_BOUND_S = 24 * 3600.0
MAX_SIZES = 32
MAX_NETBENCH_REPETITIONS = 1000
MAX_NETBENCH_WARMUP = 100
JOB_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A job id is also the name of its folder under the agent's data dir."""
RANK_STATES = ("running", "ok", "failed", "stopped")

_NAME = s.text(most=255, least=1)
MEMBER = s.fields(
    {"name": _NAME, "ips": s.list_of(s.text(most=255, least=1), most=MAX_ADDRESSES)},
    {"rdma": s.list_of(s.nil_or(s.text(most=255, least=1)), most=MAX_MEMBERS)},
)
NETBENCH_SPEC = s.fields(
    {
        "sizes": s.list_of(s.integer(SMALLEST_BYTES, LARGEST_BYTES), most=MAX_SIZES),
        "repetitions": s.integer(1, MAX_NETBENCH_REPETITIONS),
        "warmup": s.integer(0, MAX_NETBENCH_WARMUP),
    }
)
RANK_START = s.fields(
    {
        "job": s.text(most=64, least=1),
        "kind": s.one_of(RANK_KINDS),
        "rank": s.integer(0, MAX_MEMBERS - 1),
        "members": s.list_of(MEMBER, most=MAX_MEMBERS),
        "backend": s.one_of((RING, JACCL)),
        "port": s.integer(1024, 65535),
        "spec": s.fields({}, others=lambda value: None),
        "bound_s": s.number(1.0, MAX_BOUND_S),
    }
)
MAX_PROGRESS = 10**12
RANK_GOT = s.fields(
    {
        "job": s.text(most=64, least=1),
        "rank": s.integer(0, MAX_MEMBERS - 1),
        "state": s.one_of(RANK_STATES),
        "elapsed_s": s.number(0.0),
        "error": s.nil_or(s.text(most=1000)),
        "report": s.nil_or(s.fields({}, others=lambda value: None)),
    },
    {
        "progress": s.nil_or(s.integer(0, MAX_PROGRESS)),
        "progress_age_s": s.nil_or(s.number(0.0)),
    },
)
"""rank.get.ok's body; `progress` (units done, shared.distributed.netbench.progress_step) and
`progress_age_s` (since they last moved) are optional: an agent that predates them sends
neither, and its rank is then bound by `bound_s` alone."""


def group_members(raw_members: list[dict[str, Any]], rank: int) -> list[Member]:
    """A group's members (already shaped as MEMBER) checked for what a shape cannot say: printable
    names, IP addresses, at least two members, distinct names, `rank` among them. Shared by
    rank.start and bench.start's `group`; Invalid names the first problem."""
    for index, raw in enumerate(raw_members):
        if not raw["name"].isprintable():
            raise s.Invalid(f"members[{index}].name", "holds a control character")
        for ip in raw["ips"]:
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise s.Invalid(f"members[{index}].ips", f"has {ip!r}, not an IP address") from None
    members = [
        Member(raw["name"], tuple(raw["ips"]), tuple(raw.get("rdma") or ())) for raw in raw_members
    ]
    if len(members) < 2:
        raise s.Invalid("members", "has fewer than two members")
    names = [member.name for member in members]
    if len(set(names)) != len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise s.Invalid("members", f"lists {twice!r} twice")
    if rank >= len(members):
        raise s.Invalid("rank", f"is {rank}, not one of 0…{len(members) - 1}")
    return members


def check_rank_start(body: dict[str, Any]) -> list[Member]:
    """rank.start's body checked whole (shapes, then what the shapes cannot say: at least two
    members, distinct names, the rank among them, the kind's spec), its members returned.
    Invalid names the first problem."""
    RANK_START(body)
    if not JOB_ID.fullmatch(body["job"]):
        raise s.Invalid("job", "may hold only letters, digits, '-', '_' and '.'")
    members = group_members(body["members"], body["rank"])
    try:
        NETBENCH_SPEC(body["spec"])
    except s.Invalid as exc:
        raise exc.within("spec") from None
    sizes = body["spec"]["sizes"]
    if not sizes or any(after <= before for before, after in zip(sizes, sizes[1:], strict=False)):
        raise s.Invalid("spec.sizes", "is not a non-empty increasing list")
    if any(size % ELEMENT_BYTES for size in sizes):
        raise s.Invalid("spec.sizes", "has a size that is not a whole number of float32 elements")
    return members
