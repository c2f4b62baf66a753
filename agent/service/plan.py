"""What `agent install` would install: the plan for a scope, a service manager and an account."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from agent.service.control import ServiceError
from agent.service.files import (
    LAUNCHD,
    SYSTEM,
    SYSTEMD,
    USER,
    InstallPlan,
    default_log_file,
    default_platform_flavour,
    serve_program,
    service_environment,
)
from agent.service.managers import acting_ids
from agent.service.run_as import Account, account, default_data_dir, invoking_account
from shared.io.paths import HOME_ENV, data_dir


def user_scope_under_root() -> str | None:
    """Why `--user` is refused here, or None: under sudo (or as root) it would be root's own
    LaunchAgent in user/0, its plist and logs root-owned in the caller's home."""
    if acting_ids()[1] != 0:
        return None
    return (
        "--user as root would install root's own service, with root-owned files in "
        f"{Path.home()}: drop sudo to install yours, or use --system (a system service "
        "running as you)"
    )


class PlanError(ValueError):
    """Options that make no plan (both scopes, both managers, an account that does not exist):
    the command says so as a usage error."""


def service_account(system: bool, run_as: str | None) -> Account | None:
    """Who a system service runs as (None: a user service, run by its user)."""
    if run_as is not None and not system:
        raise PlanError("--run-as is for --system: a --user service runs as its user")
    if not system:
        return None
    try:
        return account(run_as) if run_as else invoking_account()
    except ServiceError as exc:
        raise PlanError(str(exc)) from None


def make_plan(
    user: bool,
    system: bool,
    launchd: bool,
    systemd: bool,
    bind: str | None = None,
    thermal_source: str | None = None,
    log_file: Path | None = None,
    run_as: str | None = None,
    data_dir_option: Path | None = None,
) -> InstallPlan:
    if user and system:
        raise PlanError("choose one of --user and --system")
    if launchd and systemd:
        raise PlanError("choose one of --launchd and --systemd")
    uid, euid = acting_ids()
    # Homebrew's System.path/domain_target: root means the boot path and the system domain.
    system = system or (not user and euid == 0)
    flavour = LAUNCHD if launchd else SYSTEMD if systemd else default_platform_flavour()
    runner = service_account(system, run_as)
    if data_dir_option is not None:
        home = data_dir_option.absolute()
    elif os.environ.get(HOME_ENV) or runner is None or runner.uid == euid:
        home = data_dir(create=False)
    else:  # root installing another user's service: that user's own data directory
        home = default_data_dir(runner.home)
    log_file = log_file.absolute() if log_file else default_log_file(flavour, home)
    return InstallPlan(
        flavour=flavour,
        scope=SYSTEM if system else USER,
        program=serve_program(sys.executable, bind, thermal_source, log_file),
        data_dir=home,
        home=Path.home(),
        uid=uid,
        environment=service_environment(home),
        user=None if runner is None or runner.is_root else runner.name,
        owner=None if runner is None or runner.is_root else (runner.uid, runner.gid),
    )
