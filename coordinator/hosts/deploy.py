"""`coordinator deploy`: roll agents out to a fleet over ssh, idempotently, host by host.

Per host: find a Python MLX can use (unless --remote-python names one), copy this package's
wheel, create (or reuse) a virtual environment, install the wheel, trust this coordinator's key,
install the agent service, and record the agent's key here. The
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
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from coordinator.hosts.hostfile import HostEntry
from coordinator.hosts.keys import add_host_key

DEFAULT_REMOTE_DIR = "~/.mlx-fleet"
SSH_TIMEOUT_S = 10
STEP_TIMEOUT_S = 900
MIN_REMOTE_PYTHON = "3.10"
"""pyproject's requires-python: what the remote virtual environment must run."""
MIN_MACOS = 14
"""MLX needs macOS 14 or newer and a native arm64 Python (mac-desk-check.md, MLX)."""
CONDA_BASES = (
    "$HOME/miniforge3",
    "$HOME/miniconda3",
    "$HOME/anaconda3",
    "/opt/homebrew/Caskroom/miniforge/base",
    "/opt/miniconda3",
)
"""Where conda's installers (Miniforge, Miniconda, Anaconda, Homebrew's miniforge cask) put
their base environment's Python."""
PYTHON_CANDIDATES = (
    *(f"/opt/homebrew/bin/python3.{minor}" for minor in (13, 12, 11, 10)),
    "/opt/homebrew/bin/python3",
    "/Library/Frameworks/Python.framework/Versions/3.*/bin/python3",
    "/usr/local/bin/python3",
    "/opt/local/bin/python3.1[0-9]",
    "$HOME/.pyenv/versions/3.*/bin/python3",
    "$HOME/.local/share/uv/python/cpython-3.*/bin/python3",
    *(f"{base}/bin/python3" for base in CONDA_BASES),
)
"""Where a Mac keeps a usable Python, best first (Homebrew's arm64 prefix, python.org's
framework, /usr/local, MacPorts' /opt/local, pyenv's and uv's installs, a conda base); none is
on the PATH of a non-interactive ssh session (/usr/bin:/bin:/usr/sbin:/sbin), whose `python3`
is Apple's 3.9 or the Command Line Tools stub. Each pattern is expanded by the host's /bin/sh
(`$HOME` its login's), and a pattern that matches nothing asks nothing."""
PYTHON_SOURCES = (
    *(["Homebrew"] * 5),
    "python.org",
    "/usr/local (Intel Homebrew or python.org)",
    "MacPorts",
    "pyenv",
    "uv",
    *(["conda"] * len(CONDA_BASES)),
    "PATH",
    "system (Apple)",
)
"""Who installs each candidate, by rank (PYTHON_CANDIDATES', then python3 on PATH, then
Apple's): what deploy names when it says which candidates it skipped and why."""
APPLE_PYTHON = "/usr/bin/python3"
"""On a Mac, a stub when the Command Line Tools are absent: running it pops their install
dialog on the screen of whoever is logged in, so it is tried last and only when they are
installed (a host without xcode-select is no Mac: its /usr/bin/python3 is a real one)."""
PYTHON_QUESTION = (
    'import platform, sys; print("%d.%d %s %s" % (sys.version_info[0], sys.version_info[1], '
    "platform.machine(), platform.system()))"
)
"""What each candidate is asked (`3.12 arm64 Darwin`); Python 2 answers too. Under Rosetta
`platform.machine()` is x86_64 (uname reports Intel to a translated process:
Homebrew/install#319)."""
NOT_RUN = "not run"
"""The probe's answer for Apple's stub without the Command Line Tools."""
INSTALL_PYTHON = "install one: `brew install python@3.12` or python.org's macOS installer"
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
    python: str | None = None
    """None: each host's own, found by `find_python`."""

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
    python: str | None = None
    """The Python that made the virtual environment (found, or --remote-python)."""
    python_skipped: list[dict[str, str]] | None = None
    """The Pythons the probe found and did not choose, each {path, source, why}; None when
    nothing was probed (--remote-python, or the host could not be asked)."""
    python_not_found: list[str] | None = None
    """The installers (PYTHON_SOURCES) it found no Python from; None as python_skipped."""

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
            "python": self.python,
            "python_skipped": self.python_skipped,
            "python_not_found": self.python_not_found,
        }


