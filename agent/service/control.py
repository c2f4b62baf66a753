"""The agent as a system service: launchd on macOS, systemd on Linux.

agent.service.files builds the plan and the definition it writes (pure); this shell writes it and
drives launchctl (through agent.service.launchctl, Homebrew's way) or systemctl. `--dry-run` prints
the plan."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agent.service.definition_file import (
    ROOT_WHEEL,
    make_folder,
    refuse_odd_definition,
    write_definition,
)
from agent.service.files import (
    LAUNCHD,
    SYSTEMD,
    UNIT_NAME,
    InstallPlan,
    definition_text,
    parse_definition,
    parse_launchctl_print,
    parse_systemctl_show,
    systemctl,
    systemd_commands,
    template_files,
    write_templates,
)
from agent.service.launchctl import (
    DomainUnsupported,
    Launchctl,
    bootstrap_domains,
    current_session,
    owned_domains,
    target,
)
from agent.service.managers import (
    MANAGER_TIMEOUT_S,
    ServiceError,
    ServiceRefused,
    check,
    failure,
    run,
)
from shared.io.paths import HOME_ENV

SOURCE_CHECK = """\
import sys
from agent.thermal import SourceSpecError, SourceUnavailable, open_source
try:
    open_source(sys.argv[1]).close()
except (SourceSpecError, SourceUnavailable) as exc:
    sys.exit(str(exc))
"""

__all__ = ["ServiceError", "ServiceRefused", "template_files"]


@dataclass(frozen=True)
class ManagerState:
    """What launchd / systemd say of the service. `loaded` is None when the manager could not
    be asked; `reason` says why, so nobody reads "not running" into an unanswered question.
    `domains` lists every launchd domain a copy is loaded in, `domain` the first."""

    loaded: bool | None
    fields: dict[str, str] = field(default_factory=dict)
    domain: str | None = None
    domains: tuple[str, ...] = ()
    reason: str | None = None


def require_root_for_system(plan: InstallPlan) -> None:
    if plan.system and os.geteuid() != 0:
        raise ServiceRefused(
            "--system installs a system-wide service and needs root: "
            "run it with sudo (or add --sudo), or use --user"
        )


def source_problem(plan: InstallPlan, source: str) -> str | None:
    """Why `source` cannot open for the service, or None: asked of the service's interpreter
    with the service's environment (its PATH finds Homebrew's tools, a login shell's may not)."""
    result = subprocess.run(
        [plan.program[0], "-c", SOURCE_CHECK, source],
        capture_output=True,
        text=True,
        timeout=MANAGER_TIMEOUT_S,
        env={**os.environ, **plan.environment},
    )
    lines = result.stderr.strip().splitlines()
    return None if result.returncode == 0 else lines[-1] if lines else "it failed to open"


def dry_run_domain(plan: InstallPlan) -> str | None:
    """The domain a dry run shows (gui/ assumed to exist: a dry run asks launchd nothing)."""
    if plan.flavour != LAUNCHD:
        return None
    return bootstrap_domains(plan.system, current_session(), gui_exists=True)[0]


def dry_run_lines(plan: InstallPlan) -> list[str]:
    """The commands an installation runs, as a dry run shows them."""
    if plan.flavour == SYSTEMD:
        return [shlex.join(command) for command in systemd_commands(plan)]
    lines = [
        f"launchctl bootout {target(domain)}  (where loaded; then until `launchctl print` "
        "no longer lists it)"
        for domain in owned_domains(plan.system, plan.uid)
    ]
    first, *fallback = bootstrap_domains(plan.system, current_session(), gui_exists=True)
    probed = "(if `launchctl print gui/<uid>` exits 0) " if first.startswith("gui/") else ""
    lines += [
        f"launchctl enable {target(first)}  {probed}".rstrip(),
        f"launchctl bootstrap {first} {plan.definition_path}",
    ]
    lines += [f"(if {first} has no session: the same in {other})" for other in fallback]
    return lines


