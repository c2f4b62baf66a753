"""`coordinator benchmark`, `coordinator status` and `coordinator keys`: driving agents."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

import typer
import zmq
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table

from coordinator.embedded import EmbeddedAgent, EmbeddedAgentError
from coordinator.fleet import (
    CELL,
    DONE,
    HOST_OK,
    MACHINE,
    STARTED,
    FleetResult,
    HostEvent,
    Settings,
    Target,
    connect,
    run_fleet,
)
from coordinator.hostfile import HostfileError, parse_hostfile, parse_hosts
from coordinator.keys import add_host_key, known_hosts, server_key
from coordinator.store import RunStore
from shared.exit_codes import EXIT_INTERRUPTED, EXIT_PARTIAL
from shared.io.cli import check_output, emit, err, fail, show_report, usage_error
from shared.io.keys import own_keypair
from shared.io.options import (
    MatrixOptions,
    Output,
    ReportFormat,
    TableFormat,
    with_options,
)
from shared.io.sqlite import StoreError
from shared.io.transport import HostError
from shared.matrix import MatrixError
from shared.report import NA, hardware_details, memory_text
from shared.results import failed_cells

Hosts = Annotated[
    str | None,
    typer.Option(
        "--hosts",
        help="Comma list of HOST[:PORT] running `agent serve` (port 5555 by default). "
        "Without --hosts or --hostfile a local agent is started and stopped for the run.",
    ),
]
Hostfile = Annotated[
    Path | None,
    typer.Option(
        "--hostfile", help="TOML or JSON list of hosts (host, port, key); mlx.launch's JSON too."
    ),
]
ConnectTimeout = Annotated[
    float,
    typer.Option(
        "--connect-timeout",
        min=0.1,
        help="Seconds a host has to answer before it is reported unreachable.",
    ),
]
Insecure = Annotated[
    bool,
    typer.Option("--insecure", help="No CURVE: for agents started with `agent serve --insecure`."),
]


def targets_from(hosts: str | None, hostfile: Path | None) -> list[Target] | None:
    """The hosts named by --hosts / --hostfile, or None when neither was given."""
    if hosts and hostfile:
        raise usage_error("give --hosts or --hostfile, not both")
    try:
        if hosts:
            entries = parse_hosts(hosts)
        elif hostfile:
            entries = parse_hostfile(hostfile)
        else:
            return None
        return [Target(e.address, e.address, server_key(e)) for e in entries]
    except (HostfileError, ValueError) as exc:
        raise usage_error(str(exc)) from None


def targets_or_known(hosts: str | None, hostfile: Path | None) -> list[Target]:
    """The hosts named, else every host with a key from `coordinator keys add`."""
    targets = targets_from(hosts, hostfile)
    if targets is not None:
        return targets
    try:
        targets = [Target(address, address, key) for address, key in known_hosts().items()]
    except ValueError as exc:
        raise usage_error(str(exc)) from None
    if not targets:
        raise usage_error(
            "no hosts: give --hosts or --hostfile, or add keys with "
            "`coordinator keys add HOST[:PORT] KEY`"
        )
    return targets


def settings_for(insecure: bool, connect_timeout: float) -> Settings:
    if insecure:
        err.print(
            "[bold red]WARNING: --insecure: CURVE is off; agents are not "
            "authenticated and traffic is clear text.[/bold red]",
            highlight=False,
        )
    return Settings(None if insecure else own_keypair(), connect_timeout)


class FleetProgress:
    """One Rich progress bar per host on stderr, fed by the fleet's events."""

    def __init__(self, names: list[str]) -> None:
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=err,
            transient=True,
        )
        self.tasks: dict[str, TaskID] = {
            name: self.progress.add_task(f"{name}: connecting", total=None) for name in names
        }

    def __call__(self, event: HostEvent) -> None:
        task = self.tasks[event.host]
        if event.kind == MACHINE:
            self.progress.update(task, description=f"{event.host}: {event.data.get('device', '?')}")
        elif event.kind == STARTED:
            self.progress.update(task, total=len(event.data["cells"]))
        elif event.kind == CELL:
            self.progress.advance(task)
        elif event.kind == DONE:
            outcome = event.data["status"] if event.data["status"] == HOST_OK else "FAILED"
            self.progress.update(task, description=f"{event.host}: {outcome}")
            if event.data["error"]:
                err.print(f"{event.host}: {event.data['error']}", highlight=False)


@with_options
def benchmark(
    matrix: MatrixOptions,
    fmt: ReportFormat = "table",
    output: Output = None,
    hosts: Hosts = None,
    hostfile: Hostfile = None,
    connect_timeout: ConnectTimeout = 5.0,
    insecure: Insecure = False,
) -> None:
    """Run one benchmark matrix on every host at once; one table, the fastest host marked.

    --model paths are directories on each agent's own disk.
    """
    check_output(output)
    try:
        spec = matrix.spec()
    except MatrixError as exc:
        raise usage_error(str(exc)) from None
    targets = targets_from(hosts, hostfile)
    try:
        store = RunStore()
    except StoreError as exc:
        raise usage_error(str(exc)) from None
    with store:
        if targets is None:
            keypair = own_keypair()
            try:
                with EmbeddedAgent(keypair) as local:
                    local_target = Target("local", local.address, local.server_key)
                    result, report = drive(
                        store, [local_target], spec.to_dict(), Settings(keypair, connect_timeout)
                    )
            except EmbeddedAgentError as exc:
                raise fail(str(exc), EXIT_PARTIAL) from None
        else:
            result, report = drive(
                store, targets, spec.to_dict(), settings_for(insecure, connect_timeout)
            )
    show_report(report, fmt, output)
    err.print(f"run {result.run_id} stored: `coordinator show {result.run_id}`", highlight=False)
    if result.interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    if not result.hosts_ok or failed_cells(report["cells"]):
        raise typer.Exit(EXIT_PARTIAL)


def drive(
    store: RunStore, targets: list[Target], spec: dict[str, Any], settings: Settings
) -> tuple[FleetResult, dict[str, Any]]:
    progress = FleetProgress([t.name for t in targets])
    with progress.progress:
        result = run_fleet(targets, spec, store, settings, observer=progress)
    return result, store.load_report(result.run_id)


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
            row["thermal_source"] or NA,
            celsius,
            f"{job['id']} ({job['done']}/{job['total']})" if job else "idle",
        )
    return table


def status(
    hosts: Hosts = None,
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
    ctx = zmq.Context()
    with ThreadPoolExecutor(len(targets)) as pool:  # all hosts at once: one timeout, not N
        rows = list(pool.map(lambda target: host_status(ctx, target, settings), targets))
    ctx.destroy(linger=0)
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


@keys_app.command("add")
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
    err.print(f"{stored}: server key {key}", highlight=False)
