"""The agent as a system service: launchd on macOS, systemd on Linux.

Pure builders turn an InstallPlan into a plist or a unit file and the commands that load it;
a thin shell writes the files and runs launchctl / systemctl. `--dry-run` prints the plan.
"""

from __future__ import annotations

import os
import plistlib
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from xml.parsers.expat import ExpatError

from shared.io.paths import HOME_ENV

LABEL = "io.mlx-fleet.agent"
"""launchd Label, and the plist's file name (`io.mlx-fleet.agent.plist`)."""
UNIT_NAME = "mlx-fleet-agent.service"
LAUNCHD, SYSTEMD = "launchd", "systemd"
USER, SYSTEM = "user", "system"
THROTTLE_INTERVAL_S = 10
STOP_TIMEOUT_S = 30
MANAGER_TIMEOUT_S = 60
LAUNCHCTL_NOT_FOUND = 113
"""`launchctl print` of a job that is not loaded (any other failure: launchd not reachable)."""
SOURCE_CHECK = """\
import sys
from agent.thermal import SourceSpecError, SourceUnavailable, open_source
try:
    open_source(sys.argv[1]).close()
except (SourceSpecError, SourceUnavailable) as exc:
    sys.exit(str(exc))
"""


class ServiceError(Exception):
    """A service operation that failed; the message says why."""

    exit_code = 1


class ServiceRefused(ServiceError):
    """A request refused before anything changed (no root, nothing to purge): a usage error."""

    exit_code = 2


@dataclass(frozen=True)
class InstallPlan:
    """Everything an installation needs, decided up front so a dry run can show it whole."""

    flavour: str
    scope: str
    program: list[str]
    data_dir: Path
    home: Path
    uid: int
    environment: dict[str, str] = field(default_factory=dict)

    @property
    def log_file(self) -> Path | None:
        """`serve --log-file`: the rotated log, when the program has one."""
        if "--log-file" not in self.program[:-1]:
            return None
        return Path(self.program[self.program.index("--log-file") + 1])

    @property
    def stdout_log(self) -> Path:
        return self.data_dir / "logs" / "agent.out.log"

    @property
    def stderr_log(self) -> Path:
        return self.data_dir / "logs" / "agent.err.log"

    @property
    def definition_path(self) -> Path:
        if self.flavour == LAUNCHD:
            folder = (
                self.home / "Library/LaunchAgents"
                if self.scope == USER
                else Path("/Library/LaunchDaemons")
            )
            return folder / f"{LABEL}.plist"
        folder = (
            self.home / ".config/systemd/user"
            if self.scope == USER
            else Path("/etc/systemd/system")
        )
        return folder / UNIT_NAME


def default_platform_flavour() -> str:
    return LAUNCHD if sys.platform == "darwin" else SYSTEMD


def default_log_file(flavour: str, data_dir: Path) -> Path | None:
    """launchd never rotates StandardOutPath, so its services log to serve's rotated file;
    systemd's journal rotates by itself."""
    return data_dir / "logs" / "agent.log" if flavour == LAUNCHD else None


def serve_program(
    python: str, bind: str | None, thermal_source: str | None, log_file: Path | None
) -> list[str]:
    """Absolute interpreter path plus `-m agent serve ...`: valid without any PATH."""
    program = [python, "-m", "agent", "serve"]
    if bind:
        program += ["--bind", bind]
    if thermal_source:
        program += ["--thermal-source", thermal_source]
    if log_file:
        program += ["--log-file", str(log_file)]
    return program


def service_environment(data_dir: Path) -> dict[str, str]:
    """What `serve` needs: its data directory, unbuffered logs, and a PATH finding macmon."""
    path = os.pathsep.join(
        dict.fromkeys(
            [
                str(Path(sys.executable).parent),
                "/opt/homebrew/bin",
                "/usr/local/bin",
                "/usr/bin",
                "/bin",
                "/usr/sbin",
                "/sbin",
            ]
        )
    )
    return {HOME_ENV: str(data_dir), "PYTHONUNBUFFERED": "1", "PATH": path}


def launchd_plist(plan: InstallPlan) -> dict[str, Any]:
    return {
        "Label": LABEL,
        "ProgramArguments": plan.program,
        "RunAtLoad": True,
        "KeepAlive": True,
        "ThrottleInterval": THROTTLE_INTERVAL_S,
        "ExitTimeOut": STOP_TIMEOUT_S,
        "StandardOutPath": str(plan.stdout_log),
        "StandardErrorPath": str(plan.stderr_log),
        "EnvironmentVariables": plan.environment,
        "WorkingDirectory": str(plan.data_dir),
        # Benchmarks must not be throttled like a background daemon.
        "ProcessType": "Interactive",
    }


