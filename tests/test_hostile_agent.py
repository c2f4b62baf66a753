"""Issue 24's acceptance tests: the real `coordinator` CLI against a hostile fake agent written
from docs/protocol.md alone (tests/fakes/hostile_agent.py, whose docstring says where each
misbehaviour comes from). An agent is a peer, not a part of the coordinator: whatever it sends,
the coordinator must not crash (no traceback), must not pass terminal escapes, C1 controls,
bidi or zero-width characters, Rich markup or forged rows on to the user's terminal, must bound
what it prints, must name a protocol error with its host and field, must end its run, and must
not let one bad host spoil a good one's results.

Each test is one class of misbehaviour against one command; every problem found is listed in the
failure message (escaped with repr), so whoever fixes the coordinator sees every symptom at once.
Commands run as subprocesses through pipes, and where a terminal matters also under a pty
(raw bytes, as a terminal would receive them). Fakes and stored runs are shared per module so
the file stays quick.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import struct
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import console_script
from tests.fakes.hostile_agent import (
    BAD_INDEX_LATENCIES,
    BAD_INDEXES,
    HUGE,
    MAX_ENVELOPE,
    HostileAgent,
    curve_keypair,
    envelope,
)

pytestmark = pytest.mark.timeout(180)

BENCH = ["--config-small", "-p", "16", "-n", "4", "-r", "1", "-w", "0", "--no-cool-start"]
"""Two cells (pp16, tg4): instant on a fake, about a second on a real agent (whose simulated
°C a loaded machine heats: no cool-start wait)."""
LINKS = ["--insecure", "--connect-timeout", "3"]
BENCH_LINKS = [*LINKS, "--host-timeout", "10"]
RUN_BOUND_S = 60.0
"""A command that has not ended by then did not end: every timeout it has is far shorter."""
MAX_OUTPUT = 200_000
"""The 4 MB string must never be printed whole; a report of a few hosts is a few KB."""
BENIGN_CELLS = {"pp16", "tg4"}

BIDI_OR_ZERO_WIDTH = re.compile(
    "[\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
)
C1 = re.compile("[\x80-\x9f\udc80-\udc9f]")
"""C1 controls, decoded from UTF-8 (U+0080-U+009F) or raw bytes left undecoded."""
OWN_TTY_CODES = re.compile(rb"\x1b\[[0-9;?]*[mKABCDGhl]")
"""What the coordinator itself may send a terminal: SGR colours, cursor moves, line erase,
cursor show/hide. Anything else (OSC 52/0/8, CSI 6n, CSI 2J...) came from an agent."""
FORGED_ROW = re.compile(r"^\s*FAKE ROW")
MARKUP_SHOWN = re.compile(r"[^\s│┃|](?<!\[reverse\])MARKUP(?!\[/rev)")
"""The payload's `[reverse]MARKUP[/reverse]` parsed as Rich markup: `MARKUP` left bare after
the payload's text before it (a wrap that breaks a cell right before it leaves a border), its
closing tag gone too (a wrap inside `[reverse]` leaves `e]MARKUP[/reverse]`: not parsed)."""
"""The agent's newline made a line of its own (a table wraps a cell inside its borders)."""
NO_ANSWER = re.compile(
    r"did not answer|not answering|no reply|no answer|timed? ?out|unreachable", re.I
)
INVALID = re.compile(
    r"invalid|malformed|unexpected|wrong type|not msgpack|cannot decode|bad reply|"
    r"answered with .* where .* was due",
    re.I,
)


# --- running the CLI ------------------------------------------------------------------------


@dataclass
class Run:
    """One finished (or killed) coordinator command and everything it wrote."""

    args: list[str]
    returncode: int | None
    stdout: bytes
    stderr: bytes
    tty: bool
    elapsed: float
    timed_out: bool
    logs: dict[str, bytes] = field(default_factory=dict)

    @property
    def command(self) -> str:
        return "coordinator " + " ".join(self.args)

    @property
    def text(self) -> str:
        """stdout and stderr together, decoded (raw bytes kept as surrogates)."""
        return (self.stdout + b"\n" + self.stderr).decode("utf-8", "surrogateescape")

    def lines(self) -> list[str]:
        return self.text.replace("\r", "").split("\n")


def environment(home: Path, tty: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR", "TERM")}
    env["MLX_FLEET_HOME"] = str(home)
    if tty:
        env["TERM"] = "xterm-256color"
        env.pop("COLUMNS", None)
        env.pop("LINES", None)
    else:
        env["COLUMNS"] = "200"
    return env


def coordinator(*args: str, home: Path, tty: bool = False, timeout: float = RUN_BOUND_S) -> Run:
    """Run `coordinator ARGS` with MLX_FLEET_HOME=home, through pipes or under a pty (200x50);
    killed (its whole session) when it outlives `timeout`."""
    command = [console_script("coordinator"), *args]
    began = time.monotonic()
    if tty:
        run = _under_pty(command, home, timeout)
    else:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=environment(home, tty=False),
            start_new_session=True,
        )
        timed_out = False
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
        run = Run(list(args), process.returncode, out, err, False, 0.0, timed_out)
    run.elapsed = time.monotonic() - began
    run.logs = {
        str(path.relative_to(home)): path.read_bytes()
        for path in home.rglob("*.log*")
        if path.is_file()
    }
    return run


