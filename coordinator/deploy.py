"""`coordinator deploy`: roll agents out to a fleet over ssh, idempotently, host by host.

Per host: copy this package's wheel, create (or reuse) a virtual environment, install the wheel,
trust this coordinator's key, install the agent service, and record the agent's key here. The
step list is pure data (so a dry run and the tests see exactly what runs); the shell runs it
with the system's ssh, every host in parallel, and stops a host at its first failure.

Every step runs as the login user: the service runs as that user too (a LaunchDaemon with
`UserName` where it is a system service), so trust and keys live in that user's data directory.
`agent install --auto` picks the system service itself on a Mac nobody is logged in to at the
screen (and says so), getting root through `sudo -n`; `--system` asks for it on every host.
"""

from __future__ import annotations

import json
import os
import re
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
from urllib.parse import urlparse
from urllib.request import url2pathname

from coordinator.hostfile import HostEntry
from coordinator.keys import add_host_key

DEFAULT_REMOTE_DIR = "~/.mlx-fleet"
SSH_TIMEOUT_S = 10
STEP_TIMEOUT_S = 900
MIN_REMOTE_PYTHON = "3.10"
"""pyproject's requires-python: what the remote virtual environment must run."""
MIN_MACOS = 14
"""MLX needs macOS 14 or newer and a native arm64 Python (mac-desk-check.md, MLX)."""
SERVICE_LINE = "service: "
"""How `agent install --auto` says which service it chose (reported per host)."""
ENSURE_VENV = """\
import os, shutil, subprocess, sys
venv, need = sys.argv[1], tuple(int(part) for part in sys.argv[2].split("."))
made_by = "%s %d.%d" % (sys.executable, sys.version_info[0], sys.version_info[1])
if sys.version_info[:2] < need:
    sys.exit("%s is Python %s: mlx-fleet needs Python >= %s; pass --remote-python a newer one "
             "(on macOS e.g. /opt/homebrew/bin/python3.12)"
             % (sys.executable, sys.version.split()[0], sys.argv[2]))
def ask(*command):
    try:
        return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              universal_newlines=True).stdout.strip()
    except OSError:
        return None
release = ask("sw_vers", "-productVersion")
if release is not None:  # a Mac: sysctl answers for this very process, Rosetta included
    if int(release.split(".")[0] or 0) < @MIN_MACOS@:
        sys.exit("macOS %s is too old for MLX (it needs macOS >= @MIN_MACOS@): update macOS on "
                 "this host" % release)
    if ask("sysctl", "-n", "hw.optional.arm64") != "1":
        sys.exit("an Intel Mac: MLX needs Apple Silicon (arm64); leave this host out")
    if ask("sysctl", "-n", "sysctl.proc_translated") == "1":
        sys.exit("%s runs under Rosetta (x86_64): MLX needs a native arm64 Python; pass "
                 "--remote-python an arm64 one (e.g. /opt/homebrew/bin/python3.12)"
                 % sys.executable)
marker = os.path.join(venv, "mlx-fleet-python")
check = "import sys; sys.exit(sys.version_info[:2] < %r)" % (need,)
try:
    with open(marker) as handle:
        usable = handle.read() == made_by and subprocess.call(
            [os.path.join(venv, "bin", "python"), "-c", check]) == 0
except OSError:
    usable = False
if not usable:
    shutil.rmtree(venv, ignore_errors=True)
    made = subprocess.run([sys.executable, "-m", "venv", venv], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True)
    if made.returncode:
        sys.exit("%s -m venv failed: %s" % (sys.executable, " ".join(made.stdout.split())))
    with open(marker, "w") as handle:
        handle.write(made_by)
    print("created %s with %s" % (venv, made_by))
""".replace("@MIN_MACOS@", str(MIN_MACOS))
"""The virtualenv step, run by the requested interpreter (Python 2 still reaches the version
check): the host must be able to run MLX (macOS >= 14, Apple Silicon, a native arm64 Python:
refused with one line naming the fix), and a venv another interpreter made, or one too old, is
made again, never kept forever."""


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

    def shell(self) -> str:
        """The step as one shell command line, its stdin redirection included."""
        line = shlex.join(self.argv)
        return f"{line} < {shlex.quote(str(self.stdin))}" if self.stdin else line


