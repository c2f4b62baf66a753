"""A distributed job seen as one: its ranks gathered from every host's job listing (each rank's
agent lists its `gang`, docs/protocol.md §10 and §15) into one row: the group, its ranks and
hosts, the hottest rank, the state all ranks live under and the Mac that causes it. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GangRow:
    group: str
    world: int
    backend: str
    ranks: dict[int, str] = field(default_factory=dict)
    """Rank -> the monitored host listing it (ranks on unmonitored Macs are missing)."""
    hottest: tuple[float, str, str] | None = None
    """(°C, host, where it was read) of the hottest monitored rank."""
    state: str = "ok"
    duty: float | None = None
    """Under pace: the share of each slice every rank runs."""
    cause: dict[str, Any] | None = None
    """The member report that asks for `state` (docs/protocol.md §15), as the lowest rank
    listed tells it."""

    def ranks_text(self) -> str:
        hosts = ", ".join(f"{rank}:{self.ranks[rank]}" for rank in sorted(self.ranks))
        missing = self.world - len(self.ranks)
        return f"{len(self.ranks)}/{self.world} ranks ({hosts})" + (
            f", {missing} not monitored" if missing else ""
        )

    def cause_text(self) -> str:
        if self.cause is None:
            return ""
        where = self.cause["source"] + (f" · {s}" if (s := self.cause["sensor"]) else "")
        degrees = (
            "no reading" if self.cause["celsius"] is None else f"{self.cause['celsius']:.1f} °C"
        )
        return f"{self.cause['host']} (rank {self.cause['rank']}) at {degrees} ({where})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "world": self.world,
            "backend": self.backend,
            "ranks": {str(rank): host for rank, host in sorted(self.ranks.items())},
            "hottest": None
            if self.hottest is None
            else {
                "celsius": self.hottest[0],
                "host": self.hottest[1],
                "read_from": self.hottest[2],
            },
            "state": self.state,
            "duty": self.duty,
            "cause": self.cause,
        }


def gang_rows(
    hosts: Iterable[tuple[str, list[dict[str, Any]], Mapping[str, Any] | None]],
) -> list[GangRow]:
    """One row per group listed by any host (hosts: name, its jobs, its latest sample), by
    group name; an exited rank is left out."""
    rows: dict[str, GangRow] = {}
    for host, jobs, sample in hosts:
        for job in jobs:
            gang = job.get("gang")
            if not gang or job.get("state") == "exited":
                continue
            row = rows.setdefault(
                gang["group"], GangRow(gang["group"], gang["world"], gang["backend"])
            )
            lowest = min(row.ranks, default=None)
            row.ranks[gang["rank"]] = host
            if lowest is None or gang["rank"] < lowest:
                row.state, row.cause = gang["state"], gang["cause"]
                row.duty = gang.get("duty")
            celsius = (sample or {}).get("celsius")
            if celsius is not None and (row.hottest is None or celsius > row.hottest[0]):
                sensor = (sample or {}).get("sensor")
                where = str((sample or {}).get("source")) + (f" · {sensor}" if sensor else "")
                row.hottest = (celsius, host, where)
    return [rows[group] for group in sorted(rows)]
