"""`coordinator status`: what each agent says about itself, one row a host."""

from __future__ import annotations

from typing import Any

import typer
from rich.text import Text

from coordinator.commands.hosts import FleetOptions, HostRow
from coordinator.runs.conditions import conditions
from coordinator.runs.store import RunStore
from shared.cooling.sources import read_from
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import data_home, emit
from shared.io.options import TableFormat, with_options
from shared.io.sqlite import StoreError
from shared.io.transport import AgentClient
from shared.reports.benchmark import NA, hardware_details, memory_text
from shared.safe_text import shown
from shared.tables import TEXT, WHOLE, FitTable


def ask_status(client: AgentClient, row: HostRow) -> None:
    """What one agent says about itself."""
    info = client.request("info", timeout=client.connect_timeout)
    machine, thermal = info["machine"], info["thermal"]
    reading = thermal.get("reading") or {}
    row.update(
        reachable=True,
        agent=info["agent"],
        protocol=info["protocol"],
        hostname=machine.get("hostname"),
        device=machine.get("device"),
        hardware=", ".join(hardware_details(machine)) or None,
        memory_gb=machine.get("memory_gb"),
        memory_gib=machine.get("memory_gib"),
        thermal_source=thermal.get("source"),
        sensor=reading.get("sensor"),
        celsius=reading.get("celsius"),
        pressure=reading.get("pressure"),
        simulated=bool(reading.get("simulated")),
        thermal_error=thermal.get("error"),
        job=info["job"],
    )
    return row


STATUS_FOLDS = ("memory", "agent", "device", "thermal")
"""The columns a narrow terminal drops, the first first (shared.tables); host, reachable (or
why not), SoC °C and the job always stay."""


def status_table(rows: list[dict[str, Any]]) -> FitTable:
    """Every cell an agent's words, shown() and as Text: never markup, never an escape."""
    table = FitTable(title="mlx-fleet agents", folds=STATUS_FOLDS)
    for name in ("host", "reachable", "agent", "device", "memory", "thermal", "SoC °C", "job"):
        table.add_column(name, wrap=TEXT if name in ("reachable", "device") else WHOLE)
    for row in rows:
        if not row["reachable"]:
            table.add_row(*cells(row["host"], f"no: {row['error']}"), style="red")
            continue
        celsius = NA if row["celsius"] is None else f"{row['celsius']:.1f}"
        if row["pressure"]:
            celsius += f" ({row['pressure']})"
        if row["celsius"] is not None and row["simulated"]:
            celsius += " (simulated)"
        job = row["job"]
        cordoned = row.get("conditions")
        table.add_row(
            *cells(
                row["host"] + (f" (cordoned: {', '.join(cordoned)})" if cordoned else ""),
                "yes",
                row["agent"],
                ", ".join(filter(None, [row["device"] or NA, row["hardware"]])),
                NA if row["memory_gb"] is None else memory_text(row),
                NA
                if row["thermal_source"] is None
                else read_from(row["thermal_source"], row["sensor"]),
                celsius,
                f"{job['id']} ({job['done']}/{job['total']})" if job else "idle",
            )
        )
    return table


def cells(*values: object) -> list[Text]:
    return [Text(shown(value)) for value in values]


def with_conditions(rows: list[dict[str, Any]]) -> None:
    """Each row's `conditions` from the run store (coordinator.runs.conditions): the names that
    cordon the host, empty when none; nil when no store can be read."""
    try:
        with RunStore() as store:
            held = conditions(store, [row["host"] for row in rows])
    except StoreError:
        held = None
    for row in rows:
        row["conditions"] = None if held is None else [c["name"] for c in held.get(row["host"], [])]


@with_options
def status(fleet: FleetOptions, fmt: TableFormat = "table") -> None:
    """Each agent: reachable or not, version, device, memory, temperature, running job.

    Without --hosts or --hostfile: every host with a key from `coordinator keys add`.
    """
    data_home()  # this coordinator's keys and known hosts live there
    rows = fleet.ask_each(lambda target: {"reachable": False}, ask_status)
    with_conditions(rows)
    emit(rows, fmt, status_table)
    if not all(row["reachable"] for row in rows):
        raise typer.Exit(EXIT_PARTIAL)
