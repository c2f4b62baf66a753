"""Named conditions and cordons, as Kubernetes' node-problem-detector names a node's problem
and cordons it: a host with any condition in the run store is left out of the next matrix and
group (one line each; `--include-cordoned` overrides) until `coordinator uncordon HOST`.

`coordinator health` records `out-of-family` and `degraded` (shared.benchmark.health) for the
hosts of the run it judges, with the figures that earned them; a host the same run clears has
those two lifted (a later healthy run is the evidence), while `uncordon` lifts all of a host's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from coordinator.runs.store import RunStore
from shared.benchmark.health import FLAGS, HostScore
from shared.clock import iso, utc_now


def record_health(store: RunStore, run_id: str, scores: Mapping[str, HostScore]) -> None:
    """Each scored host's health flags as its conditions, from the run `run_id`; the flags a
    judged host no longer earns are lifted. A host the rule could not judge keeps what it had."""
    now = iso(utc_now())
    for score in scores.values():
        judged = {flag for flag in FLAGS if _judged(score, flag)}
        for flag in FLAGS:
            if flag in score.flags:
                detail = "; ".join(score.why)
                store.query(
                    "INSERT INTO conditions (host, name, since, run_id, detail) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (host, name) "
                    "DO UPDATE SET run_id = excluded.run_id, detail = excluded.detail",
                    (score.host, flag, now, run_id, detail),
                )
            elif flag in judged:
                store.query(
                    "DELETE FROM conditions WHERE host = ? AND name = ?", (score.host, flag)
                )


def _judged(score: HostScore, flag: str) -> bool:
    """Whether the rule behind `flag` could judge the host at all (a family of enough hosts,
    enough past): only then does its silence clear the flag."""
    if flag == FLAGS[0]:
        return score.family_spread is not None
    return score.own_spread is not None


def add_condition(store: RunStore, host: str, name: str, detail: str, run_id: str | None) -> None:
    store.query(
        "INSERT OR REPLACE INTO conditions (host, name, since, run_id, detail) "
        "VALUES (?, ?, ?, ?, ?)",
        (host, name, iso(utc_now()), run_id, detail),
    )


def conditions(store: RunStore, hosts: Iterable[str] | None = None) -> dict[str, list[dict]]:
    """Each cordoned host's conditions (name, since, run_id, detail), oldest first."""
    found: dict[str, list[dict[str, Any]]] = {}
    wanted = None if hosts is None else set(hosts)
    for row in store.query("SELECT * FROM conditions ORDER BY since, host, name"):
        if wanted is None or row["host"] in wanted:
            found.setdefault(row["host"], []).append(
                {key: row[key] for key in ("name", "since", "run_id", "detail")}
            )
    return found


def known_host(store: RunStore, host: str) -> bool:
    """Whether any stored run or condition names the host."""
    return bool(
        store.query(
            "SELECT 1 FROM run_hosts WHERE host = ? UNION SELECT 1 FROM conditions WHERE host = ?",
            (host, host),
        )
    )


def uncordon(store: RunStore, host: str) -> list[str]:
    """Lift every condition of the host; the names lifted (none: it was not cordoned)."""
    names = [row["name"] for row in store.query("SELECT name FROM conditions WHERE host = ?",
                                                (host,))]  # fmt: skip
    store.query("DELETE FROM conditions WHERE host = ?", (host,))
    return names


def cordon_line(entry: str, host: str, found: list[dict[str, Any]]) -> str:
    """`skipping mac3: mac3 is cordoned (out-of-family since ...); ...`: one line per entry
    left out (a group's names the member that is)."""
    named = ", ".join(f"{item['name']} since {item['since']}" for item in found)
    return (
        f"skipping {entry}: {host} is cordoned ({named}); `coordinator uncordon {host}` lifts "
        "it, --include-cordoned runs it anyway"
    )
