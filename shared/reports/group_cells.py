"""A distributed group's cell, from every rank's record of it, and what a table says of it
beside the single hosts of the same run.

Every member's agent runs the matrix as one rank (shared.distributed.group) and sends its own record
of each cell. The group's record is rank 0's timing (the ranks meet in every forward pass, so
rank 0's clock measures the group), with every rank's memory, energy, temperature and
verdict inputs in `ranks`; what makes a cell invalid on any rank (a pause, heat, a sleep, a
battery) makes the group's invalid, since one slow rank slows them all. Pure.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from shared.benchmark.serving import per_output_token
from shared.benchmark.verdict import BATTERY_SOURCES, LOW_POWER_MODES, judge, separated
from shared.distributed import stragglers
from shared.distributed.group import TENSOR
from shared.wire.record_types import MEASURED

Record = dict[str, Any]

PEER_LOST = "connection to a peer was lost"
"""What MLX's ring backend raises on a rank whose peer went away (MLX 0.32,
mlx/distributed/ring/ring.cpp): an effect, not the cause, when another rank failed."""

CANCELLED = "cancelled"
"""How a member's job that was cancelled (its peer failed first) ends."""

SERVER_PEER_FAILED = "its server rank stopped with its group's server on"
"""How a rank's record of a group's serving cell says another rank's server failed first
(agent.profiling.group_serving): an effect, its own server being fine."""

RANK_FIELDS = (
    "status",
    "error",
    "tokens_per_sec",
    "peak_memory_gb",
    "active_memory_gb",
    "energy_j",
    "power_w",
    "energy_source",
    "energy_simulated",
    "energy_note",
    "soc_temp_c",
    "thermal_source",
    "pause_s",
    "flags",
    "verdict_reasons",
)
"""What `ranks` keeps of each rank's own record."""


def merge_ranks(
    records: Sequence[Mapping[str, Any]],
    hosts: Sequence[str],
    weights: Sequence[int | None],
    backend: str,
    sharding: str,
    netbench: Mapping[str, float] | None = None,
) -> Record:
    """The group's record of one cell from each rank's (in rank order), `weights` each rank's
    weight bytes (its model info's), judged again from the merged fields; a measured cell's
    `stragglers` from the ranks' probes, `netbench` the stored one-way seconds per link."""
    lead = copy.deepcopy(dict(records[0]))
    lead.pop("rank", None)
    lead.pop("probe", None)  # rank 0's: every rank's is in `stragglers`
    lead["group"] = {
        "members": list(hosts),
        "ranks": len(hosts),
        "backend": backend,
        "sharding": sharding,
    }
    lead["ranks"] = [
        {
            "rank": rank,
            "host": host,
            "weight_memory_bytes": weight,
            **{key: record.get(key) for key in RANK_FIELDS},
        }
        for rank, (host, record, weight) in enumerate(zip(hosts, records, weights, strict=True))
    ]
    lead.update(_hottest(records, hosts))
    lead["pause_s"] = max(
        r.get("pause_s") or 0.0 for r in records
    )  # the group was held at least this long
    lead["flags"] = _union([r.get("flags") or [] for r in records])
    failed = [(rank, r) for rank, r in enumerate(records) if r.get("status") != "ok"]
    if failed:  # no figure of the group's: each rank's own stays in `ranks`
        lead["status"] = "failed"
        lead["error"] = failure_line(failed, hosts)
        for key in MEASURED:
            lead.pop(key, None)
    else:
        for key in ("peak_memory_gb", "active_memory_gb"):
            lead[key] = most([r.get(key) for r in records])
        lead["slept_s"] = most([r.get("slept_s") for r in records])
        lead["warmup_iterations"] = min((r.get("warmup_iterations") or 0) for r in records)
        lead.update(_energy(records, hosts))
        probes = [r.get("probe") for r in records]
        injected = [r.get("injected") or [] for r in records]
        lead["stragglers"] = stragglers.analyse(
            hosts, probes, netbench, injected, equal_shares=sharding == TENSOR
        )
        if any(injected):  # what any rank injected is the group's (labelled, never measured)
            lead["injected"] = _union(injected)
        if lead.get("serving") is not None:  # joules per output token, every rank's summed
            per_output_token(lead)
    lead["settings"] = _worst_power(records)
    lead["greedy_tokens_agree"] = _tokens_agree(records)
    lead.pop("verdict", None)
    lead.pop("verdict_reasons", None)
    return judge(lead)