def systemd_unit(plan: InstallPlan) -> str:
    environment = "\n".join(
        f"Environment={shlex.quote(f'{key}={value}')}" for key, value in plan.environment.items()
    )
    target = "default.target" if plan.scope == USER else "multi-user.target"
    return f"""[Unit]
Description=mlx-fleet agent (MLX benchmarks and thermal policy)
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
ExecStart={shlex.join(plan.program)}
{environment}
WorkingDirectory={plan.data_dir}
Restart=on-failure
RestartSec={THROTTLE_INTERVAL_S}
KillSignal=SIGTERM
TimeoutStopSec={STOP_TIMEOUT_S}

[Install]
WantedBy={target}
"""


def definition_text(plan: InstallPlan) -> str:
    if plan.flavour == LAUNCHD:
        return plistlib.dumps(launchd_plist(plan), sort_keys=False).decode()
    return systemd_unit(plan)


def launchd_domains(plan: InstallPlan) -> list[str]:
    """Domains to try in order: a user agent wants the GUI session, else (over ssh) `user/`."""
    if plan.scope == SYSTEM:
        return ["system"]
    return [f"gui/{plan.uid}", f"user/{plan.uid}"]


def systemctl(plan: InstallPlan, *args: str) -> list[str]:
    return ["systemctl", *(["--user"] if plan.scope == USER else []), *args]


def install_commands(plan: InstallPlan) -> list[list[str]]:
    """The commands an installation runs (the first launchd domain shown; others are retries)."""
    if plan.flavour == LAUNCHD:
        domain = launchd_domains(plan)[0]
        return [
            ["launchctl", "bootout", f"{domain}/{LABEL}"],
            ["launchctl", "bootstrap", domain, str(plan.definition_path)],
        ]
    return [
        systemctl(plan, "daemon-reload"),
        systemctl(plan, "enable", "--now", UNIT_NAME),
        systemctl(plan, "restart", UNIT_NAME),
    ]


# --- parsing service managers' answers (pure) ------------------------------------------------

LAUNCHCTL_FIELDS = {
    "state": "state",
    "pid": "pid",
    "last exit code": "last_exit",
    "path": "path",
    "program": "program",
}


def parse_launchctl_print(text: str) -> dict[str, str]:
    """The top-level fields of `launchctl print <domain>/<label>` that status needs."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^\t([a-z ]+?) = (.*)$", line)
        if match and match.group(1) in LAUNCHCTL_FIELDS:
            found.setdefault(LAUNCHCTL_FIELDS[match.group(1)], match.group(2).strip())
    return found


def parse_systemctl_show(text: str) -> dict[str, str]:
    """`systemctl show -p A,B` prints `A=value` lines."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def parse_definition(flavour: str, text: str) -> tuple[list[str], dict[str, str]]:
    """The program and environment of a definition this module wrote (plist or unit).

    Raises ValueError when the text is not one."""
    if flavour == LAUNCHD:
        try:
            plist = plistlib.loads(text.encode())
        except ExpatError as exc:
            raise ValueError(str(exc)) from None
        if not isinstance(plist, dict):
            raise ValueError("not a launchd job")
        return list(plist.get("ProgramArguments", [])), dict(plist.get("EnvironmentVariables", {}))
    program: list[str] = []
    environment: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key == "ExecStart":
            program = shlex.split(value)
        elif key == "Environment":
            environment.update(item.split("=", 1) for item in shlex.split(value) if "=" in item)
    return program, environment


@dataclass(frozen=True)
class ManagerState:
    """What launchd / systemd say of the service. `loaded` is None when the manager could not
    be asked; `reason` says why, so nobody reads "not running" into an unanswered question."""

    loaded: bool | None
    fields: dict[str, str] = field(default_factory=dict)
    domain: str | None = None
    reason: str | None = None


# --- the shell: files and service managers ---------------------------------------------------


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=MANAGER_TIMEOUT_S)
    except FileNotFoundError:
        raise ServiceError(f"{command[0]} not found: is this a {command[0]} system?") from None
    except subprocess.TimeoutExpired:
        raise ServiceError(
            f"{shlex.join(command)} did not answer in {MANAGER_TIMEOUT_S} s"
        ) from None


def failure(command: list[str], result: subprocess.CompletedProcess[str]) -> str:
    """The manager's own words for a failed call."""
    said = (result.stderr or result.stdout).strip()
    return f"{shlex.join(command)} failed: {said or f'exit code {result.returncode}'}"


def check(command: list[str]) -> str:
    """Run a manager command that must succeed; returns it as a line for the report."""
    result = run(command)
    if result.returncode != 0:
        raise ServiceError(failure(command, result))
    return shlex.join(command)


