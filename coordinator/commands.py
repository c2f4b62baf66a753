"""`coordinator status` and `coordinator keys`: what each agent says, and whom we expect."""

from __future__ import annotations

from typing import Annotated, Any

import typer
import zmq
from rich.table import Table

from coordinator.fleet import Settings, Target, connect
from coordinator.hosts_cli import (
    ConnectTimeout,
    Hostfile,
    Insecure,
    KnownHosts,
    on_every_host,
    settings_for,
    targets_or_known,
)
from coordinator.keys import add_host_key
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import emit, err, usage_error
from shared.io.keys import own_keypair
from shared.io.options import TAKES_A_KEY, TableFormat
from shared.io.transport import HostError
from shared.report import NA, hardware_details, memory_text
from shared.source_names import read_from


def host_status(ctx: zmq.Context, target: Target, settings: Settings) -> dict[str, Any]:
    """What one agent says about itself, or why it said nothing."""
    row: dict[str, Any] = {"host": target.name, "reachable": False, "error": None}
    try:
        with connect(ctx, target, settings) as client:
            info = client.request("info")
    except HostError as exc:
        row["error"] = str(exc)
        return row
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


def status_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="mlx-fleet agents")
    for name in ("host", "reachable", "agent", "device", "memory", "thermal", "SoC °C", "job"):
        table.add_column(name, overflow="fold")
    for row in rows:
        if not row["reachable"]:
            table.add_row(row["host"], f"no: {row['error']}", style="red")
            continue
        celsius = NA if row["celsius"] is None else f"{row['celsius']:.1f}"
        if row["pressure"]:
            celsius += f" ({row['pressure']})"
        if row["celsius"] is not None and row["simulated"]:
            celsius += " (simulated)"
        job = row["job"]
        table.add_row(
            row["host"],
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
    return table


def status(
    hosts: KnownHosts = None,
    hostfile: Hostfile = None,
    fmt: TableFormat = "table",
    connect_timeout: ConnectTimeout = 5.0,
    insecure: Insecure = False,
) -> None:
    """Each agent: reachable or not, version, device, memory, temperature, running job.

    Without --hosts or --hostfile: every host with a key from `coordinator keys add`.
    """
    targets = targets_or_known(hosts, hostfile)
    settings = settings_for(insecure, connect_timeout)
    rows = on_every_host(targets, lambda ctx, target: host_status(ctx, target, settings))
    emit(rows, fmt, status_table)
    if not all(row["reachable"] for row in rows):
        raise typer.Exit(EXIT_PARTIAL)


keys_app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    help="This coordinator's CURVE key and the agents' keys it expects.",
)


@keys_app.command("show")
def keys_show() -> None:
    """Print this coordinator's public key alone (give it to `agent keys trust`)."""
    print(own_keypair().public)


@keys_app.command("add", context_settings=TAKES_A_KEY)
def keys_add(
    address: Annotated[
        str, typer.Argument(help="HOST[:PORT] of the agent (port 5555 by default).")
    ],
    key: Annotated[str, typer.Argument(help="The agent's public key (`agent keys show`).")],
) -> None:
    """Expect KEY from the agent at HOST[:PORT]: the coordinator refuses any other."""
    try:
        stored = add_host_key(address, key)
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    err.print(f"{stored}: server key {key}", highlight=False, markup=False)
