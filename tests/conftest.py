"""Fixtures shared by the whole suite: an isolated data directory and the console scripts; and
how the suite runs (in parallel, every process it starts tied to it, slow tests marked).

Every process a test starts dies with the run. On Linux each child the tests' thread starts
(subprocess.Popen, hence subprocess.run, in a test, a helper or the code under test) gets
PR_SET_PDEATHSIG = SIGKILL: when the pytest process (or its xdist worker) dies, even by SIGKILL,
the kernel kills its children at once, so no `agent serve`, sshd or CLI outlives a killed run.
The signal fires when the *thread* that started the child ends, so children started from other
threads are left as they are (such a thread may end long before its child should); agents
started with `agents.start` also get `--parent-pid` (any OS). A child's own children are its
business: an agent's jobs and ranks die with it by their own lifeline.

MLX ring ranks started by the suite wait for their peers without spinning a core
(tests/native/ring_wait.c, preloaded into every process the tests start), and those processes
keep their compiled modules (PYCACHE) where the environment would have them compile every time.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import zmq

if TYPE_CHECKING:
    from tests.fleet_support import AgentPool

# A suite started in the background of a non-interactive shell (`pytest &`) inherits SIGINT
# ignored, and an ignored signal stays ignored across exec: the agents and CLIs the Ctrl-C tests
# start would never see theirs. A handler, unlike SIG_IGN, is reset to the default at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>."""
TESTS_THREAD = threading.get_ident()
"""The thread that imports this conftest: the one pytest runs the tests in (pytest_sessionstart
checks), which lives as long as the run."""


def dies_with_this_process(then: Callable[[], object] | None = None) -> Callable[[], None]:
    """A preexec_fn: the child gets SIGKILL when this process's current thread ends (it was
    started by it), and ends at once if that already happened between fork and prctl."""
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
        if then is not None:
            then()

    return preexec


class TiedPopen(subprocess.Popen):
    """subprocess.Popen whose children, started by the tests' thread on Linux, die with it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if sys.platform.startswith("linux") and threading.get_ident() == TESTS_THREAD:
            kwargs["preexec_fn"] = dies_with_this_process(kwargs.get("preexec_fn"))
        super().__init__(*args, **kwargs)


subprocess.Popen = TiedPopen  # type: ignore[misc]  # subprocess.run and asyncio's too


PYCACHE = Path(tempfile.gettempdir()) / f"mlx-fleet-pycache-{os.getuid()}"
"""Where the processes the suite starts keep their compiled modules when this environment says
PYTHONDONTWRITEBYTECODE (this machine's does): the suite starts thousands of agents, CLIs,
jobs and ranks, and each compiled some two hundred of our modules from source at start, a
third of its import time. Outside the source tree, so the tree stays as the setting wants it."""

if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = str(PYCACHE)


RING_WAIT_SOURCE = Path(__file__).parent / "native" / "ring_wait.c"


def ring_wait_preload() -> str | None:
    """tests/native/ring_wait.c built (once per source, shared by runs) for LD_PRELOAD: MLX's
    ring ranks the tests start wait for their peers in ppoll instead of a busy loop, which on
    a 2-core machine took the cores the ranks they waited for needed (the file says how).
    None where no C compiler builds it, said by the run's first process (the xdist workers
    find it the same way): the suite is then slower, never wrong."""
    source = RING_WAIT_SOURCE.read_bytes()
    built = (
        Path(tempfile.gettempdir())
        / f"mlx-fleet-ring-wait-{hashlib.sha256(source).hexdigest()[:12]}.so"
    )
    if built.exists():
        return str(built)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or not sys.platform.startswith("linux"):
        if "PYTEST_XDIST_WORKER" not in os.environ:
            print("no C compiler for tests/native/ring_wait.c: MLX ring ranks spin while waiting")
        return None
    scratch = built.with_suffix(f".{os.getpid()}.tmp")
    made = subprocess.run(
        [compiler, "-O2", "-shared", "-fPIC", "-o", str(scratch), str(RING_WAIT_SOURCE), "-ldl"],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        if "PYTEST_XDIST_WORKER" not in os.environ:
            print(f"tests/native/ring_wait.c not built, ring ranks spin: {made.stderr.strip()}")
        return None
    os.replace(scratch, built)
    return str(built)


if "mlx-fleet-ring-wait-" not in os.environ.get("LD_PRELOAD", ""):  # the xdist workers inherit it
    preload = ring_wait_preload()
    if preload is not None:
        os.environ["LD_PRELOAD"] = " ".join(filter(None, [os.environ.get("LD_PRELOAD"), preload]))


def pytest_sessionstart(session: pytest.Session) -> None:
    assert threading.get_ident() == TESTS_THREAD, "tests run in another thread than conftest's"


# --- slow tests ----------------------------------------------------------------------------------

SLOW_S = 1.0
"""A test is marked `slow` (@pytest.mark.slow) when its setup, call and teardown took more than
this in a measured run of the whole suite (`pytest --durations=0`, 4 workers on a 2-core VM; a
parametrized test when any of its cases did). The rest is the inner loop: `pytest -m "not
slow"`."""
UNMARKED_MOST_S = 15.0
"""In the inner loop, an unmarked test whose call runs longer than this fails, telling to mark
it slow. Generous on purpose: every unmarked test measured under SLOW_S with 4 workers on 2
cores, so only a test that really belongs to the slow ones reaches it, not a quick one slowed
by a loaded machine. The guard watches the inner loop only (a run whose
-m leaves slow tests out): there it keeps the loop short, and a full run, which may be loaded
(CI, busy loops), never fails on time."""


def inner_loop(config: pytest.Config) -> bool:
    """Whether this run leaves the slow tests out (`-m "not slow"`, or an -m that says so)."""
    return "not slow" in (config.getoption("markexpr") or "")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow tests first, each group in its collected order: xdist hands tests out in this
    order, and a long test handed out last would be the whole run's tail."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker with --dist loadgroup: every test marked xdist_group carries its group
    in its node id, as the scheduler reads it; where it does not (pytest 9.2 with pytest-xdist
    3.8, pytest-dev/pytest-xdist#1386) the groups would silently not hold and the netns, plant
    and staging tests meant to run one at a time would run side by side, so the run stops."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if lost:
        said = (
            f"{len(lost)} tests lost their xdist_group (first: {lost[0]}): this pytest and "
            "pytest-xdist do not hold groups together (pytest-dev/pytest-xdist#1386); "
            "install the versions pyproject.toml's dev extra names"
        )
        print(said, file=sys.__stderr__)  # a worker's exception reaches the run as a crash
        raise pytest.UsageError(said)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    began = time.monotonic()
    result = yield
    took = time.monotonic() - began
    unmarked = item.get_closest_marker("slow") is None
    if took > UNMARKED_MOST_S and unmarked and inner_loop(item.config):
        pytest.fail(
            f"{item.nodeid} ran {took:.0f} s, over the inner loop's {UNMARKED_MOST_S:g} s: "
            "mark it @pytest.mark.slow (tests/conftest.py, SLOW_S), or make it quicker",
            pytrace=False,
        )
    return result


@pytest.fixture(autouse=True)
def fleet_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own MLX_FLEET_HOME, so no test reads or writes the user's data."""
    home = tmp_path / "fleet-home"
    monkeypatch.setenv("MLX_FLEET_HOME", str(home))
    return home


