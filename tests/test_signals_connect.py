"""Ctrl-C while connecting: `coordinator status`, `doctor` and `benchmark` answer SIGINT at once
(exit 130), not when --connect-timeout runs out; and a server that is not an agent is named as
such. Real processes, real sockets on loopback: a TCP server that accepts and never speaks, and
an HTTP server from http.server."""

from __future__ import annotations

import http.server
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from shared.io.transport import (
    HANDSHAKE_FAILURES_TO_CONCLUDE,
    NOT_ZMTP,
    WRONG_KEY,
    handshake_diagnosis,
    timeout_diagnosis,
)
from tests.conftest import console_script, run_cli, subprocess_env

pytestmark = pytest.mark.timeout(180)

CONNECT_TIMEOUT_S = 60
"""So long that an exit near it cannot pass for an answer to SIGINT."""
ANSWERED_WITHIN_S = 20
"""Generous for a loaded machine, and still a third of the connect timeout."""


class SilentServer:
    """Accepts TCP connections on loopback and never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = threading.Event()
        self.connections: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections.append(conn)
            self.accepted.set()

    def close(self) -> None:
        self.sock.close()
        for conn in self.connections:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


@pytest.mark.parametrize(
    "command",
    [["status"], ["doctor"], ["benchmark", "--config-small"]],
    ids=["status", "doctor", "benchmark"],
)
def test_ctrl_c_while_connecting_exits_130_at_once(
    silent: SilentServer, command: list[str]
) -> None:
    process = subprocess.Popen(
        [
            console_script("coordinator"),
            *command,
            "--hosts",
            f"127.0.0.1:{silent.port}",
            "--insecure",
            "--connect-timeout",
            str(CONNECT_TIMEOUT_S),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(COLUMNS="200"),
    )
    try:
        assert silent.accepted.wait(60), "the coordinator never connected"
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=CONNECT_TIMEOUT_S + 30)
        took = time.monotonic() - sent
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert took < ANSWERED_WITHIN_S, f"SIGINT answered after {took:.1f} s"
    assert "Traceback" not in err


class QuietHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's name)
        pass


@pytest.fixture
def http_port() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_port
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("curve", [False, True], ids=["insecure", "curve"])
@pytest.mark.slow
def test_an_http_server_on_the_port_is_named_not_an_agent(http_port: int, curve: bool) -> None:
    address = f"127.0.0.1:{http_port}"
    if curve:  # a key for it, as `coordinator keys add` records one
        added = run_cli("coordinator", "keys", "add", address, "x" * 40)
        assert added.returncode == 0, added.stderr
    result = run_cli(
        "coordinator",
        "status",
        "--hosts",
        address,
        "--connect-timeout",
        "2",
        "--format",
        "json",
        *([] if curve else ["--insecure"]),
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert "is this an mlx-fleet agent?" in result.stdout, result.stdout


def test_failed_handshakes_without_curve_mean_no_agent_not_a_wrong_key() -> None:
    failed = [(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, 0)] * HANDSHAKE_FAILURES_TO_CONCLUDE
    assert handshake_diagnosis(failed, None, curve=False) == NOT_ZMTP
    assert handshake_diagnosis(failed, "KEY") == WRONG_KEY
    timed_out = timeout_diagnosis(failed[:1], 5.0, "h:1", curve=False)
    assert "is this an mlx-fleet agent?" in timed_out and "h:1" in timed_out
    connected = timeout_diagnosis([(zmq.EVENT_CONNECTED, 0)], 5.0, "h:1")
    assert "handshake did not complete within 5 s: is this an mlx-fleet agent?" in connected


def test_a_connection_wait_shows_a_spinner_on_a_terminal(silent: SilentServer) -> None:
    """stderr on a pseudo-terminal, as a user's shell gives it: the wait says what it waits
    for (on a pipe, tested everywhere else, it prints nothing)."""
    import os
    import pty
    import select

    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [console_script("coordinator"), "status", "--insecure", "--hosts",
         f"127.0.0.1:{silent.port}", "--connect-timeout", str(CONNECT_TIMEOUT_S)],
        stdout=subprocess.DEVNULL, stderr=secondary, env=subprocess_env(), text=True,
    )  # fmt: skip
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + ANSWERED_WITHIN_S * 3
    try:
        while b"waiting for 1 host to answer" not in seen:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            if select.select([primary], [], [], 0.5)[0]:
                seen += os.read(primary, 4096)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(ANSWERED_WITHIN_S)
        os.close(primary)