def _under_pty(command: list[str], home: Path, timeout: float) -> Run:
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    process = subprocess.Popen(
        command,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=environment(home, tty=True),
        start_new_session=True,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while True:
            if time.monotonic() > deadline:
                timed_out = True
                os.killpg(process.pid, signal.SIGKILL)
                break
            if select.select([master], [], [], 0.2)[0]:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:  # EIO: every writer of the pty has closed it
                    break
                if not data:
                    break
                chunks.append(data)
    finally:
        os.close(master)
    process.wait(timeout=30)
    return Run(command[1:], process.returncode, b"".join(chunks), b"", True, 0.0, timed_out)


# --- what no command may print --------------------------------------------------------------


def snippet(text: str, at: int, width: int = 40) -> str:
    return repr(text[max(0, at - width) : at + width])


def hostile_output(run: Run) -> list[str]:
    """Every way the command let the agent through to the terminal, each with the evidence."""
    problems: list[str] = []
    data = run.stdout + run.stderr
    text = run.text
    if run.timed_out:
        problems.append(f"did not end within {RUN_BOUND_S:.0f} s")
    elif run.returncode not in (0, 1):
        problems.append(f"exit code {run.returncode} (0 or 1 expected)")
    if b"Traceback" in data:
        at = text.find("Traceback")
        problems.append(f"a traceback: {snippet(text, at + 200, 240)}")
    if len(data) > MAX_OUTPUT:
        problems.append(f"{len(data)} bytes of output (at most {MAX_OUTPUT}): {snippet(text, 0)}")
    problems += escapes(data, text, run.tty, "output")
    for name, log in run.logs.items():
        log_text = log.decode("utf-8", "surrogateescape")
        problems += [f"{name}: {problem}" for problem in escapes(log, log_text, False, "log")]
    return problems


def escapes(data: bytes, text: str, tty: bool, where: str) -> list[str]:
    problems = []
    foreign = OWN_TTY_CODES.sub(b"", data) if tty else data
    if b"\x1b" in foreign:
        at = foreign.index(b"\x1b")
        kind = "an OSC 8 link" if foreign[at : at + 4] == b"\x1b]8;" else "ESC"
        problems.append(f"{kind} in the {where}: {foreign[max(0, at - 30) : at + 30]!r}")
    if match := C1.search(text):
        problems.append(f"a C1 control in the {where}: {snippet(text, match.start())}")
    if match := BIDI_OR_ZERO_WIDTH.search(text):
        problems.append(
            f"a bidi/zero-width character in the {where}: {snippet(text, match.start())}"
        )
    if match := MARKUP_SHOWN.search(text):
        problems.append(f"Rich markup rendered in the {where}: {snippet(text, match.start())}")
    for line in text.replace("\r", "").split("\n"):
        if FORGED_ROW.match(line):
            problems.append(f"a forged row in the {where}: {line[:80]!r}")
            break
    return problems


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, which no JSON parser but Python's accepts."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def check(run: Run, problems: list[str]) -> None:
    assert not problems, f"{run.command} ({run.elapsed:.1f} s):\n" + "\n".join(
        f"  - {problem}" for problem in problems
    )


def lines_naming(run: Run, *needles: str) -> list[str]:
    return [line for line in run.lines() if all(needle in line for needle in needles)]


def table_rows(run: Run, *needles: str) -> list[str]:
    """The report table's rows (not the error lines below it) that hold every needle."""
    return [line for line in lines_naming(run, *needles) if line.startswith("│")]


# --- fakes and stored runs, shared by the module --------------------------------------------


@pytest.fixture(scope="module")
def fake() -> Iterator[Callable[[str], HostileAgent]]:
    """fake(mode): one running fake agent per mode for the whole module."""
    running: dict[str, HostileAgent] = {}

    def get(mode: str) -> HostileAgent:
        if mode not in running:
            running[mode] = HostileAgent(mode, name="benign" if mode == "benign" else "mac3")
            running[mode].start()
        return running[mode]

    yield get
    for agent in running.values():
        agent.stop()


@pytest.fixture(scope="module")
def real_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real `agent serve --insecure --thermal-source sim`: the benign host of the main run."""
    from tests.fleet_support import AgentPool

    pool = AgentPool(tmp_path_factory.mktemp("real-agent"))
    try:
        yield pool.start("benign", insecure=True, thermal="sim").address
    finally:
        pool.kill_all()


@dataclass
class Stored:
    """A benchmark run against a hostile host and a benign one, and where it is stored."""

    home: Path
    run: Run
    hostile: str
    benign: str
    run_id: str | None
    asked: list[str] = field(default_factory=list)
    """What the coordinator asked the hostile fake during the run."""

    def unasked(self, expect: str) -> list[str]:
        if expect in self.asked:
            return []
        return [f"never asked {expect} (asked {self.asked}): the payload was never read"]

    def show(self, fmt: str, tty: bool = False) -> Run:
        assert self.run_id, f"no run stored by {self.run.command}:\n{self.run.text[-2000:]}"
        return coordinator("show", self.run_id, "-o", fmt, home=self.home, tty=tty)

    def cells(self) -> list[dict[str, Any]]:
        """`show -o json`'s cells (a lenient parse: strictness is its own test)."""
        shown = self.show("json")
        assert shown.returncode == 0, shown.text[-2000:]
        return json.loads(shown.stdout)["cells"]


def benchmark(home: Path, hostile: HostileAgent, benign: str, tty: bool = False) -> Stored:
    since = len(hostile.requests)
    hosts = f"{hostile.address},{benign}"
    run = coordinator("benchmark", "--hosts", hosts, *BENCH_LINKS, *BENCH, home=home, tty=tty)
    asked = hostile.requests[since:]
    runs = coordinator("runs", "-o", "json", home=home)
    try:
        run_id = json.loads(runs.stdout)[0]["id"]
    except (ValueError, LookupError):
        run_id = None
    return Stored(home, run, hostile.address, benign, run_id, asked)


@pytest.fixture(scope="module")
def bench_of(
    fake: Callable[[str], HostileAgent],
    real_agent: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], Stored]:
    """bench_of(mode): one stored benchmark of the mode's fake beside a benign host, per
    module; `strings` runs beside a real agent, the others beside a benign fake (faster)."""
    done: dict[str, Stored] = {}

    def get(mode: str) -> Stored:
        if mode not in done:
            benign = real_agent if mode == "strings" else fake("benign").address
            home = tmp_path_factory.mktemp(f"bench-{mode}")
            done[mode] = benchmark(home, fake(mode), benign)
        return done[mode]

    return get


