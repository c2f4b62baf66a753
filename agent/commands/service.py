"""`agent install`, `agent uninstall`, `agent service-status`: the agent as a service."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ParamSpec

import typer

from agent.daemon.endpoints import ServeError, endpoint_for
from agent.service.control import (
    ServiceError,
    dry_run_domain,
    dry_run_lines,
    install,
    log_paths,
    require_root_for_system,
    source_problem,
    status,
    uninstall,
)
from agent.service.files import (
    LAUNCHD,
    SYSTEMD,
    InstallPlan,
    default_platform_flavour,
    definition_text,
)
from agent.service.launchctl import current_session
from agent.service.plan import PlanError, make_plan, user_scope_under_root
from agent.service.privacy import first_protected, protected_message
from agent.service.run_as import invoking_account, root_program_problem
from agent.service.scope import SudoRefused, auto_scope, escalated, sudo_allows
from shared.cooling.sources import SourceSpecError, parse_source_name
from shared.io.cli import emit, err, fail, usage_error
from shared.io.options import TableFormat
from shared.tables import TEXT, FitTable

UserScope = Annotated[
    bool,
    typer.Option("--user", help="A per-user service (the default, except as root or under sudo)."),
]
SystemScope = Annotated[
    bool,
    typer.Option(
        "--system",
        help="A system-wide service (a LaunchDaemon / system unit: up at boot, with nobody "
        "logged in); root, or --sudo. The default as root or under sudo, as with "
        "`sudo brew services`.",
    ),
]
Launchd = Annotated[bool, typer.Option("--launchd", help="Force launchd (macOS default).")]
Systemd = Annotated[bool, typer.Option("--systemd", help="Force systemd (Linux default).")]
RunAs = Annotated[
    str | None,
    typer.Option(
        "--run-as",
        help="With --system: the account the service runs as (default: the user running "
        "sudo). `root` only for an installation no other user can change.",
    ),
]
DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="The service's data directory (default: $MLX_FLEET_HOME, else the platform's "
        "data dir of the account it runs as).",
    ),
]


Params = ParamSpec("Params")


def say(line: str) -> None:
    err.print(line, highlight=False, markup=False)


def refused_as_usage_error(make: Callable[Params, InstallPlan]) -> Callable[Params, InstallPlan]:
    """`make`, whose PlanError becomes a usage error (exit 2)."""

    def plan(*args: Params.args, **kwargs: Params.kwargs) -> InstallPlan:
        try:
            return make(*args, **kwargs)
        except PlanError as exc:
            raise usage_error(str(exc)) from None

    return plan


plan_for = refused_as_usage_error(make_plan)


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


def check_root_program(plan: InstallPlan) -> None:
    """A root service runs only what root alone can change (issue: `--system` deploys ran a
    user-writable venv as root); Homebrew chowns such files, we refuse and say how."""
    if not plan.system or plan.user is not None:
        return
    problem = root_program_problem(plan.program)
    if problem:
        raise usage_error(
            f"a root service would run {plan.program[0]}, but {problem}: another user could "
            "change what root runs. Run it as a user (--run-as NAME; the default is the user "
            "who runs sudo), or install mlx-fleet where only root can write (a virtual "
            "environment made and filled with sudo, e.g. under /opt)"
        )


def service_paths(plan: InstallPlan) -> list[tuple[str, Path]]:
    """What a service reads and writes, as agent.service.privacy checks them."""
    import agent

    package = Path(agent.__file__).parent
    return [
        ("interpreter", Path(plan.program[0])),
        ("package", package),
        ("data directory", plan.data_dir),
    ]


def check_private_folders(plan: InstallPlan) -> None:
    """A launchd service whose files lie where macOS's privacy controls keep launchd jobs out
    (~/Documents, iCloud Drive, /Volumes/...) would fail to start: refused, with the fix."""
    if plan.flavour != LAUNCHD:
        return
    found = first_protected(service_paths(plan), plan.home)
    if found is not None:
        raise usage_error(protected_message(*found))


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
    run_as: RunAs = None,
    data_dir_option: DataDir = None,
    sudo: Annotated[
        bool,
        typer.Option(
            "--sudo",
            help="With --system and not root: run this installation through `sudo -n` "
            "(never prompts) as yourself.",
        ),
    ] = False,
    auto: Annotated[
        bool,
        typer.Option(
            "--auto",
            help="Choose --user or --system as `coordinator deploy` does: on a Mac where you "
            "are not logged in at the screen (or where the system service is installed), "
            "a LaunchDaemon running as you through `sudo -n`; otherwise a user service.",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print what would be written and run; change nothing.")
    ] = False,
) -> None:
    """Install `agent serve` as a launchd (macOS) or systemd (Linux) service and start it.

    Installing again replaces the existing service. --bind and --thermal-source are checked
    as `agent serve` checks them, and the source must open on this machine (not checked with
    --dry-run). --dry-run prints the definition on stdout and the commands on stderr.
    A system service runs as the user who runs sudo (launchd UserName, systemd User=) unless
    --run-as says otherwise; a root one only from an installation no other user can change."""
    check_serve_options(bind, thermal_source)
    if auto:
        if user or system:
            raise usage_error("--auto chooses between --user and --system itself")
        system = choose_scope(launchd, systemd, dry_run)
        user = not system
    refused = user_scope_under_root() if user and not auto else None
    if refused:
        raise usage_error(refused)
    plan = plan_for(
        user, system, launchd, systemd, bind, thermal_source, log_file, run_as, data_dir_option
    )
    check_private_folders(plan)
    if plan.system and os.geteuid() != 0 and (sudo or auto) and not dry_run:
        code = through_sudo(plan, run_as, bind, thermal_source, log_file, launchd, systemd)
        if code == 0 and auto:
            retire_user_service(launchd, systemd)
        raise typer.Exit(code)
    if dry_run:  # the definition alone on stdout, so it can be piped to a parser
        say(f"would write {plan.definition_path}:")
        print(definition_text(plan, dry_run_domain(plan)), end="")
        for line in dry_run_lines(plan):
            say(f"would run: {line}")
        return
    try:
        require_root_for_system(plan)
    except ServiceError as exc:
        raise fail(str(exc), exc.exit_code) from None
    check_root_program(plan)
    problem = source_problem(plan, thermal_source) if thermal_source else None
    if problem:
        raise usage_error(
            f"thermal source {thermal_source!r} cannot open on this machine: "
            f"{problem}; the service would fail to start (choose another "
            "--thermal-source, or auto)"
        )
    try:
        for line in install(plan):
            say(line)
    except ServiceError as exc:
        raise fail(str(exc), exc.exit_code) from None
    say(f"logs: {', '.join(log_paths(plan))}")
    if auto and plan.system:
        retire_user_service(launchd, systemd)


def retire_user_service(launchd: bool, systemd: bool) -> None:
    """After --auto installed the system service: this user's service gives way (never two
    copies on one port). Removed only now, so a failed system install leaves it running."""
    try:
        for line in uninstall(plan_for(True, False, launchd, systemd), purge=False):
            say(line)
    except ServiceError as exc:
        say(
            f"warning: the user service could not be removed ({exc}): remove it "
            "(agent uninstall --user), or the system service cannot bind its port"
        )


def choose_scope(launchd: bool, systemd: bool, dry_run: bool) -> bool:
    """--auto: True for a system service. Says why on a `service:` line (deploy reports it)."""
    flavour = LAUNCHD if launchd else SYSTEMD if systemd else default_platform_flavour()
    system_plan = plan_for(False, True, launchd, systemd)
    choice = auto_scope(flavour, current_session(), system_plan.definition_path.exists())
    if choice.system and os.geteuid() != 0 and not dry_run and not sudo_allows(sudo_argv()):
        say(f"service: user ({choice.fallback})")
        return False
    say(f"service: {'system' if choice.system else 'user'} ({choice.why})")
    return choice.system


def sudo_argv() -> list[str]:
    """This installation's `agent` (what a sudoers rule names), else `python -m agent`."""
    script = Path(sys.executable).with_name("agent")
    return [str(script)] if script.exists() else [sys.executable, "-m", "agent"]


