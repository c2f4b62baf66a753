"""`agent install`, `agent uninstall`, `agent service-status`: the agent as a service."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from agent.endpoints import ServeError, endpoint_for
from agent.service import (
    LAUNCHD,
    SYSTEM,
    SYSTEMD,
    USER,
    InstallPlan,
    ServiceError,
    default_log_file,
    default_platform_flavour,
    definition_text,
    install,
    install_commands,
    log_paths,
    serve_program,
    service_environment,
    source_problem,
    status,
    uninstall,
)
from shared.io.cli import emit, err, fail, usage_error
from shared.io.options import TableFormat
from shared.io.paths import data_dir
from shared.source_names import SourceSpecError, parse_source_name

UserScope = Annotated[bool, typer.Option("--user", help="A per-user service (the default).")]
SystemScope = Annotated[
    bool,
    typer.Option("--system", help="A system-wide service (root; needed only for powermetrics)."),
]
Launchd = Annotated[bool, typer.Option("--launchd", help="Force launchd (macOS default).")]
Systemd = Annotated[bool, typer.Option("--systemd", help="Force systemd (Linux default).")]


def make_plan(
    user: bool,
    system: bool,
    launchd: bool,
    systemd: bool,
    bind: str | None = None,
    thermal_source: str | None = None,
    log_file: Path | None = None,
) -> InstallPlan:
    if user and system:
        raise usage_error("choose one of --user and --system")
    if launchd and systemd:
        raise usage_error("choose one of --launchd and --systemd")
    flavour = LAUNCHD if launchd else SYSTEMD if systemd else default_platform_flavour()
    home = data_dir(create=False)
    log_file = log_file.absolute() if log_file else default_log_file(flavour, home)
    return InstallPlan(
        flavour=flavour,
        scope=SYSTEM if system else USER,
        program=serve_program(sys.executable, bind, thermal_source, log_file),
        data_dir=home,
        home=Path.home(),
        uid=os.getuid(),
        environment=service_environment(home),
    )


def check_serve_options(bind: str | None, thermal_source: str | None) -> None:
    """Refuse what `agent serve` would refuse, with its own parsers, before a service
    crash-loops on it."""
    try:
        if bind is not None:
            endpoint_for(bind)
        if thermal_source is not None:
            parse_source_name(thermal_source)
    except (ServeError, SourceSpecError) as exc:
        raise usage_error(str(exc)) from None


def install_command(
    user: UserScope = False,
    system: SystemScope = False,
    launchd: Launchd = False,
    systemd: Systemd = False,
    bind: Annotated[
        str | None,
        typer.Option("--bind", help="HOST:PORT for `agent serve` (its default when omitted)."),
    ] = None,
    thermal_source: Annotated[
        str | None,
        typer.Option("--thermal-source", help="Thermal source for `agent serve` (default auto)."),
    ] = None,
    log_file: Annotated[
        Path | None,
        typer.Option(
            "--log-file",
            help="`agent serve --log-file`: a log rotated at 10 MB (launchd default: "
            "<data dir>/logs/agent.log; systemd: the journal).",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would be written and run; change nothing.")
    ] = False,
) -> None:
    """Install `agent serve` as a launchd (macOS) or systemd (Linux) service and start it.

    Installing again replaces the existing service. --bind and --thermal-source are checked
    as `agent serve` checks them, and the source must open on this machine (not checked with
    --dry-run). --dry-run prints the definition on stdout and the commands on stderr."""
    check_serve_options(bind, thermal_source)
    plan = make_plan(user, system, launchd, systemd, bind, thermal_source, log_file)
    if dry_run:  # the definition alone on stdout, so it can be piped to a parser
        err.print(f"would write {plan.definition_path}:", highlight=False, markup=False)
        print(definition_text(plan), end="")
        for command in install_commands(plan):
            err.print(f"would run: {shlex.join(command)}", highlight=False, markup=False)
        return
    problem = source_problem(plan, thermal_source) if thermal_source else None
    if problem:
        raise usage_error(
            f"thermal source {thermal_source!r} cannot open on this machine: "
            f"{problem}; the service would fail to start (choose another "
            "--thermal-source, or auto)"
        )
    try:
        for line in install(plan):
            err.print(line, highlight=False, markup=False)
    except ServiceError as exc:
        raise fail(str(exc), exc.exit_code) from None
    err.print(f"logs: {', '.join(log_paths(plan))}", highlight=False, markup=False)


def uninstall_command(
    user: UserScope = False,
    system: SystemScope = False,
    launchd: Launchd = False,
    systemd: Systemd = False,
    purge: Annotated[
        bool, typer.Option("--purge", help="Also delete the data directory (results, keys, logs).")
    ] = False,
) -> None:
    """Stop and remove the agent service; data is kept unless --purge."""
    plan = make_plan(user, system, launchd, systemd)
    try:
        done = uninstall(plan, purge)
    except ServiceError as exc:
        raise fail(str(exc), exc.exit_code) from None
    for line in done or ["nothing was installed"]:
        err.print(line, highlight=False, markup=False)


def service_status_command(
    user: UserScope = False,
    system: SystemScope = False,
    launchd: Launchd = False,
    systemd: Systemd = False,
    fmt: TableFormat = "table",
) -> None:
    """Is the agent service installed and running? Its pid, last exit status and logs."""
    plan = make_plan(user, system, launchd, systemd)
    try:
        report = status(plan)
    except ServiceError as exc:
        raise fail(str(exc), exc.exit_code) from None
    emit(report, fmt, status_table)


def status_table(report: dict[str, Any]) -> Table:
    table = Table(show_header=False, title="mlx-fleet agent service")
    for key, value in report.items():
        shown = ", ".join(value) if isinstance(value, list) else value
        table.add_row(key, "N/A" if shown is None else str(shown))
    return table