@dataclass
class Monitored:
    """A home where `monitor --once` recorded a fake, that run, and what it asked the fake."""

    home: Path
    run: Run
    asked: list[str]

    def unasked(self, expect: str) -> list[str]:
        if expect in self.asked:
            return []
        return [f"never asked {expect} (asked {self.asked}): the payload was never read"]


@pytest.fixture(scope="module")
def monitored(
    fake: Callable[[str], HostileAgent], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Monitored]:
    """monitored(mode): `monitor --once` against the mode's fake, once per module."""
    done: dict[str, Monitored] = {}

    def get(mode: str) -> Monitored:
        if mode not in done:
            home = tmp_path_factory.mktemp(f"monitor-{mode}")
            agent = fake(mode)
            wait_for_samples(agent, 4)
            since = len(agent.requests)
            run = coordinator("monitor", "--once", "--hosts", agent.address, *LINKS, home=home)
            done[mode] = Monitored(home, run, agent.requests[since:])
        return done[mode]

    return get


def wait_for_samples(agent: HostileAgent, count: int, timeout: float = 30) -> None:
    """Until the fake holds `count` samples: a history to backfill, whatever monitor does."""
    deadline = time.monotonic() + timeout
    while len(agent.samples) < count:
        assert time.monotonic() < deadline, f"the {agent.mode} fake took no samples"
        time.sleep(0.05)


def benign_cells_complete(stored: Stored) -> list[str]:
    """The benign host's two cells, measured, in the stored run and in the printed table."""
    problems = []
    try:
        cells = stored.cells()
    except AssertionError as exc:
        return [f"no stored run to check the benign host in: {str(exc)[:300]!r}"]
    tests = {
        cell.get("test")
        for cell in cells
        if cell.get("host") == stored.benign and cell.get("status") == "ok"
    }
    if tests != BENIGN_CELLS:
        problems.append(f"the benign host's ok cells in show -o json are {sorted(tests)}")
    rows = [
        line
        for line in stored.run.lines()
        if stored.benign in line
        and any(re.search(rf"\b{test}\b", line) for test in BENIGN_CELLS)
        and not re.search(r"not run|failed", line)
    ]
    if len(rows) < len(BENIGN_CELLS):
        problems.append(f"the benign host has {len(rows)} measured rows in the table")
    return problems


# --- 1. strings: terminal payloads in every string field ------------------------------------


def against(
    agent: HostileAgent, expect: str, *args: str, home: Path, tty: bool = False
) -> tuple[Run, list[str]]:
    """Run a command against `agent`; its problems, and one more when the command never sent
    the request (`expect`) whose reply carries the payload: then it proved nothing."""
    since = len(agent.requests)
    run = coordinator(*args, home=home, tty=tty)
    asked = agent.requests[since:]
    problems = hostile_output(run)
    if expect not in asked:
        problems.append(f"never asked {expect} (asked {asked}): the payload was never read")
    return run, problems


def not_strict_json(run: Run, what: str) -> list[str]:
    try:
        strict_json(run.stdout)
    except ValueError as exc:
        return [f"{what} is not strict JSON: {exc}"]
    return []


@pytest.mark.parametrize(("fmt", "tty"), [("table", False), ("table", True), ("json", False)])
def test_strings_status(
    fake: Callable[[str], HostileAgent], fleet_home: Path, fmt: str, tty: bool
) -> None:
    """hello.ok and info.ok strings: version, hostname, machine, thermal, storage errors."""
    agent = fake("strings")
    run, problems = against(
        agent,
        "info",
        "status",
        "--hosts",
        agent.address,
        *LINKS,
        "-o",
        fmt,
        home=fleet_home,
        tty=tty,
    )
    check(run, problems)


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "pty"])
@pytest.mark.slow
def test_strings_benchmark(
    bench_of: Callable[[str], Stored],
    fake: Callable[[str], HostileAgent],
    real_agent: str,
    fleet_home: Path,
    tty: bool,
) -> None:
    """Cell names, tests, models, errors and the machine's strings, printed as results come."""
    stored = (
        bench_of("strings")
        if not tty
        else benchmark(fleet_home, fake("strings"), real_agent, tty=True)
    )
    check(stored.run, hostile_output(stored.run) + stored.unasked("bench.start"))


def test_strings_benchmark_keeps_the_benign_host(bench_of: Callable[[str], Stored]) -> None:
    """The benign host is a real `agent serve`: its two cells are measured and kept."""
    stored = bench_of("strings")
    check(stored.run, benign_cells_complete(stored))


@pytest.mark.parametrize(
    ("fmt", "tty"),
    [
        ("table", False),
        ("table", True),
        ("json", False),
        ("csv", False),
        ("md", False),
        ("sql", False),
    ],
)
@pytest.mark.slow
def test_strings_show(bench_of: Callable[[str], Stored], fmt: str, tty: bool) -> None:
    """The stored run replays every string the agent sent, in every output format."""
    shown = bench_of("strings").show(fmt, tty=tty)
    problems = hostile_output(shown)
    if fmt == "json":
        problems += not_strict_json(shown, "show -o json")
    check(shown, problems)


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "pty"])
def test_strings_policy(fake: Callable[[str], HostileAgent], fleet_home: Path, tty: bool) -> None:
    """`coordinator policy` shows the agent's policy origin (an agent's words)."""
    agent = fake("strings")
    _, problems = against(
        agent, "policy.get", "policy", "--hosts", agent.address, *LINKS, home=fleet_home, tty=tty
    )
    assert not problems, problems


