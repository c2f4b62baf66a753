"""`coordinator deploy`: roll agents out to a fleet over ssh, idempotently, host by host.

Per host: copy this package's wheel, create (or reuse) a virtual environment, install the wheel,
trust this coordinator's key, install the agent service, and record the agent's key here. The
step list is pure data (so a dry run and the tests see exactly what runs); the shell runs it
with the system's ssh, every host in parallel, and stops a host at its first failure.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from coordinator.hostfile import HostEntry
from coordinator.keys import add_host_key

DEFAULT_REMOTE_DIR = "~/.mlx-fleet"
SSH_TIMEOUT_S = 10
STEP_TIMEOUT_S = 900


class DeployError(Exception):
    """The roll-out cannot start (no wheel to ship, say); the message says why."""


@dataclass(frozen=True)
class SshSettings:
    user: str | None = None
    config: Path | None = None
    identity: Path | None = None

    def options(self) -> list[str]:
        """Options shared by ssh and scp: never prompt, fail fast on a dead host."""
        opts = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_TIMEOUT_S}"]
        if self.config:
            opts += ["-F", str(self.config)]
        if self.identity:
            opts += ["-i", str(self.identity)]
        return opts

    def destination(self, host: str) -> str:
        return f"{self.user}@{host}" if self.user else host


@dataclass(frozen=True)
class RemoteLayout:
    """Where things live on a host. The directory may start with `~` (the remote shell's)."""

    directory: str = DEFAULT_REMOTE_DIR
    python: str = "python3"

    def path(self, *parts: str) -> str:
        return "/".join([self.directory.rstrip("/"), *parts])

    def quoted(self, *parts: str) -> str:
        """A shell word that keeps a leading `~/` expandable and quotes the rest."""
        full = self.path(*parts)
        if full.startswith("~/"):
            return "~/" + shlex.quote(full[2:])
        return shlex.quote(full)


@dataclass(frozen=True)
class Step:
    name: str
    argv: list[str]
    """The local ssh command that performs the step."""
    stdin: Path | None = None
    """A local file fed to the command (the wheel, streamed through ssh)."""


@dataclass
class HostResult:
    host: str
    done: list[str] = field(default_factory=list)
    failed: str | None = None
    error: str | None = None
    agent_key: str | None = None

    @property
    def ok(self) -> bool:
        return self.failed is None

    def to_dict(self) -> dict[str, object]:
        return {"host": self.host, "ok": self.ok, "done": self.done, "failed": self.failed,
                "error": self.error, "agent_key": self.agent_key}


def agent_install_args(scope: str, bind: str | None, thermal_source: str | None) -> list[str]:
    args = ["install", f"--{scope}"]
    if bind:
        args += ["--bind", bind]
    if thermal_source:
        args += ["--thermal-source", thermal_source]
    return args


def host_steps(entry: HostEntry, wheel: Path, coordinator_key: str, coordinator_name: str,
               layout: RemoteLayout, ssh: SshSettings, install_args: list[str]) -> list[Step]:
    """The roll-out of one host, in order; every step is safe to run again."""
    destination = ssh.destination(entry.host)
    agent = layout.quoted("venv", "bin", "agent")
    pip = f"{layout.quoted('venv', 'bin', 'python')} -m pip install -q"
    shipped = layout.quoted("dist", wheel.name)

    def remote(name: str, command: str) -> Step:
        return Step(name, ["ssh", *ssh.options(), destination, command])

    return [
        remote("prepare", f"mkdir -p {layout.quoted('dist')}"),
        # Streamed through the remote shell rather than scp: `~` means the same as in every
        # other step, and hosts that disable sftp still work.
        Step("copy wheel", ["ssh", *ssh.options(), destination, f"cat > {shipped}"], wheel),
        remote("virtualenv", f"test -x {layout.quoted('venv', 'bin', 'python')} || "
                             f"{shlex.quote(layout.python)} -m venv {layout.quoted('venv')}"),
        # Reinstalled even at the same version (a rebuilt wheel), then its dependencies.
        remote("install package", f"{pip} --force-reinstall --no-deps {shipped} && "
                                  f"{pip} {shipped}"),
        remote("trust coordinator",
               f"{agent} keys trust {shlex.quote(coordinator_key)} "
               f"--name {shlex.quote(coordinator_name)}"),
        remote("install service", f"{agent} {shlex.join(install_args)}"),
        remote("read agent key", f"{agent} keys show"),
    ]


def run_host(entry: HostEntry, steps: list[Step],
             on_step: Callable[[str, str], None] | None = None) -> HostResult:
    """Run the steps in order; the first failure ends this host (the others go on)."""
    result = HostResult(entry.address)
    for step in steps:
        try:
            with (open(step.stdin, "rb") if step.stdin else open(os.devnull, "rb")) as stdin:
                completed = subprocess.run(step.argv, capture_output=True, text=True,
                                           timeout=STEP_TIMEOUT_S, stdin=stdin)
        except subprocess.TimeoutExpired:
            result.failed, result.error = step.name, f"timed out after {STEP_TIMEOUT_S} s"
            return result
        if completed.returncode != 0:
            output = (completed.stderr or completed.stdout).strip().splitlines()
            result.failed = step.name
            result.error = output[-1] if output else f"exit code {completed.returncode}"
            return result
        result.done.append(step.name)
        if on_step is not None:
            on_step(entry.address, step.name)
        if step.name == "read agent key":
            result.agent_key = completed.stdout.strip()
    return result


def source_tree() -> Path | None:
    """This installation's project folder when it was installed from a checkout (editable)."""
    try:
        direct = metadata.distribution("mlx-fleet").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not direct:
        return None
    url = json.loads(direct).get("url", "")
    path = Path(url.removeprefix("file://"))
    return path if (path / "pyproject.toml").is_file() else None


def build_wheel(out_dir: Path) -> Path:
    """A wheel of this very package, built from its source tree, to ship to every host."""
    tree = source_tree()
    if tree is None:
        raise DeployError("this installation has no source tree to build a wheel from: "
                          "pass --wheel FILE")
    # Built from a clean copy: an in-tree build/ folder could ship stale modules.
    copy = out_dir / "source"
    shutil.copytree(tree, copy, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"))
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out_dir), str(copy)],
        capture_output=True, text=True, timeout=600)
    wheels = sorted(out_dir.glob("mlx_fleet-*.whl"))
    if completed.returncode != 0 or not wheels:
        raise DeployError(f"building the wheel failed: {completed.stderr.strip()[-300:]}")
    return wheels[-1]


def deploy(entries: list[HostEntry], wheel: Path | None, coordinator_key: str,
           coordinator_name: str, layout: RemoteLayout, ssh: SshSettings,
           install_args: Callable[[HostEntry], list[str]],
           on_step: Callable[[str, str], None] | None = None) -> list[HostResult]:
    """Roll out to every host in parallel; results in the order the hosts were given."""
    with tempfile.TemporaryDirectory(prefix="mlx-fleet-wheel-") as scratch:
        if wheel is None:
            wheel = build_wheel(Path(scratch))
        elif not wheel.is_file():
            raise DeployError(f"wheel {wheel} does not exist")
        plans = [host_steps(entry, wheel, coordinator_key, coordinator_name, layout, ssh,
                            install_args(entry)) for entry in entries]
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(entries)))) as pool:
            futures = [pool.submit(run_host, entry, steps, on_step)
                       for entry, steps in zip(entries, plans, strict=True)]
            results = [future.result() for future in futures]
    for result in results:  # one writer for the coordinator's key file
        if result.ok and result.agent_key:
            try:
                add_host_key(result.host, result.agent_key)
            except ValueError as exc:
                result.failed, result.error = "record agent key", str(exc)
            else:
                result.done.append("record agent key")
    return results
