"""Real `agent serve` processes for tests: each with its own MLX_FLEET_HOME, bound to port 0 on
loopback (or inside a network namespace), found through its ready line, always killed after."""

from __future__ import annotations

import os
import re
import select
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import zmq

from coordinator.hosts.keys import add_host_key
from shared.io.keys import Keypair, own_keypair
from shared.io.transport import AgentClient
from shared.io.trust import trust
from shared.wire import protocol as p
from tests.conftest import console_script, subprocess_env

READY = re.compile(
    r"listening on tcp://(\S+) (?:curve-key=(\S+)|INSECURE)"
    r"(?: telemetry=tcp://(\S+))?"
)
QUICK = ["--config-small", "-p", "16", "-n", "4", "-r", "1", "-w", "0"]
"""Two cells that take well under a second on a slow CPU."""
LONG = ["--config-small", "-p", "16,32,48", "-n", "8", "-d", "0,32", "-r", "3", "-w", "0"]
"""Eight cells, a few seconds: long enough to kill, cancel or stop an agent in the middle."""


@dataclass
class AgentProcess:
    home: Path
    process: subprocess.Popen[str]
    address: str
    key: str | None
    log: Path
    telemetry: str = ""
    """HOST:PORT of the telemetry PUB socket."""

    @property
    def port(self) -> int:
        return int(self.address.rsplit(":", 1)[1])

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def kill(self) -> None:
        """SIGKILL the agent and its job child (they share the process group we started)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()

    def journal_cells(self) -> int:
        """Cells this agent has journaled so far (its SQLite file, read-only)."""
        return count_rows(self.home / "agent-jobs.sqlite", "SELECT COUNT(*) FROM cells")

    def wait_for_cells(self, count: int, timeout: float = 60) -> None:
        """Until the agent has journaled `count` cells: the coordinator may not have them yet."""
        wait_for_rows(self.journal_cells, count, timeout, self.process, self.log_text)

    def wait_for_coordinator_cells(
        self, coordinator: subprocess.Popen[str], count: int, timeout: float = 60
    ) -> None:
        """Until the test's coordinator has stored `count` of this agent's cells, so a fault
        injected now cuts a run that provably holds some of them."""
        store = Path(os.environ["MLX_FLEET_HOME"]) / "coordinator.sqlite"
        query = "SELECT COUNT(*) FROM cells WHERE host = ?"
        wait_for_rows(
            lambda: count_rows(store, query, (self.address,)),
            count,
            timeout,
            coordinator,
            lambda: "the coordinator ended before it stored those cells",
        )


def count_rows(path: Path, query: str, params: tuple[str, ...] = ()) -> int:
    """One COUNT from a SQLite file another process writes, read-only; 0 before it exists."""
    if not path.exists():
        return 0
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5) as conn:
        try:
            return conn.execute(query, params).fetchone()[0]
        except sqlite3.OperationalError:
            return 0  # the schema is not there yet


def wait_for_rows(
    counted: Callable[[], int],
    count: int,
    timeout: float,
    writer: subprocess.Popen[str],
    log: Callable[[], str],
) -> None:
    deadline = time.monotonic() + timeout
    while counted() < count:
        assert time.monotonic() < deadline, f"fewer than {count} cells kept in time"
        assert writer.poll() is None, log()
        time.sleep(0.05)


class AgentPool:
    """Starts agents; kill_all() (the fixture's teardown) ends every one of them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.agents: list[AgentProcess] = []

    def start(
        self,
        name: str = "agent",
        *,
        insecure: bool = False,
        thermal: str = "none",
        bind_host: str = "127.0.0.1",
        port: int = 0,
        netns: str | None = None,
        options: Sequence[str] = (),
        wrapper: Sequence[str] = (),
        home: Path | None = None,
    ) -> AgentProcess:
        """`options` are more `agent serve` options (--poll-interval, --prometheus, ...);
        `wrapper` a command that runs it (prlimit ..., say); `home` its MLX_FLEET_HOME when not
        its own folder under the pool's; `port` 0 picks a free one."""
        logs = self.root / name
        logs.mkdir(parents=True, exist_ok=True)
        home = home or logs
        log = logs / "serve.log"
        command = [
            console_script("agent"),
            "serve",
            "--bind",
            f"{bind_host}:{port}",
            "--thermal-source",
            thermal,
            *(["--insecure"] if insecure else []),
            "--parent-pid",  # it stops when the test run ends, however it ends
            str(os.getpid()),
            *options,
        ]
        command = [*wrapper, *command]
        if netns is not None:
            command = ["ip", "netns", "exec", netns, *command]
        with open(log, "w", encoding="utf-8") as log_file:
            process = subprocess.Popen(
                command,
                stdout=subprocess.PIPE,
                stderr=log_file,
                stdin=subprocess.DEVNULL,
                text=True,
                env=subprocess_env(MLX_FLEET_HOME=str(home)),
                start_new_session=True,
            )
        agent = AgentProcess(home, process, "", None, log)
        self.agents.append(agent)
        assert process.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if select.select([process.stdout], [], [], 0.2)[0]:
                match = READY.search(process.stdout.readline())
                if match:
                    agent.address, agent.key = match.group(1), match.group(2)
                    agent.telemetry = match.group(3) or ""
                    return agent
            assert process.poll() is None, f"agent {name} exited:\n{agent.log_text()}"
        raise AssertionError(f"agent {name} did not get ready:\n{agent.log_text()}")

    def kill_all(self) -> None:
        for agent in self.agents:
            agent.kill()


def cli(
    name: str, *args: str, home: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run a console script; `home` sets its MLX_FLEET_HOME (else the test's own)."""
    extra = {"COLUMNS": "200"} | ({"MLX_FLEET_HOME": str(home)} if home else {})
    return subprocess.run(
        [console_script(name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(**extra),
    )


def exchange_keys(agent: AgentProcess) -> None:
    """Trust this test's coordinator on `agent` and record the agent's key: what `agent keys
    trust` and `coordinator keys add` do, through the functions they call (tests/test_keys.py
    runs the commands themselves; four command lines per agent were the suite's CPU, not
    what it tests)."""
    assert agent.key, f"{agent.address} serves without CURVE: no key to exchange"
    trust(own_keypair().public, "test", directory=agent.home / "keys" / "trusted")
    add_host_key(agent.address, agent.key)


def trusted_agent(
    agents: AgentPool,
    name: str = "agent",
    *,
    thermal: str = "none",
    options: Sequence[str] = (),
    wrapper: Sequence[str] = (),
) -> AgentProcess:
    """An agent that trusts this test's coordinator key (the test's MLX_FLEET_HOME keypair)."""
    agent = agents.start(name, thermal=thermal, options=options, wrapper=wrapper)
    trust(own_keypair().public, "test", directory=agent.home / "keys" / "trusted")
    return agent


def raw_dealer(ctx: zmq.Context, agent: AgentProcess, keypair: Keypair | None = None) -> zmq.Socket:
    """A bare CURVE DEALER on `agent`'s command socket, holding `keypair` (the test's own by
    default), for envelopes AgentClient would never send."""
    keypair = keypair or own_keypair()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.maxmsgsize = p.MAX_MESSAGE_SIZE
    sock.curve_secretkey = keypair.secret.encode()
    sock.curve_publickey = keypair.public.encode()
    sock.curve_serverkey = (agent.key or "").encode()
    sock.connect(f"tcp://{agent.address}")
    return sock


def connect(ctx: zmq.Context, agent: AgentProcess, timeout: float = 5.0) -> AgentClient:
    client = AgentClient(ctx, agent.address, agent.key, own_keypair(), timeout)
    client.connect()
    return client


def subscriber(ctx: zmq.Context, agent: AgentProcess) -> zmq.Socket:
    """A SUB on the agent's telemetry socket, with this test's key (no CURVE for an insecure
    agent), subscribed to both topics."""
    sock = ctx.socket(zmq.SUB)
    sock.linger = 0
    if agent.key:
        keypair = own_keypair()
        sock.curve_secretkey = keypair.secret.encode()
        sock.curve_publickey = keypair.public.encode()
        sock.curve_serverkey = agent.key.encode()
    sock.subscribe(b"")
    sock.connect(f"tcp://{agent.telemetry}")
    return sock


def receive(
    sock: zmq.Socket,
    wanted: Callable[[p.Message], bool],
    timeout: float = 10.0,
    seen: list[p.Message] | None = None,
) -> p.Message:
    """The first telemetry message `wanted` accepts (each one received goes to `seen`)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if sock.poll(left * 1000):
            message = p.decode_telemetry(sock.recv_multipart())
            if seen is not None:
                seen.append(message)
            if wanted(message):
                return message
    raise AssertionError(f"no such telemetry within {timeout} s")