@pytest.mark.parametrize("command", ["resume", "cancel", "runs"])
@pytest.mark.slow
def test_strings_resume_cancel_and_runs(bench_of: Callable[[str], Stored], command: str) -> None:
    """What a stored run of the hostile agent brings back: its hosts' errors and names."""
    stored = bench_of("strings")
    assert stored.run_id, stored.run.text[-2000:]
    args = [command] if command == "runs" else [command, stored.run_id, *LINKS]
    for tty in (False, True):
        run = coordinator(*args, home=stored.home, tty=tty)
        check(run, hostile_output(run))


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "pty"])
@pytest.mark.slow
def test_strings_compare(bench_of: Callable[[str], Stored], tty: bool) -> None:
    """`coordinator compare` of the stored run with itself: its model and test names are the
    agent's (issue 42: `[/]` in one raised MarkupError, a traceback)."""
    stored = bench_of("strings")
    assert stored.run_id, stored.run.text[-2000:]
    run = coordinator("compare", stored.run_id, stored.run_id, home=stored.home, tty=tty)
    check(run, hostile_output(run))


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "pty"])
@pytest.mark.slow
def test_strings_monitor(
    fake: Callable[[str], HostileAgent],
    monitored: Callable[[str], Monitored],
    fleet_home: Path,
    tty: bool,
) -> None:
    """Samples' host, source, sensor, pressure, jobs' command, storage errors; events' detail."""
    if tty:
        agent = fake("strings")
        run, problems = against(
            agent,
            "info",
            "monitor",
            "--once",
            "--hosts",
            agent.address,
            *LINKS,
            home=fleet_home,
            tty=True,
        )
    else:
        seen = monitored("strings")
        run, problems = seen.run, hostile_output(seen.run) + seen.unasked("history.get")
    check(run, problems)


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "pty"])
@pytest.mark.slow
def test_strings_history(monitored: Callable[[str], Monitored], tty: bool) -> None:
    """What monitor recorded from the hostile agent, read back later (no agent involved)."""
    seen = monitored("strings")
    run = coordinator("history", home=seen.home, tty=tty)
    check(run, hostile_output(run) + seen.unasked("history.get"))


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "pty"])
def test_strings_doctor(fake: Callable[[str], HostileAgent], fleet_home: Path, tty: bool) -> None:
    """Check names, details and fixes, the report's host and machine."""
    agent = fake("strings")
    run, problems = against(
        agent, "doctor", "doctor", "--hosts", agent.address, *LINKS, home=fleet_home, tty=tty
    )
    check(run, problems)


@pytest.mark.slow
def test_strings_status_under_curve(tmp_path: Path, fleet_home: Path) -> None:
    """The same payloads through CURVE: the fake is a CURVE server with a zmq.auth keypair
    that accepts any client key; the coordinator learns its key with `keys add`."""
    public, secret = curve_keypair(tmp_path / "fake-keys")
    with HostileAgent("strings", name="mac3", curve=(public, secret)) as agent:
        added = coordinator("keys", "add", agent.address, public.decode("ascii"), home=fleet_home)
        assert added.returncode == 0, added.text
        run, problems = against(
            agent,
            "info",
            "status",
            "--hosts",
            agent.address,
            "--connect-timeout",
            "3",
            home=fleet_home,
        )
    check(run, problems)


@pytest.mark.parametrize("command", ["status", "doctor", "benchmark"])
@pytest.mark.slow
def test_strings_in_an_error_message(
    fake: Callable[[str], HostileAgent], fleet_home: Path, command: str
) -> None:
    """An `error` reply's message, which protocol.md §5 says is shown to the user verbatim."""
    agent = fake("reply-error")
    if command == "benchmark":
        stored = benchmark(fleet_home, agent, fake("benign").address)
        run, problems = stored.run, hostile_output(stored.run) + stored.unasked("info")
    else:
        expect = "doctor" if command == "doctor" else "info"
        run, problems = against(
            agent, expect, command, "--hosts", agent.address, *LINKS, home=fleet_home
        )
    check(run, problems)


# --- 1a. the commands added in issues 41-45, the same payloads -------------------------------

NETBENCH = ["netbench", "--sizes", "4K", "-r", "1", "-w", "0", *BENCH_LINKS]


@pytest.mark.parametrize("tty", [False, True], ids=["pipe", "pty"])
@pytest.mark.slow
def test_strings_netbench(fake: Callable[[str], HostileAgent], tmp_path: Path, tty: bool) -> None:
    """A rank's `error` (§16, shown to the user) and info.ok's strings: the run fails naming
    the host, and its stored error replays through `show` and `runs` as plain text."""
    agent, benign = fake("strings"), fake("benign")
    hosts = f"{agent.address},{benign.address}"
    run, problems = against(agent, "rank.get", *NETBENCH, "--hosts", hosts, home=tmp_path, tty=tty)
    if run.returncode != 1 or not lines_naming(run, "error: ", agent.address, "ring broke"):
        problems.append(
            f"exit {run.returncode}, no error line naming the host: {run.text[-600:]!r}"
        )
    listed = json.loads(coordinator("runs", "-o", "json", home=tmp_path).stdout)
    for args in (["show", listed[0]["id"]], ["runs"]):
        replayed = coordinator(*args, home=tmp_path, tty=tty)
        problems += [f"{args[0]}: {problem}" for problem in hostile_output(replayed)]
    check(run, problems)


STORED_COMMANDS = {
    "health": ["health", "{run}", "--no-record"],
    "health-json": ["health", "{run}", "--no-record", "-o", "json"],
    "export-csv": ["export", "{run}", "--label", "x", "-o", "csv"],
    "export-jsonl": ["export", "{run}", "--label", "x", "-o", "jsonl"],
    "export-json": ["export", "{run}", "--label", "x", "-o", "json"],
    "export-llama-json": ["export", "{run}", "--label", "x", "-o", "llama-json"],
    "export-sqlite": ["export", "{run}", "--label", "x", "--output", "{tmp}/llama-bench.sqlite"],
    "export-labels": ["export", "{run}", "-o", "csv"],
}
"""The commands of issues 43 and 45 that read a stored run (no agent asked): each shows what
the hostile agent sent, its machine's strings (the health family and canary split keys
among them) and its cells' names."""


