"""The embedded agent: `coordinator benchmark` without hosts runs a real `agent serve` child on
127.0.0.1 (an ephemeral port) and drives it like any other host.

The child gets its own data directory, `<coordinator data dir>/embedded-agent`, so its keys, its
trust list and its job journal never touch a standalone agent's on the same Mac. Keys are trusted
both ways without the user: this coordinator's public key is written into the child's trust list
before it starts, and the child's server key is read from its ready line
(`agent serve: listening on tcp://127.0.0.1:PORT curve-key=KEY`). Its log goes to agent.log there.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import time

from shared.io.keys import Keypair
from shared.io.paths import HOME_ENV, data_subdir, private_dir
from shared.io.processes import end_process
from shared.io.trust import trust

READY = re.compile(r"listening on tcp://(\S+) curve-key=(\S+)")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


class EmbeddedAgentError(RuntimeError):
    """The local agent would not start; the message carries the end of its log."""


class EmbeddedAgent:
    """`with EmbeddedAgent(keypair) as agent:` -> agent.address and agent.server_key."""

    def __init__(
        self,
        keypair: Keypair,
        thermal_source: str = "auto",
        *,
        bind: str = "127.0.0.1:0",
        home: str = "embedded-agent",
        peers: dict[str, str] | None = None,
    ) -> None:
        """`peers`: agent keys it serves staged models to (key → that agent's HOST:PORT), for a
        stage's origin (coordinator.runs.staging_origin), which binds where they reach it."""
        self.keypair = keypair
        self.thermal_source = thermal_source
        self.bind = bind
        self.peers = peers or {}
        self.home = data_subdir(home)
        self.log_path = self.home / "agent.log"
        self.process: subprocess.Popen[str] | None = None
        self.address = ""
        self.server_key = ""

    def __enter__(self) -> EmbeddedAgent:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        trusted = private_dir(self.home / "keys" / "trusted")
        for stale in trusted.glob("*.key"):  # this coordinator's key may be new, a peer gone
            stale.unlink()
        trust(self.keypair.public, name="coordinator", directory=trusted)
        for index, (key, address) in enumerate(self.peers.items()):
            trust(key, name=f"peer-{index}", directory=trusted, peer=address)
        env = dict(os.environ, **{HOME_ENV: str(self.home)})
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(log_fd, 0o600)  # one an earlier release made 0644
        with open(log_fd, "w", encoding="utf-8") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agent",
                    "serve",
                    "--bind",
                    self.bind,
                    "--thermal-source",
                    self.thermal_source,
                    "--parent-pid",
                    str(os.getpid()),
                ],
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                env=env,
                text=True,
            )
        assert self.process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.process.stdout], [], [], 0.2)
            if ready:
                line = self.process.stdout.readline()
                match = READY.search(line)
                if match:
                    self.address, self.server_key = match.groups()
                    return
                if not line:
                    break  # the child exited
            elif self.process.poll() is not None:
                break
        self.stop()
        raise EmbeddedAgentError(
            f"the local agent did not start; its log "
            f"({self.log_path}) ends with:\n{self._log_tail()}"
        )

    def stop(self) -> None:
        """SIGTERM (the agent stops its job and flushes), then SIGKILL if it lingers."""
        process, self.process = self.process, None
        if process is None:
            return
        end_process(process, STOP_TIMEOUT_S)
        if process.stdout is not None:
            process.stdout.close()

    def _log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(encoding="utf-8").splitlines()[-lines:])
        except OSError:
            return "(no log)"