def failure_line(failed: Sequence[tuple[int, Mapping[str, Any]]], hosts: Sequence[str]) -> str:
    """The failed ranks' errors in one line, the cause first."""
    return cause_first(
        [
            (f"rank {rank} ({hosts[rank]})", r.get("error") or str(r.get("status")))
            for rank, r in failed
        ]
    )


def cause_first(failures: Sequence[tuple[str, str]]) -> str:
    """`WHO: WHY (then WHO: WHY; …)` with a failure of its own before those that only follow
    from another's: a rank that lost its peer, a member cancelled because another failed."""
    ordered = sorted(failures, key=lambda item: is_effect(item[1]))
    lines = [f"{who}: {why}" for who, why in ordered]
    return lines[0] + (f" (then {'; '.join(lines[1:])})" if len(lines) > 1 else "")


def is_effect(error: str) -> bool:
    return PEER_LOST in error or SERVER_PEER_FAILED in error or error.startswith(CANCELLED)


def most(values: Sequence[float | None]) -> float | None:
    """The largest, None when any is unknown (a maximum over part of the ranks is no maximum)."""
    if any(value is None for value in values):
        return None
    return max(values)  # type: ignore[type-var]


def _hottest(records: Sequence[Mapping[str, Any]], hosts: Sequence[str]) -> Record:
    """The hottest rank's SoC readings, its source named with its host."""
    known = [(r["soc_temp_c"], rank) for rank, r in enumerate(records) if r.get("soc_temp_c")]
    if not known:
        return {"soc_temp_c": None, "soc_temp_start_c": None, "soc_temp_end_c": None}
    _, rank = max(known)
    hottest = records[rank]
    return {
        "soc_temp_c": hottest.get("soc_temp_c"),
        "soc_temp_start_c": hottest.get("soc_temp_start_c"),
        "soc_temp_end_c": hottest.get("soc_temp_end_c"),
        "thermal_source": f"{hosts[rank]}: {hottest.get('thermal_source')}",
    }


def _energy(records: Sequence[Mapping[str, Any]], hosts: Sequence[str]) -> Record:
    """The group's joules: every rank's Mac, summed; unknown when any rank's is (a part is not
    the group's energy), the note naming which."""
    totals = [r.get("energy_j") for r in records]
    if any(total is None for total in totals):
        missing = next(rank for rank, total in enumerate(totals) if total is None)
        note = records[missing].get("energy_note") or "no figure"
        fields: Record = {key: None for key in ("energy_j", "energy_net_j", "power_w")}
        fields.update(tokens_per_joule=None, joules_per_token=None, energy_by_rail_j=None)
        fields["energy_note"] = f"rank {missing} ({hosts[missing]}): {note}"
        return fields
    lead = records[0]
    total = sum(totals)  # type: ignore[arg-type]
    tokens = (lead.get("tokens_per_joule") or 0.0) * (lead.get("energy_j") or 0.0)
    nets = [r.get("energy_net_j") for r in records]
    powers = [r.get("power_w") for r in records]
    return {
        "energy_j": total,
        "energy_net_j": None if None in nets else sum(nets),  # type: ignore[arg-type]
        "power_w": None if None in powers else sum(powers),  # type: ignore[arg-type]
        "tokens_per_joule": tokens / total if total > 0 and tokens else None,
        "joules_per_token": total / tokens if tokens else None,
        "energy_by_rail_j": None,
        "energy_simulated": any(r.get("energy_simulated") for r in records),
        "energy_source": ", ".join(sorted({str(r.get("energy_source")) for r in records})),
        "energy_note": "every rank's Mac, summed",
    }


