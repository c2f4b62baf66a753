"""Real ranks of MLX's ring backend on loopback for tests: each started with the environment
shared.distributed.rank_env writes (as mlx.launch would), then waited for with a generous
deadline."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

from shared.distributed.rank_env import RING, Member, rank_launch

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_S = 300.0


def ephemeral_floor() -> int:
    """The lowest port the kernel hands a bind to port 0 (ip_local_port_range; 32768 where it
    cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_run(count: int, attempts: int = 200) -> int:
    """The first of `count` consecutive loopback ports that are free now (a ring's ranks
    listen on consecutive ports, as mlx.launch counts them), below the ephemeral range, where
    every agent the suite starts binds port 0: a port of the run handed to another process
    after this check is the likely cause of a group serving run whose rank 1 saw "Socket 4 was
    closed by the peer" ten times, then hung (test_group_serving, a loaded full run)."""
    for _ in range(attempts):
        base = random.randint(10000, min(ephemeral_floor(), 60000) - count)
        sockets = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no run of {count} free loopback ports found")


def end_sessions(processes: Sequence[subprocess.Popen[str]]) -> None:
    """SIGTERM the process group of each process (started in a session of its own) still
    running, then wait for each: a group still there after 15 s gets SIGKILL."""
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def run_ranks(
    tmp_path: Path, count: int, argv: Sequence[str], env: dict[str, str] | None = None
) -> list[str]:
    """Start `count` ring ranks of `argv` on loopback, wait for all, and return each rank's
    stdout; a rank that fails fails the test with its stderr."""
    members = [Member(f"rank{rank}", ("127.0.0.1",)) for rank in range(count)]
    base = free_port_run(count)
    processes = []
    for rank in range(count):
        launch = rank_launch(members, rank, RING, starting_port=base)
        rank_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {}), **launch.env}
        for variable, content in launch.files.items():
            path = tmp_path / f"{variable}-{rank}.json"
            path.write_text(content)
            rank_env[variable] = str(path)
        processes.append(
            subprocess.Popen(
                list(argv),
                env=rank_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        outputs = [process.communicate(timeout=DEADLINE_S) for process in processes]
    finally:
        for process in processes:
            process.kill()
    for rank, (process, (_, stderr)) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, f"rank {rank}: {stderr}"
    return [stdout for stdout, _ in outputs]
