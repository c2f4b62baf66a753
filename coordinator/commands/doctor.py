"""`coordinator doctor`: every agent's `agent doctor` report, collected over the protocol (the
`doctor` request, docs/protocol.md §5), in one table."""

from __future__ import annotations

from typing import Annotated

import typer

from coordinator.commands.hosts import (
    ConnectTimeout,
    Hostfile,
    HostRow,
    Insecure,
    KnownHosts,
    ask_each,
    settings_for,
    targets_or_known,
)
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import data_home, emit, usage_error
from shared.io.options import TableFormat
from shared.io.transport import AgentClient, AgentError
from shared.reports.doctor_verdict import doctor_view
from shared.wire import protocol as p

DOCTOR_TIMEOUT_S = 120.0
"""An agent's report takes seconds: a 1 s benchmark and a first reading of every sensor."""


def ask_doctor(client: AgentClient, row: HostRow, bandwidth: bool = False) -> None:
    """One agent's report; with `bandwidth` its memory probe too, where an agent that predates
    the probe (it refuses the field) gives its report without it and the row says so."""
    row["reachable"] = True
    if not bandwidth:
        row["report"] = client.request("doctor", timeout=DOCTOR_TIMEOUT_S)["report"]
        return
    try:
        row["report"] = client.request("doctor", {"bandwidth": True}, timeout=DOCTOR_TIMEOUT_S)[
            "report"
        ]
    except AgentError as exc:
        if exc.code != p.BAD_BODY:
            raise
        row["bandwidth_refused"] = (
            "this agent predates the memory-bandwidth probe: upgrade it (coordinator deploy)"
        )
        ask_doctor(client, row)


def doctor_refused(exc: AgentError, row: HostRow) -> None:
    row["error"] = (
        "this agent predates the `doctor` request: upgrade it (coordinator deploy), or run "
        "`agent doctor` on that host"
        if exc.code == p.UNKNOWN_TYPE
        else str(exc)
    )


Level = Annotated[
    int,
    typer.Option(
        "--level",
        help="1: each agent's doctor; 2: also a memory-bandwidth probe and a fixed small decode "
        "cell on every host, each judged against its family's earlier level-2 results, the SoC "
        "sensor under that load and the bandwidth the decode implies (a minute or two).",
    ),
]


def doctor_command(
    hosts: KnownHosts = None,
    hostfile: Hostfile = None,
    fmt: TableFormat = "table",
    connect_timeout: ConnectTimeout = 5.0,
    insecure: Insecure = False,
    level: Level = 1,
) -> None:
    """Each agent's `agent doctor` (Python, MLX, a 1 s benchmark, every thermal source, ports,
    service, firewall...), as its service sees its Mac, in one table.

    Without --hosts or --hostfile: every host with a key from `coordinator keys add`. Each
    host's failed required checks come first, and each host ends with its verdict line.
    Exit codes: 0 when every agent answered and can run, 1 otherwise, 2 bad usage. --level 2
    prints one table, a verdict per host, records a failing host's condition `doctor` (it is
    cordoned) and lifts a passing host's conditions."""
    if level not in (1, 2):
        raise usage_error(f"--level {level}: choose 1 or 2 (level 3, the burn-in, is not built)")
    targets = targets_or_known(hosts, hostfile)
    settings = settings_for(insecure, connect_timeout)
    rows = ask_each(
        targets,
        settings,
        lambda _: {"reachable": False, "error": None, "report": None},
        lambda client, row: ask_doctor(client, row, bandwidth=level >= 2),
        doctor_refused,
    )
    if level == 2:
        from coordinator.commands.doctor_levels import level_two, level_two_table, record_verdicts
        from coordinator.runs.store import RunStore

        data_home()
        with RunStore() as store:
            rows, result = level_two(rows, targets, settings, store)
            record_verdicts(store, rows, result.run_id if result else None)
        emit(rows, fmt, level_two_table)
        if any(row["verdict"] != "pass" for row in rows):
            raise typer.Exit(EXIT_PARTIAL)
        return
    emit(rows, fmt, lambda hosts: doctor_view(hosts, named=True))
    if not all(row["report"] and row["report"]["ok"] for row in rows):
        raise typer.Exit(EXIT_PARTIAL)