def probe(plan: InstallPlan, launchctl: Launchctl) -> ManagerState:
    """Ask the service manager whether the service is loaded (launchd: in which domains), and
    its runtime fields."""
    if plan.flavour == SYSTEMD:
        command = systemctl(
            plan, "show", UNIT_NAME, "-p", "LoadState,ActiveState,SubState,MainPID,ExecMainStatus"
        )
        try:
            result = run(command)
        except ServiceError as exc:
            return ManagerState(None, reason=str(exc))
        if result.returncode != 0:
            return ManagerState(None, reason=failure(command, result))
        fields = parse_systemctl_show(result.stdout)
        return ManagerState(fields.get("LoadState") not in ("not-found", None), fields)
    reasons: list[str] = []
    loaded: list[str] = []
    fields = {}
    for domain in owned_domains(plan.system, plan.uid):
        try:
            found, text = launchctl.print(domain)
        except ServiceError as exc:
            reasons.append(str(exc))
            continue
        if found:
            loaded.append(domain)
            fields = fields or parse_launchctl_print(text)
    if loaded:
        return ManagerState(True, fields, loaded[0], tuple(loaded))
    if len(reasons) == len(owned_domains(plan.system, plan.uid)):
        return ManagerState(None, reason="; ".join(reasons))
    return ManagerState(False)


def stop(plan: InstallPlan, state: ManagerState, launchctl: Launchctl) -> list[str]:
    """Stop and unload the service wherever the manager has it loaded (launchd: every domain,
    each waited for). A failure is an error: a service reported removed must not still run."""
    if state.loaded is None:
        raise ServiceError(f"cannot tell whether the service is loaded: {state.reason}")
    if not state.loaded:
        return []
    if plan.flavour == LAUNCHD:
        return [launchctl.bootout(domain) for domain in state.domains]
    return [check(systemctl(plan, "disable", "--now", UNIT_NAME))]


def definition_owner(plan: InstallPlan) -> tuple[int, int] | None:
    """root:wheel for a system service (launchd insists); a user's own for a user service."""
    return ROOT_WHEEL if plan.system else None


def write(plan: InstallPlan, domain: str | None = None) -> str:
    text = definition_text(plan, domain).encode()
    write_definition(plan.definition_path, text, definition_owner(plan))
    return f"wrote {plan.definition_path}" + (f" (for {domain})" if domain else "")


def launchd_domains(plan: InstallPlan, launchctl: Launchctl) -> list[str]:
    """Where to bootstrap: Homebrew's domain_target, gui/ only where `print gui/<uid>` finds it."""
    session = current_session()
    gui_exists = not plan.system and launchctl.has_domain(f"gui/{session.uid}")
    return bootstrap_domains(plan.system, session, gui_exists)


def start(
    plan: InstallPlan, launchctl: Launchctl, domains: list[str], booted_out: tuple[str, ...]
) -> list[str]:
    """Write the definition and load it (launchd: in the first of `domains` this session can
    use, the plist written for that domain)."""
    if plan.flavour == SYSTEMD:
        return [write(plan), *[check(command) for command in systemd_commands(plan)]]
    errors = []
    done = []
    for domain in domains:
        done.append(write(plan, domain))
        try:
            path = str(plan.definition_path)
            return done + launchctl.start(domain, path, booted_out=domain in booted_out)
        except DomainUnsupported as exc:
            errors.append(str(exc))
    raise ServiceError("; ".join(errors))


def install(plan: InstallPlan) -> list[str]:
    """Write the definition and (re)start the service; returns what was done, line by line.

    When the manager refuses, the definition written is rolled back (the previous one
    restored, and launchd's previous service loaded again), so an installation is never
    reported where none runs."""
    require_root_for_system(plan)
    path = plan.definition_path
    refuse_odd_definition(path)
    launchctl = Launchctl()
    state = probe(plan, launchctl) if plan.flavour == LAUNCHD else ManagerState(False)
    domains = launchd_domains(plan, launchctl) if plan.flavour == LAUNCHD else []
    done = stop(plan, state, launchctl)  # never two copies
    make_folder(plan.stdout_log.parent, plan.owner)
    make_folder(path.parent, None)
    previous = path.read_bytes() if path.exists() else None
    try:
        return done + start(plan, launchctl, domains, state.domains)
    except ServiceError as exc:
        raise ServiceError(f"{exc} {rollback(plan, previous, state, launchctl)}") from None


