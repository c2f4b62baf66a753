"""Pure aggregation over the cells of many hosts: what a fleet report adds to one host's."""

from __future__ import annotations

from typing import Any

from shared.results import OK

Record = dict[str, Any]


def mark_fastest(cells: list[Record]) -> list[Record]:
    """Copies of `cells` with "fastest": True on the quickest ok record of each cell name.

    A cell is only raced when at least two hosts have an ok result for it: one host alone is not
    the fastest of anything. Ties go to the earlier record. Stale marks are dropped, so marking
    twice gives the same answer.
    """
    best: dict[str, int] = {}
    hosts: dict[str, set[Any]] = {}
    for index, record in enumerate(cells):
        speed = record.get("tokens_per_sec")
        if record.get("status") != OK or speed is None:
            continue
        name = record["name"]
        hosts.setdefault(name, set()).add(record.get("host"))
        if name not in best or speed > cells[best[name]]["tokens_per_sec"]:
            best[name] = index
    winners = {index for name, index in best.items() if len(hosts[name]) >= 2}
    marked = []
    for index, record in enumerate(cells):
        copy = {key: value for key, value in record.items() if key != "fastest"}
        if index in winners:
            copy["fastest"] = True
        marked.append(copy)
    return marked