@pytest.mark.parametrize("command", list(STORED_COMMANDS))
@pytest.mark.slow
def test_strings_stored_run_commands(
    bench_of: Callable[[str], Stored], tmp_path: Path, command: str
) -> None:
    stored = bench_of("strings")
    assert stored.run_id, stored.run.text[-2000:]
    args = [arg.format(run=stored.run_id, tmp=tmp_path) for arg in STORED_COMMANDS[command]]
    for tty in (False, True):
        run = coordinator(*args, home=stored.home, tty=tty)
        problems = hostile_output(run)
        if command == "export-labels":  # MLX versions as labels: the agent's, of two lengths
            problems = [p for p in problems if not p.startswith("exit code 2 ")]
            if run.returncode != 2 or "MARKUP" not in run.text:
                problems.append(f"not the refusal naming both labels: {run.text[-600:]!r}")
        elif run.returncode != 0:
            problems.append(f"exit {run.returncode}: {run.text[-600:]!r}")
        if args[-1] == "jsonl" and not tty:
            try:
                [strict_json(line) for line in run.stdout.splitlines()]
            except ValueError as exc:
                problems.append(f"-o jsonl is not strict JSON: {exc}")
        elif "json" in args[-1] and not tty:
            problems += not_strict_json(run, " ".join(args))
        check(run, problems)


@pytest.mark.slow
def test_strings_canary(fake: Callable[[str], HostileAgent], tmp_path: Path) -> None:
    """Two fakes, the hostile one's macOS build carrying PAYLOAD: the two sides of
    the split are the agents' own words. The hostile cells' names carry it too, so no cell ran
    on both sides, and the one line saying so quotes both sides' values as plain text (their
    raw ESC, C1, bidi and newline reached the terminal before this test)."""
    stored = benchmark(tmp_path, fake("strings"), fake("benign").address)
    assert stored.run_id, stored.run.text[-2000:]
    for tty in (False, True):
        args = ["canary", "--runs", stored.run_id, "--split", "macos"]  # mlx's: the same path
        run = coordinator(*args, home=tmp_path, tty=tty)
        problems = [p for p in hostile_output(run) if not p.startswith("exit code 2 ")]
        if run.returncode != 2 or "no cell ran on both sides" not in run.text:
            problems.append(f"exit {run.returncode}, not the refusal: {run.text[-600:]!r}")
        if "MARKUP" not in run.text:
            problems.append(f"the hostile side's value not named: {run.text[-600:]!r}")
        check(run, problems)


@pytest.mark.slow
def test_strings_publish_and_verify(bench_of: Callable[[str], Stored], tmp_path: Path) -> None:
    """A signed bundle of the hostile run: publish's lines, and verify's table and JSON, which
    recompute every figure from the agent's samples and show its hosts' facts."""
    stored = bench_of("strings")
    assert stored.run_id, stored.run.text[-2000:]
    published = coordinator("publish", stored.run_id, "--out", str(tmp_path), home=stored.home)
    check(published, hostile_output(published))
    [bundle] = tmp_path.glob("*.bundle.json")
    for fmt, tty in (("table", False), ("table", True), ("json", False)):
        run = coordinator("verify", str(bundle), "-o", fmt, home=stored.home, tty=tty)
        problems = hostile_output(run)
        if fmt == "json":
            problems += not_strict_json(run, "verify -o json")
        check(run, problems)


# --- 1b. a 4 MB string, just under the message limit ----------------------------------------


@pytest.mark.parametrize(
    ("mode", "expect", "command"),
    [("huge-info", "info", "status"), ("huge", "doctor", "doctor")],
    ids=["status", "doctor"],
)
def test_huge_status_and_doctor(
    fake: Callable[[str], HostileAgent], fleet_home: Path, mode: str, expect: str, command: str
) -> None:
    """status: info.ok's machine.device is 4 MB; doctor: the first check's detail is 4 MB."""
    agent = fake(mode)
    run, problems = against(
        agent, expect, command, "--hosts", agent.address, *LINKS, home=fleet_home
    )
    check(run, problems)


@pytest.mark.slow
def test_huge_benchmark(bench_of: Callable[[str], Stored]) -> None:
    """A failed cell's error and bench.done's error are 4 MB each."""
    stored = bench_of("huge")
    problems = hostile_output(stored.run) + stored.unasked("bench.start")
    check(stored.run, problems + benign_cells_complete(stored))


@pytest.mark.parametrize("fmt", ["table", "json", "csv", "md", "sql"])
@pytest.mark.slow
def test_huge_show(bench_of: Callable[[str], Stored], fmt: str) -> None:
    shown = bench_of("huge").show(fmt)
    check(shown, hostile_output(shown))


@pytest.mark.slow
def test_huge_monitor(monitored: Callable[[str], Monitored]) -> None:
    """Every sample's storage_error and every event's detail are 4 MB."""
    seen = monitored("huge")
    check(seen.run, hostile_output(seen.run) + seen.unasked("history.get"))


@pytest.mark.slow
def test_huge_history(monitored: Callable[[str], Monitored]) -> None:
    seen = monitored("huge")
    run = coordinator("history", home=seen.home)
    check(run, hostile_output(run) + seen.unasked("history.get"))


# --- 2. ill-typed fields --------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["table", "json"])
@pytest.mark.parametrize(("expect", "command"), [("info", "status"), ("doctor", "doctor")])
def test_types_status_and_doctor(
    fake: Callable[[str], HostileAgent], fleet_home: Path, expect: str, command: str, fmt: str
) -> None:
    """status: NaN, inf and 1e308 in the machine's numbers, cpu_levels an int, a NaN reading;
    doctor: doctor.ok with `ok` a str, a detail an int, `required` nil."""
    agent = fake("types")
    run, problems = against(
        agent, expect, command, "--hosts", agent.address, *LINKS, "-o", fmt, home=fleet_home
    )
    if fmt == "json":
        problems += not_strict_json(run, f"{command} -o json")
    check(run, problems)


@pytest.mark.slow
def test_types_benchmark_names_the_host_and_field(bench_of: Callable[[str], Stored]) -> None:
    """tokens_per_sec "fast": a protocol error of that host naming the field, like
    `mac3 sent an invalid bench.cell: tokens_per_sec is a str (agent 0.1.0)`."""
    stored = bench_of("cell-types")
    problems = hostile_output(stored.run) + stored.unasked("bench.start")
    if not lines_naming(stored.run, stored.hostile, "tokens_per_sec"):
        problems.append(
            f"no line names both {stored.hostile} and tokens_per_sec: {stored.run.text[-1500:]!r}"
        )
    check(stored.run, problems + benign_cells_complete(stored))