@dataclass
class HostResult:
    host: str
    done: list[str] = field(default_factory=list)
    failed: str | None = None
    error: str | None = None
    agent_key: str | None = None
    service: str | None = None
    """Which service `agent install` chose, and why."""

    @property
    def ok(self) -> bool:
        return self.failed is None

    def to_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "ok": self.ok,
            "done": self.done,
            "failed": self.failed,
            "error": self.error,
            "agent_key": self.agent_key,
            "service": self.service,
        }


def venv_command(layout: RemoteLayout, minimum: str = MIN_REMOTE_PYTHON) -> str:
    """The remote shell command that makes sure the virtual environment is one `layout.python`
    made, at `minimum` or newer (see ENSURE_VENV)."""
    return (
        f"{shlex.quote(layout.python)} -c {shlex.quote(ENSURE_VENV)} "
        f"{layout.quoted('venv')} {shlex.quote(minimum)}"
    )


@dataclass(frozen=True)
class Rollout:
    """What every host gets: this coordinator's key, where things go, how to log in, and the
    service to install (user or system, with which thermal source)."""

    coordinator_key: str
    coordinator_name: str
    layout: RemoteLayout = field(default_factory=RemoteLayout)
    ssh: SshSettings = field(default_factory=SshSettings)
    system: bool = False
    thermal_source: str = "auto"

    def install_args(self, entry: HostEntry) -> list[str]:
        """`--auto`: a LaunchDaemon as the login user where nobody is at the screen (reported),
        else a user service; `--system --sudo`: the system service on every host."""
        return [
            "install",
            *(["--system", "--sudo"] if self.system else ["--auto"]),
            "--bind",
            f"0.0.0.0:{entry.port}",
            "--thermal-source",
            self.thermal_source,
        ]

    def steps(self, entry: HostEntry, wheel: Path) -> list[Step]:
        """The roll-out of one host, in order; every step is safe to run again."""
        layout = self.layout
        login = ["ssh", *self.ssh.options(), self.ssh.destination(entry.ssh_host)]
        agent = layout.quoted("venv", "bin", "agent")
        pip = f"{layout.quoted('venv', 'bin', 'python')} -m pip install -q"
        shipped = layout.quoted("dist", wheel.name)

        def remote(name: str, command: str) -> Step:
            return Step(name, [*login, command])

        return [
            remote("prepare", f"mkdir -p {layout.quoted('dist')}"),
            # Streamed through the remote shell rather than scp: `~` means the same as in every
            # other step, and hosts that disable sftp still work.
            Step("copy wheel", [*login, f"cat > {shipped}"], wheel),
            remote("virtualenv", venv_command(layout)),
            # Reinstalled even at the same version (a rebuilt wheel), then its dependencies.
            remote(
                "install package", f"{pip} --force-reinstall --no-deps {shipped} && {pip} {shipped}"
            ),
            remote(
                "trust coordinator",
                f"{agent} keys trust {shlex.quote(self.coordinator_key)} "
                f"--name {shlex.quote(self.coordinator_name)}",
            ),
            remote("install service", f"{agent} {shlex.join(self.install_args(entry))}"),
            remote("read agent key", f"{agent} keys show"),
        ]

    def peer_steps(self, entry: HostEntry, peers: list[tuple[str, str]]) -> list[Step]:
        """After every host's key is known: this host's agent trusts every other agent's key
        as the peer serving at its address, so the ranks of a distributed job on both can
        tell each other's agents of pauses and stops (docs/monitoring.md)."""
        login = ["ssh", *self.ssh.options(), self.ssh.destination(entry.ssh_host)]
        agent = self.layout.quoted("venv", "bin", "agent")
        commands = [
            f"{agent} keys trust {shlex.quote(key)} --name {shlex.quote(peer_name(address))} "
            f"--peer {shlex.quote(address)}"
            for address, key in peers
            if address != entry.address
        ]
        return [Step("trust peers", [*login, " && ".join(commands)])] if commands else []