def rollback(
    plan: InstallPlan, previous: bytes | None, state: ManagerState, launchctl: Launchctl
) -> str:
    """Put the previous definition back (and reload launchd's previous service, which was
    stopped for this install); says what was done."""
    path = plan.definition_path
    if previous is None:
        path.unlink(missing_ok=True)
        undone = f"(removed {path})"
    else:
        write_definition(path, previous, definition_owner(plan))
        undone = f"(restored the previous {path})"
    if plan.flavour != LAUNCHD or not state.domains:
        return undone
    if previous is None:
        return f"{undone}; the copy loaded without a definition stays stopped"
    try:
        launchctl.start(state.domains[0], str(path), booted_out=True)
    except ServiceError as exc:
        return f"{undone}; the previous service, stopped for this install, did not load: {exc}"
    return f"{undone}; the previous service is loaded again in {state.domains[0]}"


def installed_plan(plan: InstallPlan) -> InstallPlan | None:
    """The plan as it was installed: program, environment and data directory read back from
    the definition, since this shell's MLX_FLEET_HOME need not be the service's. None when
    no definition is there, or it is not one this module wrote."""
    try:
        program, environment = parse_definition(
            plan.flavour, plan.definition_path.read_text(encoding="utf-8")
        )
    except (OSError, ValueError):
        return None
    if not program or HOME_ENV not in environment:
        return None
    return replace(
        plan, program=program, environment=environment, data_dir=Path(environment[HOME_ENV])
    )


def uninstall(plan: InstallPlan, purge: bool) -> list[str]:
    """Stop and remove the service (launchd: every loaded copy of its scope); the data
    directory stays unless `purge`, which removes the one the installed service uses (and
    refuses to guess when that cannot be read)."""
    require_root_for_system(plan)
    path = plan.definition_path
    refuse_odd_definition(path)
    installed = installed_plan(plan)
    if purge and installed is None:
        raise ServiceRefused(
            f"--purge deletes the data directory the installed service names, and {path} "
            f"{'names none' if path.exists() else 'is not there'}: nothing was changed "
            "(delete a data directory by hand)"
        )
    launchctl = Launchctl()
    state = probe(plan, launchctl)
    if state.loaded is None and not path.exists():  # nothing here, whatever the manager says
        return []
    try:
        done = stop(plan, state, launchctl)
    except ServiceError as exc:
        raise ServiceError(f"{exc} (nothing was removed: the service may still run)") from None
    if path.exists():
        path.unlink()
        done.append(f"removed {path}")
        if plan.flavour == SYSTEMD:
            done.append(check(systemctl(plan, "daemon-reload")))
    if installed is not None and purge and installed.data_dir.exists():
        shutil.rmtree(installed.data_dir)
        done.append(f"removed data directory {installed.data_dir}")
    return done


def log_paths(plan: InstallPlan) -> list[str]:
    """Where the service's output goes: the rotated --log-file, then launchd's files (what
    was printed before logging started) or the journal."""
    logs = [str(plan.log_file)] if plan.log_file else []
    if plan.flavour == LAUNCHD:
        return [*logs, str(plan.stdout_log), str(plan.stderr_log)]
    return [*logs, "journalctl" + ("" if plan.system else " --user") + f" -u {UNIT_NAME}"]


def status(plan: InstallPlan) -> dict[str, Any]:
    """Installed? loaded (launchd: in which domains)? running? pid, last exit, where the logs
    are; "unknown" with the reason when the service manager could not be asked."""
    state = probe(plan, Launchctl())
    report: dict[str, Any] = {
        "flavour": plan.flavour,
        "scope": plan.scope,
        "definition": str(plan.definition_path),
        "installed": plan.definition_path.exists(),
        "loaded": state.loaded,
        "running": False,
        "pid": None,
        "last_exit": None,
        "logs": log_paths(installed_plan(plan) or plan),
    }
    fields = state.fields
    if state.loaded is None:
        report.update(loaded="unknown", running="unknown", reason=state.reason)
    elif plan.flavour == LAUNCHD and state.loaded:
        report.update(
            domain=state.domain,
            domains=list(state.domains),
            running=fields.get("state") == "running",
            pid=int(fields["pid"]) if "pid" in fields else None,
            last_exit=fields.get("last_exit"),
        )
    elif plan.flavour == SYSTEMD and state.loaded:
        pid = int(fields.get("MainPID", "0") or 0)
        report.update(
            running=fields.get("ActiveState") == "active",
            pid=pid or None,
            last_exit=fields.get("ExecMainStatus"),
            state=fields.get("SubState"),
        )
    return report


if __name__ == "__main__":  # python -m agent.service.control deploy/  (refresh the templates)
    for written in write_templates(Path(sys.argv[1] if len(sys.argv) > 1 else "deploy")):
        print(written)
