"""`coordinator doctor`: every agent's `agent doctor` report, collected over the protocol (the
`doctor` request, docs/protocol.md §5), in one table."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from coordinator.commands.hosts import FleetOptions, HostRow, RingPort, ask_each
from shared.benchmark.sustain import SustainError, SustainPlan, parse_duration
from shared.distributed.rank_env import DEFAULT_STARTING_PORT
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import data_home, emit, err, usage_error
from shared.io.options import TableFormat, with_options
from shared.io.signals import interrupted_exit_code
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
        "sensor under that load and the bandwidth the decode implies (a minute or two); 3 (a "
        "burn-in, ~15 min): also that cell sustained to steady state on every host at once "
        "(--duration) and netbench over every link among the hosts, one pair at a time.",
    ),
]


Duration = Annotated[
    str | None,
    typer.Option(
        "--duration",
        metavar="DURATION",
        help="Level 3 only: how long the sustained run lasts (30s, 5m, 1h; default 15m). "
        "Level 2 and the links take minutes more.",
    ),
]


@with_options
def doctor_command(
    fleet: FleetOptions,
    fmt: TableFormat = "table",
    level: Level = 1,
    duration: Duration = None,
    port: RingPort = DEFAULT_STARTING_PORT,
) -> None:
    """Each agent's `agent doctor` (Python, MLX, a 1 s benchmark, every thermal source, ports,
    service, firewall...), as its service sees its Mac, in one table.

    Without --hosts or --hostfile: every host with a key from `coordinator keys add`. Each
    host's failed required checks come first, and each host ends with its verdict line.
    Exit codes: 0 when every agent answered and can run, 1 otherwise, 2 bad usage. --level 2
    and 3 print one table, a verdict per host, record a failing host's condition `doctor` (it
    is cordoned) and lift a passing host's conditions; 130 for a level 3 interrupted (the
    table holds what was measured; no condition changes)."""
    if level not in (1, 2, 3):
        raise usage_error(f"--level {level}: choose 1, 2 or 3")
    plan = burn_in(level, duration)
    targets = fleet.targets()
    settings = fleet.settings()
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
    if plan is not None:
        burn_in_verdicts(rows, targets, settings, plan, port, fmt)
        return
    emit(rows, fmt, lambda hosts: doctor_view(hosts, named=True))
    if not all(row["report"] and row["report"]["ok"] for row in rows):
        raise typer.Exit(EXIT_PARTIAL)


def burn_in(level: int, duration: str | None) -> SustainPlan | None:
    """Level 3's sustained plan (None below level 3); exit 2 for a --duration that is not a
    positive duration within bounds, or one given below level 3."""
    if level < 3:
        if duration is not None:
            raise usage_error(f"--duration is level 3's (the burn-in); this is level {level}")
        return None
    from shared.reports.burn_in import DEFAULT_DURATION_S, burn_in_plan

    try:
        seconds = DEFAULT_DURATION_S if duration is None else parse_duration(duration, "--duration")
        return burn_in_plan(seconds)
    except SustainError as exc:
        raise usage_error(str(exc)) from None


def burn_in_verdicts(
    rows: list[HostRow],
    targets: list[Any],
    settings: Any,
    plan: SustainPlan,
    port: int,
    fmt: str,
) -> None:
    """Level 3 over the level-1 rows: the table, the conditions (none changed when
    interrupted) and the exit code."""
    from coordinator.commands.doctor_burn_in import level_three, level_three_table
    from coordinator.commands.doctor_levels import record_verdicts
    from coordinator.runs.store import RunStore

    data_home()
    with RunStore() as store:
        rows, stopped, run_id = level_three(rows, targets, settings, store, plan, port)
        if not stopped:
            record_verdicts(store, rows, run_id)
    emit(rows, fmt, level_three_table)
    if stopped:
        err.print("interrupted: the table holds what was measured; no condition was changed")
        raise typer.Exit(interrupted_exit_code())
    if any(row["verdict"] != "pass" for row in rows):
        raise typer.Exit(EXIT_PARTIAL)
