"""Pure aggregation over the cells of many hosts: what a fleet report adds to one host's."""

from __future__ import annotations

from typing import Any

from shared.benchmark.results import OK
from shared.benchmark.verdict import separated

Record = dict[str, Any]

ORDER_FIELDS = (
    "model",
    "bits",
    "batch_size",
    "n_depth",
    "mode",
    "n_prompt",
    "n_gen",
    "test",
    "host",
)
"""How every table orders its rows: by model, bits, batch, depth, test (its mode and token
counts first, so pp512 follows pp64), then host."""


def _ordered(value: Any) -> tuple[int, Any]:
    """A sort key for one field: numbers by value, then text, then unknowns (None) last, so no
    two kinds are ever compared."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return 0, value
    if value is None:
        return 2, ""
    return 1, str(value)


def cell_order(record: Record) -> tuple[tuple[int, Any], ...]:
    """The key that sorts records into table order (ORDER_FIELDS), deterministic whatever the
    fields hold."""
    modes = {"prefill": 0, "decode": 1, "prefill+decode": 2}  # pp, tg, pp+tg: as planned
    return tuple(
        _ordered(modes.get(record.get(key), record.get(key)) if key == "mode" else record.get(key))
        for key in ORDER_FIELDS
    )


def ordered(records: list[Record]) -> list[Record]:
    """`records` in table order (a stable sort: equal keys keep their arrival order)."""
    return sorted(records, key=cell_order)


def mark_fastest(cells: list[Record]) -> list[Record]:
    """Copies of `cells` with "fastest": True on the quickest ok record of each cell name, only
    where its 95 % interval separates from every other host's on that cell (shared.benchmark.verdict
    .separated): a lead inside the noise is no lead.

    A cell is only raced when at least two hosts have an ok result for it: one host alone is not
    the fastest of anything. A record without an interval (n = 1) never wins, and neither does a
    tie. Stale marks are dropped, so marking twice gives the same answer.
    """
    best: dict[str, int] = {}
    racing: dict[str, list[int]] = {}
    for index, record in enumerate(cells):
        speed = record.get("tokens_per_sec")
        if record.get("status") != OK or speed is None:
            continue
        name = record["name"]
        racing.setdefault(name, []).append(index)
        if name not in best or speed > cells[best[name]]["tokens_per_sec"]:
            best[name] = index
    winners = set()
    for name, index in best.items():
        winner = cells[index]
        others = [cells[i] for i in racing[name] if cells[i].get("host") != winner.get("host")]
        if others and all(separated(winner, other) for other in others):
            winners.add(index)
    marked = []
    for index, record in enumerate(cells):
        copy = {key: value for key, value in record.items() if key != "fastest"}
        if index in winners:
            copy["fastest"] = True
        marked.append(copy)
    return marked