def venv_command(layout: RemoteLayout, minimum: str = MIN_REMOTE_PYTHON) -> str:
    """The remote shell command that makes sure the virtual environment is one `layout.python`
    made, at `minimum` or newer (see ENSURE_VENV)."""
    if layout.python is None:
        raise ValueError("no remote Python chosen yet")
    return (
        f"{shlex.quote(layout.python)} -c {shlex.quote(ENSURE_VENV)} "
        f"{layout.quoted('venv')} {shlex.quote(minimum)}"
    )


def probe_command() -> str:
    """One remote command that asks every candidate Python its version and machine: a line
    `RANK<TAB>PATH<TAB>ANSWER` each (see parse_probe). Run by /bin/sh whatever the login
    shell is (zsh fails on a glob that matches nothing); only existing files are run, and on a
    Mac Apple's stub only when `xcode-select -p` names a developer folder with a python3."""
    on_path, apple = len(PYTHON_CANDIDATES), len(PYTHON_CANDIDATES) + 1
    say = "printf '%s\\t%s\\t%s\\n'"
    lines = [
        f'ask() {{ [ -f "$2" ] && [ -x "$2" ] || return 0; '
        f'a=$("$2" -c {shlex.quote(PYTHON_QUESTION)} </dev/null 2>/dev/null) || a=failed; '
        f'{say} "$1" "$2" "${{a:-failed}}"; }}',
        *(
            f'for p in {pattern}; do ask {rank} "$p"; done'  # unquoted: the glob expands
            for rank, pattern in enumerate(PYTHON_CANDIDATES)
        ),
        f'p=$(command -v python3) && [ "$p" != {APPLE_PYTHON} ] && ask {on_path} "$p"',
        "if [ ! -e /usr/bin/xcode-select ] || { d=$(/usr/bin/xcode-select -p 2>/dev/null) "
        f'&& [ -x "$d/usr/bin/python3" ]; }}; then ask {apple} {APPLE_PYTHON}; '
        f"else {say} {apple} {APPLE_PYTHON} {shlex.quote(NOT_RUN)}; fi",
    ]
    return f"/bin/sh -c {shlex.quote(chr(10).join(lines))}"


@dataclass(frozen=True)
class FoundPython:
    """One candidate's answer to the probe."""

    rank: int
    """Its place in the search order (the python.org versions share one)."""
    path: str
    answer: str
    """`3.12 arm64 Darwin` (see PYTHON_QUESTION), `failed` (it did not run) or NOT_RUN."""

    @property
    def version(self) -> tuple[int, int] | None:
        match = re.fullmatch(r"(\d+)\.(\d+) \S+ \S+", self.answer)
        return (int(match[1]), int(match[2])) if match else None

    @property
    def machine(self) -> str | None:
        return self.answer.split(" ")[1] if self.version else None

    def usable(self, minimum: str = MIN_REMOTE_PYTHON) -> bool:
        """New enough and, on a Mac, native arm64 (never x86_64: under Rosetta or on an Intel
        Mac MLX cannot run); elsewhere the virtualenv step asks no more (ENSURE_VENV)."""
        need = tuple(int(part) for part in minimum.split("."))
        if self.version is None or self.version < need:
            return False
        return self.machine == "arm64" or not self.answer.endswith(" Darwin")

    @property
    def source(self) -> str:
        return PYTHON_SOURCES[self.rank] if 0 <= self.rank < len(PYTHON_SOURCES) else "unknown"

    def why_not(self, minimum: str = MIN_REMOTE_PYTHON) -> str:
        """Why this one was not chosen (skipped): it cannot run MLX, or one before it can."""
        if self.answer == NOT_RUN:
            return "not run: Apple's stub without the Command Line Tools opens their installer"
        if self.version is None:
            return "did not run"
        if not self.usable(minimum):
            if self.version < tuple(int(part) for part in minimum.split(".")):
                return f"Python {self.version[0]}.{self.version[1]}, older than {minimum}"
            return f"{self.machine} (Intel, or Rosetta): MLX needs a native arm64 Python"
        return "usable, but later in the search order"

    def describe(self) -> str:
        if self.answer == NOT_RUN:
            return f"{self.path} (not run: no Command Line Tools)"
        if self.version is None:
            return f"{self.path} (did not run)"
        return f"{self.path} ({self.version[0]}.{self.version[1]}, {self.machine})"