def through_sudo(
    plan: InstallPlan,
    run_as: str | None,
    bind: str | None,
    thermal_source: str | None,
    log_file: Path | None,
    launchd: bool,
    systemd: bool,
) -> int:
    """This very installation again, as root through `sudo -n`, for this user and data
    directory; returns its exit code."""
    args = ["install", "--system", "--run-as", run_as or invoking_account().name]
    args += ["--data-dir", str(plan.data_dir)]
    for name, value in (("--bind", bind), ("--thermal-source", thermal_source)):
        if value is not None:
            args += [name, value]
    if log_file is not None:
        args += ["--log-file", str(log_file.absolute())]
    args += ["--launchd"] if launchd else ["--systemd"] if systemd else []
    try:
        command = escalated(sudo_argv() + args)
    except SudoRefused as exc:
        raise usage_error(
            f"--system installs a system-wide service and needs root: {exc} "
            "(run it with sudo, or allow passwordless sudo for this agent)"
        ) from None
    say(f"running: {' '.join(command)}")
    return subprocess.run(command, check=False).returncode


def uninstall_command(
    user: UserScope = False,
    system: SystemScope = False,
    launchd: Launchd = False,
    systemd: Systemd = False,
    purge: Annotated[
        bool, typer.Option("--purge", help="Also delete the data directory (results, keys, logs).")
    ] = False,
) -> None:
    """Stop and remove the agent service (every loaded copy); data is kept unless --purge."""
    plan = plan_for(user, system, launchd, systemd)
    try:
        done = uninstall(plan, purge)
    except ServiceError as exc:
        raise fail(str(exc), exc.exit_code) from None
    for line in done or ["nothing was installed"]:
        say(line)


def service_status_command(
    user: UserScope = False,
    system: SystemScope = False,
    launchd: Launchd = False,
    systemd: Systemd = False,
    fmt: TableFormat = "table",
) -> None:
    """Is the agent service installed and running? Its pid, last exit status and logs."""
    plan = plan_for(user, system, launchd, systemd)
    try:
        report = status(plan)
    except ServiceError as exc:
        raise fail(str(exc), exc.exit_code) from None
    emit(report, fmt, status_table)


def status_table(report: dict[str, Any]) -> FitTable:
    """A `field  value` list (shared.tables): a field, a pid and an exit status never wrap; a
    long path or log line wraps in its cell."""
    table = FitTable(show_header=False, title="mlx-fleet agent service")
    table.add_column("field")
    table.add_column("value", wrap=TEXT)
    for key, value in report.items():
        shown = ", ".join(value) if isinstance(value, list) else value
        table.add_row(key, "N/A" if shown is None else str(shown))
    return table
