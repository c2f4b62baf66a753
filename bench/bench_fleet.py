"""The control plane at lab size: each command against N agents as a ratio to the same command
against 1, measured side by side (the rounds interleave 1 and N, and repeat).

  1. `coordinator status` and 2. `coordinator monitor --once`, wall time, against N real
     `agent serve --thermal-source sim` processes (CURVE, each with its own data directory);
  3. the live dashboard (`coordinator monitor` on a pseudo-terminal, drawing as for a person)
     over those agents publishing at 1 Hz: its share of one CPU, and its memory, per host;
  4. a benchmark fan-out (`coordinator benchmark`, 8 cells a host) to N protocol-level agents
     (bench/replay.py: a real agent's job is an MLX process, and N of those do not fit in a
     laptop's memory), replaying cells measured by a real run here: the coordinator's CPU per
     host, and the wall time.

    .venv/bin/python bench/bench_fleet.py [--agents 100] [--repeats 3] [--seconds 20] [--quick]

Everything stays on 127.0.0.1 and in a temporary directory. Numbers are printed, never asserted.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path

import psutil
from replay import measured_here, replay_agents
from support import BenchError, cpu_seconds, interleave, machine, parser, run, spread, wall_s

BIN = Path(sys.executable).parent
READY = re.compile(r"listening on tcp://(\S+) curve-key=(\S+)")
FANOUT = ["--config-small", "-s", "8,16,32,64", "-i", "1", "-w", "0", "--decode-tokens", "4"]


@contextmanager
def real_agents(count: int, root: Path, coordinator_key: str) -> Iterator[list[tuple[str, str]]]:
    """`count` real agents, all started at once; their (HOST:PORT, key). Killed on exit."""
    from shared.io.trust import trust

    processes = []
    try:
        for index in range(count):
            home = root / f"agent{index:03d}"
            (home / "keys" / "trusted").mkdir(parents=True)
            trust(coordinator_key, "bench", directory=home / "keys" / "trusted")
            command = [str(BIN / "agent"), "serve", "--bind", "127.0.0.1:0"]
            processes.append(
                subprocess.Popen(
                    [*command, "--thermal-source", "sim"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env={**os.environ, "MLX_FLEET_HOME": str(home)},
                    start_new_session=True,
                )
            )
        found = []
        for process in processes:
            assert process.stdout is not None
            if not select.select([process.stdout], [], [], 300)[0]:
                raise BenchError("an agent did not get ready within 300 s")
            match = READY.search(process.stdout.readline())
            if match is None:
                raise BenchError(f"an agent failed to start (exit {process.poll()})")
            found.append((match.group(1), match.group(2)))
        yield found
    finally:
        for process in processes:
            process.kill()
            process.wait(10)


def hostfile(path: Path, agents: list[tuple[str, str]]) -> str:
    hosts = []
    for address, key in agents:
        host, port = address.rsplit(":", 1)
        hosts.append({"host": host, "port": int(port), "key": key})
    path.write_text(json.dumps({"hosts": hosts}), encoding="utf-8")
    return str(path)


def coordinator(*args: str) -> list[str]:
    return [str(BIN / "coordinator"), *args]


def live_monitor(
    hosts: str, env: dict[str, str], warmup: float, seconds: float
) -> tuple[float, int]:
    """(share of one CPU, RSS bytes) of `coordinator monitor` drawing its dashboard on a
    pseudo-terminal of 200 x 50, measured after `warmup` seconds (connects, backfills)."""
    import fcntl
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    process = subprocess.Popen(
        coordinator("monitor", "--hostfile", hosts),
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**env, "TERM": "xterm-256color"},
        start_new_session=True,
    )
    os.close(follower)
    drained = threading.Thread(target=_drain, args=(leader,), daemon=True)
    drained.start()
    try:
        time.sleep(warmup)
        cpu, began = cpu_seconds(process.pid), time.monotonic()
        time.sleep(seconds)
        if process.poll() is not None:
            raise BenchError(f"coordinator monitor exited {process.returncode}")
        share = (cpu_seconds(process.pid) - cpu) / (time.monotonic() - began)
        rss = psutil.Process(process.pid).memory_info().rss
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
        drained.join(5)
        os.close(leader)
    return share, rss


def _drain(fd: int) -> None:
    """Read the dashboard off the terminal until it closes, as a terminal would."""
    while True:
        try:
            if not os.read(fd, 65536):
                return
        except OSError:
            return


def fanout(hosts: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, coordinator CPU seconds) of one fan-out."""
    command = coordinator("benchmark", "--hostfile", hosts, *FANOUT, "--format", "json")
    began = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - began
    if os.waitstatus_to_exitcode(status) != 0:
        raise BenchError(f"coordinator benchmark failed: {process.stderr.read()[-500:]!r}")
    return wall, usage.ru_utime + usage.ru_stime


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--agents", type=int, default=100)
    args.add_argument("--seconds", type=float, default=20.0, help="live monitor window")
    opts = args.parse_args()
    if opts.quick:
        opts.agents, opts.seconds = 3, 2.0
    repeats = opts.repeats or (1 if opts.quick else 3)
    warmup = 3.0 if opts.quick else 10.0
    print(f"control plane at {opts.agents} agents vs 1, {repeats} interleaved rounds")
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="mlx-fleet-bench-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        env = {**os.environ, "MLX_FLEET_HOME": str(root / "coordinator"), "COLUMNS": "200"}
        os.environ["MLX_FLEET_HOME"] = env["MLX_FLEET_HOME"]
        from shared.io.keys import own_keypair

        key = own_keypair().public
        began = time.monotonic()
        agents = stack.enter_context(real_agents(opts.agents, root, key))
        print(f"{opts.agents} real agents ready in {time.monotonic() - began:.0f} s")
        one, many = hostfile(root / "one.json", agents[:1]), hostfile(root / "all.json", agents)

        def timed(*command: str) -> dict[str, float]:
            return {
                "1": lambda: wall_s(coordinator(*command, "--hostfile", one), env),
                "N": lambda: wall_s(coordinator(*command, "--hostfile", many), env),
            }

        print(f"\n{'':40} {'1 host':>20} {f'{opts.agents} hosts':>20} {'ratio':>20}")
        for label, command in (
            ("coordinator status (s)", ("status", "--format", "json")),
            ("coordinator monitor --once (s)", ("monitor", "--once", "--format", "json")),
        ):
            rounds = interleave(timed(*command), repeats)
            show(label, rounds.values["1"], rounds.values["N"], rounds.ratios("N", "1"))

        memory: dict[str, list[float]] = {"1": [], "N": []}

        def watched(size: str, hosts: str) -> float:
            share, rss = live_monitor(hosts, env, warmup, opts.seconds)
            memory[size].append(rss)
            return share

        sides = {"1": partial(watched, "1", one), "N": partial(watched, "N", many)}
        shares = interleave(sides, repeats).values
        show("live monitor, share of one CPU (%)", shares["1"], shares["N"], None, 100)
        per_ten = [share * 10 / opts.agents for share in shares["N"]]
        print(f"{'  per 10 hosts (%)':40} {'':>20} {spread(per_ten, 100, 3):>20}")
        show("live monitor RSS (MB)", memory["1"], memory["N"], None, 1e-6, 1)
        grown = [(n - o) / max(1, opts.agents - 1) for o, n in zip(*memory.values(), strict=True)]
        print(f"{'  per host beyond the first (MB)':40} {'':>20} {spread(grown, 1e-6, 3):>20}")

        stack.close()  # the real agents go: the fan-out needs their cores and memory
        with replay_agents(opts.agents, measured_here()) as replays:
            one, many = hostfile(root / "r1.json", replays[:1]), hostfile(root / "rN.json", replays)
            cpus: dict[str, list[float]] = {"1": [], "N": []}

            def fanned(size: str, hosts: str) -> float:
                wall, cpu = fanout(hosts, env)
                cpus[size].append(cpu)
                return wall

            sides = {"1": partial(fanned, "1", one), "N": partial(fanned, "N", many)}
            walls = interleave(sides, repeats)
        print("\nbenchmark fan-out, 8 cells a host, to protocol-level agents (bench/replay.py):")
        show("  wall time (s)", *walls.values.values(), walls.ratios("N", "1"))
        cpu_ratios = [n / o for o, n in zip(cpus["1"], cpus["N"], strict=True)]
        show("  coordinator CPU (s)", cpus["1"], cpus["N"], cpu_ratios)
        per_host = [ratio / opts.agents for ratio in cpu_ratios]
        print(f"{'  coordinator CPU per host, N / 1':40} {'':>20} {'':>20} {spread(per_host):>20}")


def show(
    label: str,
    one: list[float],
    many: list[float],
    ratios: list[float] | None,
    scale: float = 1.0,
    digits: int = 2,
) -> None:
    ratio = spread(ratios) if ratios is not None else ""
    print(
        f"{label:40} {spread(one, scale, digits):>20} {spread(many, scale, digits):>20} {ratio:>20}"
    )


if __name__ == "__main__":
    run(main)