def parse_probe(stdout: str) -> list[FoundPython]:
    """The probe's lines in order, each path once (python3 on PATH may be one seen before)."""
    found: dict[str, FoundPython] = {}
    for line in stdout.splitlines():
        rank, _, rest = line.partition("\t")
        path, _, answer = rest.partition("\t")
        if rank.isdigit() and path and path not in found:
            found[path] = FoundPython(int(rank), path, answer.strip())
    return list(found.values())


def choose_python(found: list[FoundPython], minimum: str = MIN_REMOTE_PYTHON) -> FoundPython | None:
    """The first usable candidate in search order, the newest within a rank."""
    usable = [python for python in found if python.usable(minimum)]
    return min(usable, key=lambda p: (p.rank, [-part for part in p.version or ()]), default=None)


def skipped_pythons(
    found: list[FoundPython], chosen: FoundPython | None, minimum: str = MIN_REMOTE_PYTHON
) -> list[dict[str, str]]:
    """Every candidate found but not chosen, each {path, source, why}, in search order."""
    return [
        {"path": python.path, "source": python.source, "why": python.why_not(minimum)}
        for python in found
        if python != chosen
    ]


def sources_not_found(found: list[FoundPython]) -> list[str]:
    """The installers (PYTHON_SOURCES) none of whose places held a Python on the host."""
    seen = {python.source for python in found}
    return [source for source in dict.fromkeys(PYTHON_SOURCES) if source not in seen]


def skipped_text(skipped: list[dict[str, str]], absent: list[str]) -> str:
    """One line: what the probe skipped and why, and whom it found nothing from."""
    parts = [f"{row['path']} ({row['source']}: {row['why']})" for row in skipped]
    if absent:
        parts.append(f"none found from {', '.join(absent)}")
    return "; ".join(parts)


