"""What an agent service installation is and writes: the InstallPlan, the launchd plist or
systemd unit built from it, and the parsers that read a written definition and the managers'
answers back. Pure: agent.service.control does the writing and the running.
"""

from __future__ import annotations

import os
import plistlib
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.parsers.expat import ExpatError

from agent.service.launchctl import LABEL, SESSION_TYPES
from shared.io.paths import HOME_ENV

UNIT_NAME = "mlx-fleet-agent.service"
LAUNCHD, SYSTEMD = "launchd", "systemd"
USER, SYSTEM = "user", "system"
DAEMONS_ENV = "MLX_FLEET_LAUNCH_DAEMONS"
"""Stands in for /Library/LaunchDaemons, as MLX_FLEET_CONSOLE_DEVICE does for /dev/console: a
suite run as root installs its system services into a folder of its own."""
THROTTLE_INTERVAL_S = 10
STOP_TIMEOUT_S = 30


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
    user: str | None = None
    """A system service's account (launchd UserName, systemd User=); None runs it as root."""
    owner: tuple[int, int] | None = None
    """uid, gid that must own the folders root creates for a service of another user."""

    @property
    def system(self) -> bool:
        return self.scope == SYSTEM

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
            daemons = Path(os.environ.get(DAEMONS_ENV) or "/Library/LaunchDaemons")
            agents = self.home / "Library/LaunchAgents"
            return (daemons if self.system else agents) / f"{LABEL}.plist"
        folder = Path("/etc/systemd/system") if self.system else self.home / ".config/systemd/user"
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


def session_types(domain: str | None) -> list[str]:
    """Homebrew's every-session list, except in user/: Background alone there, so a later
    login at the screen does not load a second copy into gui/ (crc-org/crc#5349)."""
    return ["Background"] if domain is not None and domain.startswith("user/") else SESSION_TYPES


def launchd_plist(plan: InstallPlan, domain: str | None = None) -> dict[str, Any]:
    """The job for `domain` (None: gui/ or system, the domain its template is written for)."""
    plist: dict[str, Any] = {
        "Label": LABEL,
        "ProgramArguments": plan.program,
        "RunAtLoad": True,
        # Restarted unless it exits 0, which serve does when its port is held by this data
        # directory's own agent: a second copy launchd loaded gives way instead of looping.
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": THROTTLE_INTERVAL_S,
        "ExitTimeOut": STOP_TIMEOUT_S,
        "StandardOutPath": str(plan.stdout_log),
        "StandardErrorPath": str(plan.stderr_log),
        "EnvironmentVariables": plan.environment,
        "WorkingDirectory": str(plan.data_dir),
        # Benchmarks must not be throttled like a background daemon.
        "ProcessType": "Interactive",
        "LimitLoadToSessionType": session_types(domain),
    }
    if plan.system and plan.user:
        plist["UserName"] = plan.user
    return plist


def systemd_unit(plan: InstallPlan) -> str:
    environment = "\n".join(
        f"Environment={shlex.quote(f'{key}={value}')}" for key, value in plan.environment.items()
    )
    target = "multi-user.target" if plan.system else "default.target"
    account = f"User={plan.user}\n" if plan.system and plan.user else ""
    return f"""[Unit]
Description=mlx-fleet agent (MLX benchmarks and thermal policy)
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
{account}ExecStart={shlex.join(plan.program)}
{environment}
WorkingDirectory={plan.data_dir}
Restart=on-failure
RestartSec={THROTTLE_INTERVAL_S}
KillSignal=SIGTERM
TimeoutStopSec={STOP_TIMEOUT_S}

[Install]
WantedBy={target}
"""


def definition_text(plan: InstallPlan, domain: str | None = None) -> str:
    if plan.flavour == LAUNCHD:
        return plistlib.dumps(launchd_plist(plan, domain), sort_keys=False).decode()
    return systemd_unit(plan)


def systemctl(plan: InstallPlan, *args: str) -> list[str]:
    return ["systemctl", *([] if plan.system else ["--user"]), *args]


def systemd_commands(plan: InstallPlan) -> list[list[str]]:
    return [
        systemctl(plan, "daemon-reload"),
        systemctl(plan, "enable", "--now", UNIT_NAME),
        systemctl(plan, "restart", UNIT_NAME),
    ]


# --- parsing service managers' answers ---------------------------------------------------------

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


# --- reviewed templates in deploy/ ------------------------------------------------------------

TEMPLATE_PYTHON = "@PYTHON@"
TEMPLATE_DATA_DIR = "@DATA_DIR@"
TEMPLATE_HOME = "@HOME@"
TEMPLATE_USER = "@USER@"


def template_files() -> dict[str, str]:
    """deploy/'s templates: the exact definitions `agent install` writes, with placeholders
    for the interpreter, the data directory, the home folder and a system service's user."""
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
            user=TEMPLATE_USER if scope == SYSTEM else None,
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