def require_root_for_system(scope: str) -> None:
    if scope == SYSTEM and os.geteuid() != 0:
        raise ServiceRefused(
            "--system installs a system-wide service and needs root: "
            "run it with sudo, or use --user"
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


def probe(plan: InstallPlan) -> ManagerState:
    """Ask the service manager whether the service is loaded, and its runtime fields."""
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
    answered = False
    for domain in launchd_domains(plan):
        command = ["launchctl", "print", f"{domain}/{LABEL}"]
        try:
            result = run(command)
        except ServiceError as exc:
            return ManagerState(None, reason=str(exc))
        if result.returncode == 0:
            return ManagerState(True, parse_launchctl_print(result.stdout), domain)
        answered = answered or result.returncode == LAUNCHCTL_NOT_FOUND
        if result.returncode != LAUNCHCTL_NOT_FOUND:
            reasons.append(failure(command, result))
    return ManagerState(False) if answered else ManagerState(None, reason="; ".join(reasons))


def stop(plan: InstallPlan, state: ManagerState) -> list[str]:
    """Stop and unload the service where the manager has it loaded. A failure is an error:
    a service reported removed must not still be running."""
    if state.loaded is None:
        raise ServiceError(f"cannot tell whether the service is loaded: {state.reason}")
    if not state.loaded:
        return []
    if plan.flavour == LAUNCHD:
        return [check(["launchctl", "bootout", f"{state.domain}/{LABEL}"])]
    return [check(systemctl(plan, "disable", "--now", UNIT_NAME))]


def start(plan: InstallPlan) -> list[str]:
    """Load and start the written definition (launchd: the first domain that takes it)."""
    if plan.flavour == SYSTEMD:
        return [check(command) for command in install_commands(plan)]
    errors = []
    for domain in launchd_domains(plan):
        command = ["launchctl", "bootstrap", domain, str(plan.definition_path)]
        result = run(command)
        if result.returncode == 0:
            return [shlex.join(command)]
        errors.append(failure(command, result))
    raise ServiceError("; ".join(errors))


def install(plan: InstallPlan) -> list[str]:
    """Write the definition and (re)start the service; returns what was done, line by line.

    When the manager refuses, the definition written is rolled back (the previous one
    restored), so an installation is never reported where none runs."""
    require_root_for_system(plan.scope)
    done = stop(plan, probe(plan)) if plan.flavour == LAUNCHD else []  # never two copies
    plan.stdout_log.parent.mkdir(parents=True, exist_ok=True)
    path = plan.definition_path
    path.parent.mkdir(parents=True, exist_ok=True)
    previous = path.read_bytes() if path.exists() else None
    path.write_text(definition_text(plan), encoding="utf-8")
    done.append(f"wrote {path}")
    try:
        return done + start(plan)
    except ServiceError as exc:
        if previous is None:
            path.unlink()
            undone = f"removed {path}"
        else:
            path.write_bytes(previous)
            undone = f"restored the previous {path}"
        raise ServiceError(f"{exc} ({undone})") from None


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
    """Stop and remove the service; the data directory stays unless `purge`, which removes
    the one the installed service uses (and refuses to guess when that cannot be read)."""
    require_root_for_system(plan.scope)
    path = plan.definition_path
    installed = installed_plan(plan)
    if purge and installed is None:
        raise ServiceRefused(
            f"--purge deletes the data directory the installed service names, and {path} "
            f"{'names none' if path.exists() else 'is not there'}: nothing was changed "
            "(delete a data directory by hand)"
        )
    state = probe(plan)
    if state.loaded is None and not path.exists():  # nothing here, whatever the manager says
        return []
    try:
        done = stop(plan, state)
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
    return [*logs, "journalctl" + (" --user" if plan.scope == USER else "") + f" -u {UNIT_NAME}"]


def status(plan: InstallPlan) -> dict[str, Any]:
    """Installed? loaded? running? pid, last exit, where the logs are; "unknown" with the
    reason when the service manager could not be asked."""
    state = probe(plan)
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


# --- reviewed templates in deploy/ ------------------------------------------------------------

TEMPLATE_PYTHON = "@PYTHON@"
TEMPLATE_DATA_DIR = "@DATA_DIR@"
TEMPLATE_HOME = "@HOME@"


def template_files() -> dict[str, str]:
    """deploy/'s templates: the exact definitions `agent install` writes, with placeholders
    for the interpreter, the data directory and the home folder."""
    files = {}
    for flavour, scope, name in (
        (LAUNCHD, USER, f"{LABEL}.user.plist"),
        (LAUNCHD, SYSTEM, f"{LABEL}.system.plist"),
        (SYSTEMD, USER, "mlx-fleet-agent.user.service"),
        (SYSTEMD, SYSTEM, "mlx-fleet-agent.system.service"),
    ):
        data_dir = Path(TEMPLATE_DATA_DIR)
        environment = {HOME_ENV: TEMPLATE_DATA_DIR, "PYTHONUNBUFFERED": "1", "PATH": "@PATH@"}
        plan = InstallPlan(
            flavour=flavour,
            scope=scope,
            program=serve_program(TEMPLATE_PYTHON, None, None, default_log_file(flavour, data_dir)),
            data_dir=data_dir,
            home=Path(TEMPLATE_HOME),
            uid=0,
            environment=environment,
        )
        files[name] = definition_text(plan)
    return files


def write_templates(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in template_files().items():
        (folder / name).write_text(text, encoding="utf-8")
        written.append(folder / name)
    return written


if __name__ == "__main__":  # python -m agent.service deploy/  (refresh the templates)
    for path in write_templates(Path(sys.argv[1] if len(sys.argv) > 1 else "deploy")):
        print(path)