def no_python_message(found: list[FoundPython], minimum: str = MIN_REMOTE_PYTHON) -> str:
    """One line: what was found, and what to install (or to pass --remote-python)."""
    seen = "; ".join(python.describe() for python in found) or "none"
    return (
        f"no usable Python on this host (>= {minimum}, native arm64 on a Mac; found: {seen}): "
        f"{INSTALL_PYTHON}, or pass --remote-python"
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

    def login(self, entry: HostEntry) -> list[str]:
        return ["ssh", *self.ssh.options(), self.ssh.destination(entry.ssh_host)]

    def probe_step(self, entry: HostEntry) -> Step:
        """Asks the host which Pythons it has, in one round trip (see probe_command)."""
        return Step("find python", [*self.login(entry), probe_command()])

    def with_python(self, python: str) -> Rollout:
        return replace(self, layout=replace(self.layout, python=python))

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
        login = self.login(entry)
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
        login = self.login(entry)
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


def run_step(step: Step) -> subprocess.CompletedProcess[str] | str:
    """The step's finished process, or why it failed: its last line of output."""
    try:
        with open(step.stdin, "rb") if step.stdin else open(os.devnull, "rb") as stdin:
            completed = subprocess.run(
                step.argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S, stdin=stdin
            )
    except subprocess.TimeoutExpired:
        return f"timed out after {STEP_TIMEOUT_S} s"
    if completed.returncode != 0:
        output = (completed.stderr or completed.stdout).strip().splitlines()
        return output[-1] if output else f"exit code {completed.returncode}"
    return completed


@dataclass(frozen=True)
class PythonChoice:
    """What `find_python` made of one host: the Python to use, or why there is none."""

    probe: Step
    python: FoundPython | None = None
    error: str | None = None
    found: tuple[FoundPython, ...] | None = None
    """Every candidate the host answered for; None when it could not be asked."""


def find_python(entry: HostEntry, rollout: Rollout) -> PythonChoice:
    """Ask the host for its Pythons (one ssh round trip) and pick the first usable one."""
    probe = rollout.probe_step(entry)
    outcome = run_step(probe)
    if isinstance(outcome, str):
        return PythonChoice(probe, error=outcome)
    found = parse_probe(outcome.stdout)
    chosen = choose_python(found)
    error = None if chosen else no_python_message(found)
    return PythonChoice(probe, chosen, error, tuple(found))


def find_pythons(entries: list[HostEntry], rollout: Rollout) -> list[PythonChoice]:
    """`find_python` on every host in parallel, in the order given."""
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(entries)))) as pool:
        return list(pool.map(lambda entry: find_python(entry, rollout), entries))


def run_host(
    entry: HostEntry, steps: list[Step], on_step: Callable[[str, str], None] | None = None
) -> HostResult:
    """Run the steps in order; the first failure ends this host (the others go on)."""
    result = HostResult(entry.address)
    for step in steps:
        completed = run_step(step)
        if isinstance(completed, str):
            result.failed, result.error = step.name, completed
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


def roll_out_host(
    entry: HostEntry,
    wheel: Path,
    rollout: Rollout,
    on_step: Callable[[str, str], None] | None = None,
) -> HostResult:
    """One host's roll-out, first finding its Python when --remote-python was not given."""
    found: list[str] = []
    skipped, absent = None, None
    if rollout.layout.python is None:
        choice = find_python(entry, rollout)
        if choice.found is not None:
            skipped = skipped_pythons(list(choice.found), choice.python)
            absent = sources_not_found(list(choice.found))
        if choice.python is None:
            return HostResult(
                entry.address,
                failed=choice.probe.name,
                error=choice.error,
                python_skipped=skipped,
                python_not_found=absent,
            )
        rollout = rollout.with_python(choice.python.path)
        found.append(choice.probe.name)
        if on_step is not None:
            on_step(entry.address, f"{choice.probe.name}: {choice.python.describe()}")
    result = run_host(entry, rollout.steps(entry, wheel), on_step)
    result.done[:0] = found
    result.python = rollout.layout.python
    result.python_skipped, result.python_not_found = skipped, absent
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


NO_SOURCE_TREE = "this installation has no source tree to build a wheel from: pass --wheel FILE"


def wheel_name() -> str:
    """The file name of the wheel this installation builds (PEP 427), its real version."""
    return f"mlx_fleet-{metadata.version('mlx-fleet')}-py3-none-any.whl"


def wheel_command(tree: Path, out_dir: Path) -> list[str]:
    """Build the wheel of the project at `tree` into `out_dir`."""
    return [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out_dir), str(tree)]


def build_wheel(out_dir: Path) -> Path:
    """A wheel of this very package, built from its source tree, to ship to every host."""
    tree = source_tree()
    if tree is None:
        raise DeployError(NO_SOURCE_TREE)
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
        wheel_command(copy, out_dir),
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
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(entries)))) as pool:
            futures = [
                pool.submit(roll_out_host, entry, wheel, rollout, on_step) for entry in entries
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