def peer_name(address: str) -> str:
    """A trust-store name for the agent at `address` (HOST:PORT): `peer-mac2-6000`."""
    return ("peer-" + re.sub(r"[^A-Za-z0-9._-]+", "-", address))[:64]


def run_host(
    entry: HostEntry, steps: list[Step], on_step: Callable[[str, str], None] | None = None
) -> HostResult:
    """Run the steps in order; the first failure ends this host (the others go on)."""
    result = HostResult(entry.address)
    for step in steps:
        try:
            with open(step.stdin, "rb") if step.stdin else open(os.devnull, "rb") as stdin:
                completed = subprocess.run(
                    step.argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, stdin=stdin
                )
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
        said = (completed.stderr + completed.stdout).splitlines()
        chosen = [line[len(SERVICE_LINE) :] for line in said if line.startswith(SERVICE_LINE)]
        result.service = chosen[-1] if chosen else result.service
    return result


def direct_url_path(direct_url: str) -> Path | None:
    """The local folder a direct_url.json names (PEP 610), its URL decoded: a checkout in
    `my projects/` is `file:///.../my%20projects`."""
    url = urlparse(json.loads(direct_url).get("url", ""))
    return Path(url2pathname(url.path)) if url.scheme == "file" else None


def source_tree() -> Path | None:
    """This installation's project folder when it was installed from a checkout (editable)."""
    try:
        direct = metadata.distribution("mlx-fleet").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    path = direct_url_path(direct) if direct else None
    return path if path and (path / "pyproject.toml").is_file() else None


def build_wheel(out_dir: Path) -> Path:
    """A wheel of this very package, built from its source tree, to ship to every host."""
    tree = source_tree()
    if tree is None:
        raise DeployError(
            "this installation has no source tree to build a wheel from: pass --wheel FILE"
        )
    # Built from a clean copy: an in-tree build/ folder could ship stale modules.
    copy = out_dir / "source"
    shutil.copytree(
        tree,
        copy,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
        ),
    )
    completed = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out_dir), str(copy)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    wheels = sorted(out_dir.glob("mlx_fleet-*.whl"))
    if completed.returncode != 0 or not wheels:
        raise DeployError(f"building the wheel failed: {completed.stderr.strip()[-300:]}")
    return wheels[-1]


def deploy(
    entries: list[HostEntry],
    wheel: Path | None,
    rollout: Rollout,
    on_step: Callable[[str, str], None] | None = None,
) -> list[HostResult]:
    """Roll out to every host in parallel; results in the order the hosts were given."""
    with tempfile.TemporaryDirectory(prefix="mlx-fleet-wheel-") as scratch:
        if wheel is None:
            wheel = build_wheel(Path(scratch))
        elif not wheel.is_file():
            raise DeployError(f"wheel {wheel} does not exist")
        plans = [rollout.steps(entry, wheel) for entry in entries]
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(entries)))) as pool:
            futures = [
                pool.submit(run_host, entry, steps, on_step)
                for entry, steps in zip(entries, plans, strict=True)
            ]
            results = [future.result() for future in futures]
    for result in results:  # one writer for the coordinator's key file
        if result.ok and result.agent_key:
            try:
                add_host_key(result.host, result.agent_key)
            except ValueError as exc:
                result.failed, result.error = "record agent key", str(exc)
            else:
                result.done.append("record agent key")
    trust_peers(entries, results, rollout, on_step)
    return results


def trust_peers(
    entries: list[HostEntry],
    results: list[HostResult],
    rollout: Rollout,
    on_step: Callable[[str, str], None] | None,
) -> None:
    """Every host that made it trusts every other one's agent as a peer (a host's failure here
    is its own: the others go on)."""
    peers = [(r.host, r.agent_key) for r in results if r.ok and r.agent_key]
    todo = [
        (entry, result, steps)
        for entry, result in zip(entries, results, strict=True)
        if result.ok and (steps := rollout.peer_steps(entry, peers))
    ]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(todo)))) as pool:
        done = list(pool.map(lambda job: run_host(job[0], job[2], on_step), todo))
    for (_, result, _), outcome in zip(todo, done, strict=True):
        result.done += outcome.done
        result.failed, result.error = outcome.failed, outcome.error