@pytest.mark.slow
def test_types_benchmark_stores_no_bad_cell(bench_of: Callable[[str], Stored]) -> None:
    """Neither the "fast" record, the NaN one nor index -1 is stored as a measured cell."""
    stored = bench_of("cell-types")
    cells = [cell for cell in stored.cells() if cell.get("host") == stored.hostile]
    problems = []
    if len(cells) > 2:
        problems.append(f"{len(cells)} cells stored for a 2-cell job: {cells!r:.300}")
    for cell in cells:
        speed = cell.get("tokens_per_sec")
        if cell.get("status") == "ok" and not (
            isinstance(speed, float) and speed == speed and abs(speed) != float("inf")
        ):
            problems.append(f"a measured cell stored with tokens_per_sec {speed!r}")
    check(stored.run, problems)


@pytest.mark.parametrize("fmt", ["table", "json", "csv", "md", "sql"])
@pytest.mark.slow
def test_types_show(bench_of: Callable[[str], Stored], fmt: str) -> None:
    """What was stored of the ill-typed run prints; `-o json` is strict JSON."""
    shown = bench_of("cell-types").show(fmt)
    problems = hostile_output(shown)
    if fmt == "json":
        problems += not_strict_json(shown, "show -o json")
    check(shown, problems)


@pytest.mark.parametrize("fmt", ["table", "json"])
@pytest.mark.slow
def test_types_monitor(fake: Callable[[str], HostileAgent], fleet_home: Path, fmt: str) -> None:
    """seq 2**63, NaN celsius, inf trend, state "melting", a nil inside history samples."""
    agent = fake("telemetry-types")
    wait_for_samples(agent, 4)
    run, problems = against(
        agent,
        "history.get",
        "monitor",
        "--once",
        "--hosts",
        agent.address,
        *LINKS,
        "--format",
        fmt,
        home=fleet_home,
    )
    if fmt == "json":
        problems += not_strict_json(run, "monitor --once --format json")
        if not problems:  # issue 42: a refused message is counted, not only alerted
            [host] = json.loads(run.stdout)["hosts"]
            if not host["invalid_messages"] >= 1:
                problems.append(f"invalid_messages {host['invalid_messages']}, not counted")
    check(run, problems)


@pytest.mark.parametrize("fmt", ["table", "json"])
@pytest.mark.slow
def test_types_history(monitored: Callable[[str], Monitored], fmt: str) -> None:
    seen = monitored("telemetry-types")
    run = coordinator("history", "-o", fmt, home=seen.home)
    problems = hostile_output(run) + seen.unasked("history.get")
    if fmt == "json":
        problems += not_strict_json(run, "history -o json")
    check(run, problems)


# --- 3. cells not checked against the job ---------------------------------------------------


@pytest.mark.slow
def test_cells_out_of_range_are_refused(bench_of: Callable[[str], Stored]) -> None:
    """Indexes 7, 2**63 and -1 of a 2-cell job: a protocol error naming the host and `index`,
    none stored, the run ends, the benign host complete."""
    stored = bench_of("cells-range")
    problems = hostile_output(stored.run) + stored.unasked("bench.start")
    if not lines_naming(stored.run, stored.hostile, "index"):
        problems.append(
            f"no line names both {stored.hostile} and index: {stored.run.text[-1500:]!r}"
        )
    marks = {f"{latency:.2f}" for latency in BAD_INDEX_LATENCIES}
    for line in table_rows(stored.run, stored.hostile):
        if any(mark in line for mark in marks):
            problems.append(f"an out-of-range cell was printed as a row: {line[:160]!r}")
    if stored.run_id:
        hostile = [cell for cell in stored.cells() if cell.get("host") == stored.hostile]
        if len(hostile) > 2:
            problems.append(f"{len(hostile)} cells stored for a 2-cell job")
        latencies = {cell.get("latency_ms") for cell in hostile}
        if latencies & set(BAD_INDEX_LATENCIES):
            problems.append(
                f"an out-of-range cell was stored: latency_ms {sorted(map(str, latencies))}"
            )
    check(stored.run, problems + benign_cells_complete(stored))


@pytest.mark.parametrize(
    ("index", "latency"), list(zip(BAD_INDEXES, BAD_INDEX_LATENCIES, strict=True)), ids=repr
)
@pytest.mark.slow
def test_each_bad_cell_index_fails_its_host_alone(
    fake: Callable[[str], HostileAgent], tmp_path: Path, index: Any, latency: float
) -> None:
    """Each of the issue's indexes by itself (2 of 2 cells, 99, -1, '0', 0.5, true, 2**63):
    no row for it, one line naming the host and the index, cell 0 kept, the benign host whole."""
    with HostileAgent("cells-range", name="mac3", bad_index=index) as hostile:
        stored = benchmark(tmp_path, hostile, fake("benign").address)
    problems = hostile_output(stored.run) + stored.unasked("bench.start")
    named = [line for line in lines_naming(stored.run, stored.hostile, "index") if line[0] != "│"]
    if len(named) != 1:
        problems.append(f"{len(named)} lines name {stored.hostile} and index: {named}")
    for line in table_rows(stored.run, stored.hostile, f"{latency:.2f}"):
        problems.append(f"the cell of index {index!r} was printed as a row: {line[:160]!r}")
    if stored.run.returncode != 1:
        problems.append(f"exit {stored.run.returncode}, not 1 (a host failed)")
    if stored.run_id:
        hostile_cells = [cell for cell in stored.cells() if cell.get("host") == stored.hostile]
        kept = [(cell.get("test"), cell.get("status")) for cell in hostile_cells]
        if ("pp16", "ok") not in kept or len(hostile_cells) > 2:
            problems.append(f"the hostile host's stored cells are {kept}: cell 0 alone is due")
    check(stored.run, problems + benign_cells_complete(stored))