def _union(lists: Sequence[Sequence[str]]) -> list[str]:
    seen: list[str] = []
    for items in lists:
        seen += [item for item in items if item not in seen]
    return seen


def _worst_power(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Rank 0's settings, with the power mode and source of a rank on low power or battery."""
    settings = dict(records[0].get("settings") or {})
    for record in records:
        theirs = record.get("settings") or {}
        if theirs.get("power_mode") in LOW_POWER_MODES:
            settings["power_mode"] = theirs["power_mode"]
        if theirs.get("power_source") in BATTERY_SOURCES:
            settings["power_source"] = theirs["power_source"]
    return settings


def _tokens_agree(records: Sequence[Mapping[str, Any]]) -> bool | None:
    """Whether every rank decoded the same greedy tokens; None when none was asked for."""
    tokens = [r.get("greedy_tokens") for r in records]
    if tokens[0] is None:
        return None
    return all(each == tokens[0] for each in tokens)


def mark_groups(cells: list[Record]) -> list[Record]:
    """Each group record with its `speedup` over the fastest of its members alone on the same
    cell (`speedup_over` names it; none when no member has an ok record; `speedup_separated`
    whether their 95 % intervals part, shared.benchmark.verdict.separated) and `tokens_check`:
    `same as HOST` / `differ from HOST at token N` against a member's greedy tokens for the
    same model, or why there is no check."""
    by_cell: dict[tuple[str, str], Record] = {}
    for record in cells:
        if "group" not in record and record.get("host"):
            by_cell[(record["name"], record["host"])] = record
    marked = []
    for record in cells:
        if "group" not in record:
            marked.append(record)
            continue
        copy_ = dict(record)
        copy_.update(_versus_members(copy_, by_cell))
        marked.append(copy_)
    return marked


def _versus_members(record: Record, by_cell: Mapping[tuple[str, str], Record]) -> Record:
    members = record["group"]["members"]
    alone = [by_cell.get((record["name"], member)) for member in members]
    ok = [r for r in alone if r and r.get("status") == "ok" and r.get("tokens_per_sec")]
    fields: Record = {"speedup": None, "speedup_over": None, "speedup_separated": None}
    if ok and record.get("status") == "ok" and record.get("tokens_per_sec"):
        fastest = max(ok, key=lambda r: r["tokens_per_sec"])
        fields["speedup"] = record["tokens_per_sec"] / fastest["tokens_per_sec"]
        fields["speedup_over"] = fastest["host"]
        fields["speedup_separated"] = separated(record, fastest)
    fields["tokens_check"] = tokens_check(record, [r for r in alone if r])
    return fields


def tokens_check(record: Mapping[str, Any], alone: Sequence[Mapping[str, Any]]) -> str | None:
    """The group's greedy tokens against the first member's alone that has them; None where
    the run asked for none."""
    mine = record.get("greedy_tokens")
    if mine is None:
        return None
    if record.get("greedy_tokens_agree") is False:
        return "the ranks decoded different tokens"
    for other in alone:
        theirs = other.get("greedy_tokens")
        if theirs is None:
            continue
        if theirs == mine:
            return f"same as {other['host']}"
        at = next(
            (i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), len(mine)
        )
        return f"differ from {other['host']} at token {at + 1}"
    return "no member ran this model alone: nothing to compare with"


def weights_of(models: Sequence[Mapping[str, Any]], record: Mapping[str, Any]) -> int | None:
    """A rank's weight bytes for a record's model, from the model infos its agent sent."""
    for info in models:
        if info.get("model") == record.get("model") and info.get("bits") == record.get("bits"):
            return info.get("weight_memory_bytes")
    return None