def console_script(name: str) -> str:
    """The installed console script next to this interpreter (the venv's), else on PATH."""
    candidate = Path(sys.executable).with_name(name)
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"console script {name!r} is not installed; run pip install -e .")
    return found


@pytest.fixture
def agent_cli() -> str:
    return console_script("agent")


@pytest.fixture
def coordinator_cli() -> str:
    return console_script("coordinator")


def subprocess_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def run_cli(
    program: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """One of our console scripts run to its end, output captured, 250 columns so Rich wraps
    nothing a test reads; `env` added to the test's environment."""
    return subprocess.run(
        [console_script(program), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(COLUMNS="250", **(env or {})),
    )


def refusal(program: str, *args: str) -> str:
    """`program ARGS` (one of our console scripts) refused as bad input: exit 2, nothing on
    stdout and one `error: ` line on stderr, which is returned."""
    result = run_cli(program, *args)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def piped(argv: list[str], **options: Any) -> subprocess.Popen[str]:
    """`argv` started with its output piped as text, in the test's environment: a command a
    test reads while it runs or signals before it ends (`options` more of Popen's)."""
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
        **options,
    )


def interrupt(process: subprocess.Popen[str], signum: int, timeout: float) -> tuple[str, str]:
    """Send `signum` to `process` and wait for its end: its stdout and stderr. It must exit as
    an interrupted command does, 128 + the signal's number (README, Exit codes)."""
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=timeout)
    assert process.returncode == 128 + signum, stderr
    return stdout, stderr


def documented_names(doc: str, header: str) -> set[str]:
    """The names in the first column of the table in docs/DOC whose header row starts with
    `header` (each name in backticks)."""
    lines = (Path(__file__).parents[1] / "docs" / doc).read_text(encoding="utf-8").splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(header))
    rows = itertools.takewhile(lambda line: line.startswith("|"), lines[start + 2 :])
    return {row.split("|")[1].strip().strip("`") for row in rows}


def alive(pid: int) -> bool:
    """Whether process `pid` still runs. A zombie still answers kill(0): it is gone all the
    same once its state (/proc/PID/stat) says Z."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


SERVICE_MANAGER_FAKE = Path(__file__).parent / "fakes" / "service_manager.py"
"""launchctl and systemctl, faked (tests/test_service*.py)."""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An empty folder to be a user's home directory (`agent install`'s LaunchAgents and
    systemd user units go under it)."""
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def fake_managers(tmp_path: Path) -> Path:
    """A PATH directory whose launchctl and systemctl are SERVICE_MANAGER_FAKE; the fake keeps
    its state beside it (`service-state.json` in its parent)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("launchctl", "systemctl"):
        (bin_dir / name).symlink_to(SERVICE_MANAGER_FAKE)
    return bin_dir


@pytest.fixture
def tool_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Fake powermetrics, macmon and sudo (tests/fixtures/fake_tool.py) first on PATH; returns
    the log of their starts."""
    fake_tool = Path(__file__).parent / "fixtures" / "fake_tool.py"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("powermetrics", "macmon", "sudo"):
        wrapper = bin_dir / tool
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{fake_tool}" {tool} "$@"\n')
        wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    log = tmp_path / "starts.log"
    monkeypatch.setenv("FAKE_TOOL_LOG", str(log))
    return log


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    """A ZeroMQ context for the test's sockets, destroyed after it."""
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[AgentPool]:
    """Start real `agent serve` processes with `agents.start(name)`; all are killed after."""
    from tests.fleet_support import AgentPool

    pool = AgentPool(tmp_path / "agents")
    yield pool
    pool.kill_all()