@pytest.mark.parametrize("mode", ["start-dropped", "start-unanswered"])
@pytest.mark.slow
def test_a_lost_start_reply_is_found_with_job_list(
    fake: Callable[[str], HostileAgent], tmp_path: Path, mode: str
) -> None:
    """bench.start.ok never comes while every ping is answered: the coordinator asks job.list
    well within --host-timeout (10 s), then follows the job it started (start-unanswered) or
    starts it again (start-dropped, which never started one); both hosts complete, exit 0."""
    with HostileAgent(mode, name="mac3") as hostile:
        stored = benchmark(tmp_path, hostile, fake("benign").address)
    problems = hostile_output(stored.run) + stored.unasked("job.list")
    if stored.run.elapsed >= 10:
        problems.append(f"ended after {stored.run.elapsed:.0f} s, not within --host-timeout 10")
    if stored.run.returncode != 0:
        problems.append(f"exit {stored.run.returncode}: {stored.run.text[-1500:]!r}")
    starts = stored.asked.count("bench.start")
    if starts != (2 if mode == "start-dropped" else 1):
        problems.append(f"{starts} bench.start sent (asked {stored.asked})")
    if stored.run_id:
        tests = {c.get("test") for c in stored.cells() if c.get("host") == stored.hostile}
        if tests != BENIGN_CELLS:
            problems.append(f"the host's stored cells are {sorted(map(str, tests))}")
    check(stored.run, problems + benign_cells_complete(stored))


@pytest.mark.slow
def test_a_job_that_only_reports_progress_fails_at_its_allowance(
    fake: Callable[[str], HostileAgent], tmp_path: Path
) -> None:
    """A job that never ends while a bench.progress (no model, no cell) comes every 0.25 s:
    the host fails at the no-progress allowance of docs/protocol.md §6 (with --host-timeout 2:
    2 s + 4 x 2 s before a model's first cell), named `made no progress`, and the
    run ends with exit 1."""
    with HostileAgent("progress-forever", name="mac3") as hostile:
        since = len(hostile.requests)
        hosts = f"{hostile.address},{fake('benign').address}"
        run = coordinator(
            "benchmark", "--hosts", hosts, *LINKS, "--host-timeout", "2", *BENCH, home=tmp_path
        )
        asked = hostile.requests[since:]
    problems = hostile_output(run)
    if not lines_naming(run, hostile.address, "made no progress"):
        problems.append(f"no line says {hostile.address} made no progress: {run.text[-1500:]!r}")
    if run.returncode != 1:
        problems.append(f"exit {run.returncode}, not 1 (a host failed)")
    if "info" not in asked[1:]:
        problems.append(f"never asked info whether the job was paused (asked {asked})")
    check(run, problems)


@pytest.mark.slow
def test_cells_a_second_record_never_replaces_the_first(bench_of: Callable[[str], Stored]) -> None:
    stored = bench_of("cells-dup")
    problems = hostile_output(stored.run) + stored.unasked("bench.start")
    for line in table_rows(stored.run, stored.hostile, "999999"):
        problems.append(f"the second record for index 0 was printed as a row: {line[:160]!r}")
    if stored.run_id:
        first = [
            cell
            for cell in stored.cells()
            if cell.get("host") == stored.hostile and cell.get("test") == "pp16"
        ]
        speeds = [cell.get("tokens_per_sec") for cell in first]
        if speeds != [1600.0]:
            problems.append(f"index 0's stored tok/s are {speeds}, not the first record's [1600.0]")
    check(stored.run, problems + benign_cells_complete(stored))


@pytest.mark.slow
def test_cells_malformed_stream_still_ends(bench_of: Callable[[str], Stored]) -> None:
    """A bench.cell without `record`, a bench.done without `status` and `cells`: reported with
    the host and the field, the run ends within its bound, the benign host complete."""
    stored = bench_of("cells-malformed")
    problems = hostile_output(stored.run) + stored.unasked("bench.start")
    named = [
        line
        for line in lines_naming(stored.run, stored.hostile)
        if re.search(r"\brecord\b|\bstatus\b|\bcells\b", line)
    ]
    if not named:
        problems.append(
            f"no line names {stored.hostile} with record/status/cells: {stored.run.text[-1500:]!r}"
        )
    check(stored.run, problems + benign_cells_complete(stored))


# --- 4. hello.ok.protocol wrong -------------------------------------------------------------


def versions_line(run: Run) -> list[str]:
    return [
        line
        for line in run.lines()
        if re.search(r"protocol|version", line, re.I)
        and re.search(r"(?<![\d.:])3(?![\d.])", line)
        and re.search(r"(?<![\d.:])4(?![\d.])", line)
    ]


def test_protocol3_status_names_both_versions(
    fake: Callable[[str], HostileAgent], fleet_home: Path
) -> None:
    agent = fake("protocol3")
    run = coordinator("status", "--hosts", agent.address, *LINKS, home=fleet_home)
    problems = hostile_output(run)
    if not versions_line(run):
        problems.append(f"no line names protocol 3 and 4: {run.text[-1500:]!r}")
    check(run, problems)


@pytest.mark.slow
def test_protocol3_benchmark_stops_at_hello(
    fake: Callable[[str], HostileAgent], fleet_home: Path
) -> None:
    """The coordinator learns the version from hello.ok and sends that agent nothing more
    (no bench.start); the benign host still runs."""
    stored = benchmark(fleet_home, fake("protocol3"), fake("benign").address)
    problems = hostile_output(stored.run) + stored.unasked("hello")
    if not versions_line(stored.run):
        problems.append(f"no line names protocol 3 and 4: {stored.run.text[-1500:]!r}")
    if "bench.start" in stored.asked:
        problems.append(f"sent bench.start to an agent that speaks protocol 3: {stored.asked}")
    check(stored.run, problems + benign_cells_complete(stored))


# --- 5. a refused reply is not a missing one ------------------------------------------------


