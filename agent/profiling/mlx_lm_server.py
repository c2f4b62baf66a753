"""`--serve mlx_lm`: mlx_lm.server started with the cell's model on a free port of 127.0.0.1,
waited for until it streams an answer, watched while the cells run, and stopped after, when it
reports its MLX peak memory.

The server never outlives the process that started it: it runs under this module's `main` (a
lifeline: on Linux the kernel's PR_SET_PDEATHSIG, everywhere the end of its stdin, which only its
parent holds), which then hands the process to mlx_lm.server's own `main`.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

from agent.profiling.openai_client import ServeUrl, ServeUrlError, check_server
from shared.benchmark.openai_stream import DEFAULT_MODEL
from shared.io.processes import end_process
from shared.safe_text import shown

READY_TIMEOUT_S = 600.0
"""How long a starting server has to load its model and stream its first answer."""
STOP_TIMEOUT_S = 10.0
"""How long a stopping server has after SIGTERM before SIGKILL."""
POLL_S = 0.1
PR_SET_PDEATHSIG = 1
"""From <linux/prctl.h>."""
UNHEALTHY = 503
"""mlx_lm.server's /health once its generation thread has ended (a model that failed to load):
it never serves again (mlx_lm/server.py, handle_health_check, generation_available)."""
HEALTH_LOG = b'"GET /health '
"""The access log line of our own health polls, left out of what a dead server's error quotes."""
TAIL_LINES = 5
"""Lines of a dead server's log quoted in its error."""


class ServerDied(RuntimeError):
    """mlx_lm.server did not start, or exited while serving: the message says how, with the
    last lines it logged."""


