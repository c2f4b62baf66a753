"""`coordinator health` and `coordinator uncordon`: which Mac is sick, from the run store
(shared.benchmark.health's scores and flags), and the cordons they leave
(coordinator.runs.conditions)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text

from coordinator.runs.conditions import (
    add_condition,
    conditions,
    known_host,
    record_health,
    uncordon,
)
from coordinator.runs.health import latest_run, observations, run_health
from coordinator.runs.store import RunStore, UnknownRunError
from shared.benchmark.health import DRIFT, NO_FAMILY, PANICKED, as_dict, drifted, panicked
from shared.clock import utc_now
from shared.io.cli import data_home, emit, err, usage_error
from shared.io.options import TableFormat
from shared.io.sqlite import StoreError
from shared.safe_text import shown
from shared.tables import TEXT, WHOLE, WORDS, FitTable

HealthRun = Annotated[
    str | None,
    typer.Argument(
        help="The benchmark run judged (an id or a unique prefix; default: the latest)."
    ),
]
Record = Annotated[
    bool,
    typer.Option(
        "--record/--no-record",
        help="Keep each flag as the host's condition (it is cordoned) and lift those the run "
        "clears (default: record).",
    ),
]


def health(run: HealthRun = None, record: Record = True, fmt: TableFormat = "table") -> None:
    """Which Mac is sick: each host of a stored benchmark run against its family and its own
    past, flagged out-of-family or degraded and cordoned (docs/performance.md, Fleet health).

    The relative score is a host's tok/s over its family's median (same chip, GPU cores,
    memory, power mode, macOS build, MLX version, cell), the individual one over its own best
    in its recent runs; a family of fewer than 3 hosts scores nobody (`no family`)."""
    data_home(write=record)
    try:
        with RunStore() as store:
            run_id = store.resolve(run) if run is not None else latest_run(store)
            if run_id is None:
                raise usage_error("no benchmark run stored yet: `coordinator benchmark` makes one")
            scores = run_health(store, run_id)
            named = named_conditions(store, run_id)
            if record:
                record_health(store, run_id, scores)
                for host, found in named.items():
                    for name, detail in found.items():
                        add_condition(store, host, name, detail, run_id)
            cordons = conditions(store)
    except (UnknownRunError, StoreError) as exc:
        raise usage_error(str(exc)) from None
    report = {
        "run_id": run_id,
        "hosts": [as_dict(score) for score in scores.values()],
        "conditions": cordons,
        "found": named,
    }
    emit(report, fmt, health_table)
    if not scores and fmt == "table":
        err.print(f"run {run_id} has no valid cell to score", highlight=False, markup=False)


def named_conditions(store: RunStore, run_id: str) -> dict[str, dict[str, str]]:
    """The run's hosts that drift from their siblings' software or panicked in the last 24 h:
    host -> {condition: why}."""
    found: dict[str, dict[str, str]] = {}
    for host, why in drifted(observations(store), run_id).items():
        found.setdefault(host, {})[DRIFT] = why
    cells = store.load_report(run_id)["cells"]
    for host, why in panicked(cells, utc_now().timestamp()).items():
        found.setdefault(host, {})[PANICKED] = why
    return found


HEALTH_FOLDS = ("family", "spread", "own spread", "runs")
"""The columns a narrow terminal drops, the first first; host, scores and flags stay."""


def health_table(report: dict[str, Any]) -> FitTable:
    table = FitTable(title=f"mlx-fleet health {report['run_id']}", folds=HEALTH_FOLDS)
    for name in ("host", "family", "relative", "spread", "individual", "own spread", "runs"):
        table.add_column(name, wrap=TEXT if name == "family" else WHOLE)
    table.add_column("flags and conditions", wrap=WORDS)
    cordons = report["conditions"]
    for host in report["hosts"]:
        held = [item["name"] for item in cordons.get(host["host"], [])]
        said = "; ".join(host["why"]) or ("" if host["state"] is None else host["state"])
        marks = ", ".join(host["flags"]) + (f": {said}" if said else "")
        if held:
            marks += f" [cordoned: {', '.join(held)}]"
        relative = ratio(host["relative"]) if host["relative"] is not None else NO_FAMILY
        table.add_row(
            Text(shown(host["host"])),
            Text(shown(host["family"])),
            relative,
            share(host["family_spread"]),
            ratio(host["individual"]),
            share(host["own_spread"]),
            str(host["history"]),
            Text(shown(marks.strip(", "))),
            style="red" if host["flags"] else None,
        )
    for name, held in cordons.items():
        if name not in {host["host"] for host in report["hosts"]}:
            listed = ", ".join(item["name"] for item in held)
            table.add_row(Text(shown(name)), "", "", "", "", "", "", Text(f"[cordoned: {listed}]"))
    return table


def ratio(value: float | None) -> str:
    return "N/A" if value is None else f"{value:.3f}"


def share(value: float | None) -> str:
    return "N/A" if value is None else f"{value * 100:.1f} %"


def uncordon_command(
    host: Annotated[str, typer.Argument(help="The host, as `coordinator health` names it.")],
) -> None:
    """Lift a host's conditions, so the next matrix and group run it again."""
    data_home()
    try:
        with RunStore() as store:
            if not known_host(store, host):
                raise usage_error(
                    f"unknown host {shown(host, 80)!r}: no stored run or condition names it"
                )
            lifted = uncordon(store, host)
    except StoreError as exc:
        raise usage_error(str(exc)) from None
    said = f"lifted {', '.join(lifted)}" if lifted else "it was not cordoned"
    err.print(f"{shown(host)}: {said}", highlight=False, markup=False)