def refused_not_silent(run: Run) -> list[str]:
    problems = []
    if not INVALID.search(run.text):
        problems.append(f"does not say the reply was invalid: {run.text[-800:]!r}")
    if match := NO_ANSWER.search(run.text):
        problems.append(f"reports silence for a reply it got: {snippet(run.text, match.start())}")
    return problems


@pytest.mark.parametrize(
    ("command", "mode"),
    [
        ("status", "reply-wrong-type"),
        ("status", "reply-invalid"),
        ("status", "reply-garbage"),
        ("monitor", "reply-wrong-type"),
        ("monitor", "reply-invalid"),
        ("monitor", "reply-garbage"),
        ("doctor", "reply-wrong-type"),
    ],
)
@pytest.mark.slow
def test_invalid_reply_is_not_silence(
    fake: Callable[[str], HostileAgent], fleet_home: Path, command: str, mode: str
) -> None:
    """info (doctor for doctor) answered with the wrong type, an empty body or a frame that is
    not msgpack: reported as an invalid reply, never as no answer / unreachable."""
    agent = fake(mode)
    expect = "doctor" if command == "doctor" else "info"
    extra = ["--once"] if command == "monitor" else []
    run, problems = against(
        agent, expect, command, *extra, "--hosts", agent.address, *LINKS, home=fleet_home
    )
    check(run, problems + refused_not_silent(run))


@pytest.mark.slow
def test_invalid_history_page_is_not_unreachable(
    monitored: Callable[[str], Monitored],
) -> None:
    """A history.get.ok page with a nil sample (telemetry-types) from a host that answers and
    publishes: an invalid reply of that host, not `unreachable`."""
    seen = monitored("telemetry-types")
    check(seen.run, seen.unasked("history.get") + refused_not_silent(seen.run))


# --- 6. flood -------------------------------------------------------------------------------


@pytest.fixture(params=["flood", "junk"])
def flooding(request: pytest.FixtureRequest) -> Iterator[HostileAgent]:
    """A fresh fake per test (its flood starts at the first request it gets, for 8 s):
    `flood` publishes samples as fast as it can, `junk` fills the command socket."""
    with HostileAgent(request.param, name="mac3", flood_s=8.0) as agent:
        yield agent


def flooded(agent: HostileAgent) -> list[str]:
    """The test proves nothing unless the fake did flood while the command ran."""
    return [] if agent.flood_sent >= 1000 else [f"the fake sent only {agent.flood_sent} messages"]


@pytest.mark.slow
def test_flood_monitor_ends(flooding: HostileAgent, fleet_home: Path) -> None:
    run = coordinator("monitor", "--once", "--hosts", flooding.address, *LINKS, home=fleet_home)
    check(run, hostile_output(run) + flooded(flooding))


@pytest.mark.slow
def test_flood_status_ends(flooding: HostileAgent, fleet_home: Path) -> None:
    run = coordinator("status", "--hosts", flooding.address, *LINKS, home=fleet_home)
    check(run, hostile_output(run) + flooded(flooding))


@pytest.mark.slow
def test_flood_benchmark_keeps_the_benign_host(
    flooding: HostileAgent, fake: Callable[[str], HostileAgent], fleet_home: Path
) -> None:
    stored = benchmark(fleet_home, flooding, fake("benign").address)
    problems = hostile_output(stored.run) + flooded(flooding)
    check(stored.run, problems + benign_cells_complete(stored))


@pytest.mark.slow
def test_flood_of_samples_still_reads_the_host(fleet_home: Path) -> None:
    """Valid samples, only too many: the host is up and publishing, so `monitor --once` shows
    its reading and exits 0 (not `unreachable`, not silent)."""
    with HostileAgent("flood", name="mac3", flood_s=8.0) as agent:
        run = coordinator("monitor", "--once", "--hosts", agent.address, *LINKS, home=fleet_home)
        problems = hostile_output(run) + flooded(agent)
    if run.returncode != 0:
        problems.append(f"exit {run.returncode} for a host that publishes: {run.text[-600:]!r}")
    check(run, problems)


# --- the fake itself ------------------------------------------------------------------------


def test_the_fake_fills_a_huge_message_to_just_under_the_limit() -> None:
    """§4: 4,194,271 bytes arrive (CURVE included); the fake's huge messages must be legal."""
    data = envelope("x.ok", {"a": HUGE, "b": [HUGE, "c"]}, None)
    assert MAX_ENVELOPE - 1024 < len(data) <= MAX_ENVELOPE


LIVE_FLOOD_S = 20.0
"""How long the live monitor is flooded: on 2 cores a libzmq abort came after 20-25 s."""


@pytest.mark.slow
def test_flood_live_monitor_survives(fleet_home: Path) -> None:
    """The live dashboard (no --once) under a flood of valid samples stays up for the whole
    window and ends on Ctrl-C; bench/coordinator_flood.py measures its memory meanwhile."""
    with HostileAgent("flood", name="mac3", flood_s=LIVE_FLOOD_S + 30) as agent:
        out, err = fleet_home.parent / "monitor.out", fleet_home.parent / "monitor.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            process = subprocess.Popen(
                [console_script("coordinator"), "monitor", "--hosts", agent.address, *LINKS],
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=environment(fleet_home, tty=False),
                start_new_session=True,
            )
            began = time.monotonic()
            while time.monotonic() - began < LIVE_FLOOD_S and process.poll() is None:
                time.sleep(0.2)  # the load window, polled so an early exit is seen at once
            lived = time.monotonic() - began
            problems = []
            if process.poll() is not None:
                problems.append(f"exited {process.returncode} by itself after {lived:.1f} s")
            else:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
                    problems.append("did not end within 15 s of SIGINT")
        problems += flooded(agent)
    run = Run(
        ["monitor", "--hosts", agent.address, *LINKS],
        process.returncode,
        out.read_bytes()[-MAX_OUTPUT:],
        err.read_bytes(),
        False,
        lived,
        False,
    )
    if b"Traceback" in run.stderr or b"Assertion failed" in run.stderr:
        problems.append(f"stderr: {run.stderr[-300:]!r}")
    check(run, problems)