def free_port() -> int:
    """A port of 127.0.0.1 free now (the kernel's pick for a bind to port 0). Another process
    could take it before the server binds; the server then exits, and says so."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class MlxLmServer:
    """One mlx_lm.server process serving `model` (a directory or a Hugging Face id, as
    mlx_lm.server's --model takes it), as a context: entered, it answers; left, it is gone.

    One rank of a distributed server (agent.profiling.group_serving) is started with `env` (its
    whole environment, its ring's included) and `options` (--pipeline); a rank past 0 never
    answers HTTP (mlx_lm.server's `run`: it follows rank 0's requests through the ring), so
    entering it waits for nothing."""

    def __init__(
        self,
        model: str,
        ready_timeout_s: float = READY_TIMEOUT_S,
        env: dict[str, str] | None = None,
        options: tuple[str, ...] = (),
        answers: bool = True,
    ) -> None:
        self.model, self.ready_timeout_s = model, ready_timeout_s
        self.env, self.options, self.answers = env, options, answers
        self.port = free_port()
        descriptor, self._peak_file = tempfile.mkstemp(prefix="mlx-fleet-server-peak-")
        os.close(descriptor)
        self.peak_memory_bytes: int | None = None
        """Its MLX peak memory over its life, as it reported it when stopped (None before, or
        when it could not: killed, or dead before)."""
        self.url = ServeUrl("http", "127.0.0.1", self.port)
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - closed with the server
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> MlxLmServer:
        self.start()
        try:
            if self.answers:
                self._wait_ready()
        except BaseException:
            self.__exit__()
            raise
        return self

    def start(self) -> None:
        """The process started, not waited for (a group's ranks wait together,
        agent.profiling.group_serving); __exit__ stops it."""
        command = [
            sys.executable,
            "-m",
            __name__,
            "--parent",
            str(os.getpid()),
            "--peak-file",
            self._peak_file,
            "--model",
            self.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self.options,
        ]
        self._process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=self._log, stderr=subprocess.STDOUT, env=self.env
        )

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _wait_ready(self) -> None:
        """Until /health answers 200 and a one-token answer streams, or the server exits, or the
        deadline passes."""
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.ready():
                return
            time.sleep(POLL_S)
        raise ServerDied(self.not_ready())

    def ready(self) -> bool:
        """One look: True once /health answers 200 and a one-token answer streams, False while
        nothing answers; ServerDied when it never will (gone, or its generation ended)."""
        self.raise_if_dead()
        health = self._health()
        if health == UNHEALTHY:
            raise ServerDied(self.failure() or "mlx_lm.server cannot generate")
        if health != 200:
            return False
        try:
            check_server(self.url, DEFAULT_MODEL, timeout_s=self.ready_timeout_s)
        except ServeUrlError as exc:
            self.raise_if_dead()
            raise ServerDied(f"mlx_lm.server answers, but {exc}") from None
        return True

    def not_ready(self) -> str:
        """Why a server past its ready_timeout_s failed."""
        return f"mlx_lm.server did not answer within {self.ready_timeout_s:g} s{self._last_lines()}"

    def _health(self) -> int | None:
        """GET /health's status, None while nothing answers."""
        connection = self.url.connect(2.0)
        try:
            connection.request("GET", "/health")
            return connection.getresponse().status
        except (OSError, http.client.HTTPException):
            return None
        finally:
            connection.close()

    def death(self) -> str | None:
        """Why the server is gone (its exit and its last lines), or None while it runs."""
        if self._process is None or self._process.poll() is None:
            return None
        code = self._process.returncode
        how = f"signal {-code}" if code < 0 else f"status {code}"
        return f"mlx_lm.server exited with {how}{self._last_lines()}"

    def failure(self) -> str | None:
        """Why the server cannot serve now (gone, or its generation thread ended: a rank of a
        distributed server whose peer went away), or None."""
        why = self.death()
        if why is None and self.answers and self._health() == UNHEALTHY:
            why = (
                f"mlx_lm.server cannot generate (GET /health answered {UNHEALTHY}: its "
                f"generation thread ended){self._last_lines(skip=HEALTH_LOG)}"
            )
        return why

    def raise_if_dead(self) -> None:
        why = self.death()
        if why is not None:
            raise ServerDied(why)

    def _last_lines(self, skip: bytes = b"") -> str:
        """The server's last lines logged, `skip` (a part of a line) left out."""
        if self._log.closed:
            return ""
        self._log.seek(0)
        lines = deque(
            (
                line
                for line in self._log.read().splitlines()
                if line.strip() and not (skip and skip in line)
            ),
            TAIL_LINES,
        )
        if not lines:
            return ""
        return ": " + shown(" | ".join(line.decode("utf-8", "replace") for line in lines), 1000)

    def __exit__(self, *exc: object) -> None:
        process, self._process = self._process, None
        if process is not None:
            end_process(process, STOP_TIMEOUT_S)
            if process.stdin is not None:
                process.stdin.close()
        self._log.close()
        with contextlib.suppress(OSError):
            reported = Path(self._peak_file).read_text(encoding="ascii").strip()
            self.peak_memory_bytes = int(reported) if reported.isdigit() else None
            os.unlink(self._peak_file)


def follow_parent(parent: int) -> None:
    """Exit when `parent` dies: the kernel's signal on Linux, and on any system the end of
    stdin (its parent holds the only writing end)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        sys.stdin.buffer.read()
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="lifeline").start()


def report_peak_on_stop(path: str) -> None:
    """On SIGTERM (MlxLmServer's stop), write this process's MLX peak memory (bytes, over its
    life: the model's load, every request) to `path`, then exit at once, as SIGTERM's default
    would. A handler runs only between bytecodes of the main thread (mlx_lm.server's HTTP loop on
    rank 0, its join of the generation thread elsewhere); one held off longer is killed after
    STOP_TIMEOUT_S, and reports nothing."""

    def stop(signum: int, frame: object) -> None:
        import mlx.core as mx

        try:
            Path(path).write_text(str(mx.get_peak_memory()), encoding="ascii")
        finally:
            os._exit(0)

    signal.signal(signal.SIGTERM, stop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--peak-file", required=True)
    args, rest = parser.parse_known_args()
    follow_parent(args.parent)
    report_peak_on_stop(args.peak_file)
    sys.argv = ["mlx_lm.server", *rest]
    from mlx_lm.server import main as serve

    serve()


if __name__ == "__main__":
    main()
