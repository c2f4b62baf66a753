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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LABEL = "io.mlx-fleet.agent"
"""launchd Label, and the plist's file name (`io.mlx-fleet.agent.plist`)."""
UNIT_NAME = "mlx-fleet-agent.service"
LAUNCHD, SYSTEMD = "launchd", "systemd"
USER, SYSTEM = "user", "system"
THROTTLE_INTERVAL_S = 10
STOP_TIMEOUT_S = 30


class ServiceError(Exception):
    """A service operation that cannot go ahead; the message says why."""


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
    def stdout_log(self) -> Path:
        return self.data_dir / "logs" / "agent.out.log"

    @property
    def stderr_log(self) -> Path:
        return self.data_dir / "logs" / "agent.err.log"

    @property
    def definition_path(self) -> Path:
        if self.flavour == LAUNCHD:
            folder = (self.home / "Library/LaunchAgents" if self.scope == USER
                      else Path("/Library/LaunchDaemons"))
            return folder / f"{LABEL}.plist"
        folder = (self.home / ".config/systemd/user" if self.scope == USER
                  else Path("/etc/systemd/system"))
        return folder / UNIT_NAME


def default_platform_flavour() -> str:
    return LAUNCHD if sys.platform == "darwin" else SYSTEMD


def serve_program(bind: str | None, thermal_source: str | None) -> list[str]:
    """Absolute interpreter path plus `-m agent serve ...`: valid without any PATH."""
    program = [sys.executable, "-m", "agent", "serve"]
    if bind:
        program += ["--bind", bind]
    if thermal_source:
        program += ["--thermal-source", thermal_source]
    return program


def service_environment(data_dir: Path) -> dict[str, str]:
    """What `serve` needs: its data directory, unbuffered logs, and a PATH finding macmon."""
    path = os.pathsep.join(dict.fromkeys([
        str(Path(sys.executable).parent), "/opt/homebrew/bin", "/usr/local/bin",
        "/usr/bin", "/bin", "/usr/sbin", "/sbin",
    ]))
    return {"MLX_FLEET_HOME": str(data_dir), "PYTHONUNBUFFERED": "1", "PATH": path}


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
        f"Environment={shlex.quote(f'{key}={value}')}" for key, value in plan.environment.items())
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
        return [["launchctl", "bootout", f"{domain}/{LABEL}"],
                ["launchctl", "bootstrap", domain, str(plan.definition_path)]]
    return [systemctl(plan, "daemon-reload"), systemctl(plan, "enable", "--now", UNIT_NAME),
            systemctl(plan, "restart", UNIT_NAME)]


# --- parsing service managers' answers (pure) ------------------------------------------------

LAUNCHCTL_FIELDS = {"state": "state", "pid": "pid", "last exit code": "last_exit",
                    "path": "path", "program": "program"}


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


# --- the shell: files and service managers ---------------------------------------------------

def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ServiceError(f"{command[0]} not found: is this a {command[0]} system?") from None


def require_root_for_system(scope: str) -> None:
    if scope == SYSTEM and os.geteuid() != 0:
        raise ServiceError("--system installs a system-wide service and needs root: "
                           "run it with sudo, or use --user")


def install(plan: InstallPlan) -> list[str]:
    """Write the definition and (re)start the service; returns what was done, line by line."""
    require_root_for_system(plan.scope)
    plan.stdout_log.parent.mkdir(parents=True, exist_ok=True)
    path = plan.definition_path
    path.parent.mkdir(parents=True, exist_ok=True)
    done: list[str] = []
    if plan.flavour == LAUNCHD:
        domains = launchd_domains(plan)
        for domain in domains:  # replacing: never two copies of the job
            run(["launchctl", "bootout", f"{domain}/{LABEL}"])
        path.write_text(definition_text(plan), encoding="utf-8")
        done.append(f"wrote {path}")
        errors = []
        for domain in domains:
            result = run(["launchctl", "bootstrap", domain, str(path)])
            if result.returncode == 0:
                done.append(f"launchctl bootstrap {domain} {path}")
                return done
            errors.append(f"{domain}: {result.stderr.strip() or result.returncode}")
        raise ServiceError("launchctl bootstrap failed: " + "; ".join(errors))
    path.write_text(definition_text(plan), encoding="utf-8")
    done.append(f"wrote {path}")
    for command in install_commands(plan):
        result = run(command)
        if result.returncode != 0:
            raise ServiceError(f"{shlex.join(command)} failed: {result.stderr.strip()}")
        done.append(shlex.join(command))
    return done


def uninstall(plan: InstallPlan, purge: bool) -> list[str]:
    """Stop and remove the service; the data directory stays unless `purge`."""
    require_root_for_system(plan.scope)
    path = plan.definition_path
    done: list[str] = []
    if plan.flavour == LAUNCHD:
        for domain in launchd_domains(plan):
            if run(["launchctl", "bootout", f"{domain}/{LABEL}"]).returncode == 0:
                done.append(f"launchctl bootout {domain}/{LABEL}")
    else:
        if run(systemctl(plan, "disable", "--now", UNIT_NAME)).returncode == 0:
            done.append(shlex.join(systemctl(plan, "disable", "--now", UNIT_NAME)))
    if path.exists():
        path.unlink()
        done.append(f"removed {path}")
    if plan.flavour == SYSTEMD:
        run(systemctl(plan, "daemon-reload"))
    if purge and plan.data_dir.exists():
        shutil.rmtree(plan.data_dir)
        done.append(f"removed data directory {plan.data_dir}")
    return done


def status(plan: InstallPlan) -> dict[str, Any]:
    """Installed? running? pid, last exit, where the logs are."""
    report: dict[str, Any] = {
        "flavour": plan.flavour, "scope": plan.scope,
        "definition": str(plan.definition_path), "installed": plan.definition_path.exists(),
        "running": False, "pid": None, "last_exit": None,
    }
    if plan.flavour == LAUNCHD:
        report["logs"] = [str(plan.stdout_log), str(plan.stderr_log)]
        for domain in launchd_domains(plan):
            result = run(["launchctl", "print", f"{domain}/{LABEL}"])
            if result.returncode == 0:
                fields = parse_launchctl_print(result.stdout)
                report.update(domain=domain, running=fields.get("state") == "running",
                              pid=int(fields["pid"]) if "pid" in fields else None,
                              last_exit=fields.get("last_exit"))
                break
        return report
    journal = "journalctl" + (" --user" if plan.scope == USER else "") + f" -u {UNIT_NAME}"
    report["logs"] = [journal]
    result = run(systemctl(plan, "show", UNIT_NAME,
                           "-p", "LoadState,ActiveState,SubState,MainPID,ExecMainStatus"))
    if result.returncode == 0:
        fields = parse_systemctl_show(result.stdout)
        pid = int(fields.get("MainPID", "0") or 0)
        report.update(running=fields.get("ActiveState") == "active", pid=pid or None,
                      last_exit=fields.get("ExecMainStatus"), state=fields.get("SubState"))
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
        environment = {"MLX_FLEET_HOME": TEMPLATE_DATA_DIR, "PYTHONUNBUFFERED": "1",
                       "PATH": "@PATH@"}
        plan = InstallPlan(flavour=flavour, scope=scope,
                           program=[TEMPLATE_PYTHON, "-m", "agent", "serve"],
                           data_dir=data_dir, home=Path(TEMPLATE_HOME), uid=0,
                           environment=environment)
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
