"""What every bench script shares, so none of them can lie: both sides of a comparison run in
the same rounds, interleaved (the order rotates each round, so drift and a neighbour's load hit
both alike), repeated; each figure prints as median (min–max) over the rounds, and a ratio is
taken round by round, never from two separate runs. A side that fails to measure raises
BenchError, and run() turns it into a non-zero exit with the reason: a bench that printed
nothing true must not pass for one that measured.

Not a bench script itself (tests/test_bench.py runs bench/bench_*.py).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import select
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from shared.io.keys import Keypair, own_keypair

Measured = float | tuple[float, ...]
Side = Callable[[], Measured]
"""One measurement of one side: a number (seconds, a share of a CPU, bytes...), or several
numbers one run measures together (bench_mlx_lm: mlx-lm's prompt and generation rates)."""


class BenchError(RuntimeError):
    """A measurement that could not be taken; the message says why."""


@dataclass
class Rounds:
    """Each side's values, one per round, in round order."""

    values: dict[str, list[Measured]] = field(default_factory=dict)

    def figures(self, side: str, index: int | None = None) -> list[float]:
        """The side's values, round by round; `index` picks one of several measured together."""
        return [value if index is None else value[index] for value in self.values[side]]

    def ratios(self, side: str, base: str, index: int | None = None) -> list[float]:
        """side / base, round by round (of the `index`-th figure, for sides that measure
        several)."""
        pairs = zip(self.figures(side, index), self.figures(base, index), strict=True)
        return [a / b for a, b in pairs]


def interleave(sides: dict[str, Side], repeats: int) -> Rounds:
    """Run every side once per round for `repeats` rounds, rotating the order each round."""
    names = list(sides)
    rounds = Rounds({name: [] for name in names})
    for index in range(repeats):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            rounds.values[name].append(sides[name]())
    return rounds


def spread(values: Sequence[float], scale: float = 1.0, digits: int = 2) -> str:
    """`median (min–max)` of `values` times `scale`."""
    if not values:
        raise BenchError("nothing was measured")
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{mid * scale:.{digits}f} ({low * scale:.{digits}f}–{high * scale:.{digits}f})"


def machine() -> str:
    """The machine the figures come from, for the first line of every script's output."""
    try:
        import mlx.core as mx

        backend = f"MLX {mx.__version__} on {mx.default_device()}"
    except ImportError:
        backend = "MLX not installed"
    return (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {backend}"
    )


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser whose --quick asks for a run of seconds that only checks the script
    still measures (CI runs every bench that way, asserting no figure)."""
    result = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    result.add_argument(
        "--quick", action="store_true", help="seconds, not minutes: checks the script runs"
    )
    result.add_argument("--repeats", type=int, default=None, help="rounds per comparison")
    return result


def parse_model_options(args: argparse.ArgumentParser, iterations: int) -> argparse.Namespace:
    """`args` parsed with options for a built-in model (agent.model's --config, at --bits)
    decoding --decode-tokens, timed as agent bench times: --warmup untimed iterations, then
    --iterations timed ones; --quick shrinks them to seconds (tg4, -w 1 -r 1)."""
    from agent.model import BUILTIN_CONFIGS  # MLX: imported only by the scripts that build one

    args.add_argument("--config", choices=list(BUILTIN_CONFIGS), default="small")
    args.add_argument("--bits", type=int, default=16)
    args.add_argument("--decode-tokens", type=int, default=32)
    args.add_argument("--warmup", type=int, default=2)
    args.add_argument("--iterations", type=int, default=iterations)
    opts = args.parse_args()
    if opts.quick:
        opts.decode_tokens, opts.warmup, opts.iterations = 4, 1, 1
    return opts


def round_count(opts: argparse.Namespace, default: int = 5) -> int:
    """How many rounds to run: --repeats when given, one for --quick, else `default`."""
    return opts.repeats or (1 if opts.quick else default)


def run(main: Callable[[], None]) -> None:
    """Call `main`; a BenchError (or any failure) exits 1 with the reason on stderr."""
    try:
        main()
    except BenchError as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        sys.exit(1)


def wall_s(command: Sequence[str], env: dict[str, str] | None = None) -> float:
    """Seconds `command` took; BenchError when it failed."""
    began = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    elapsed = time.perf_counter() - began
    if result.returncode != 0:
        raise BenchError(
            f"{' '.join(command[:4])} ... exited {result.returncode}: {result.stderr[-500:]}"
        )
    return elapsed


def thread_cpu_seconds(pid: int) -> dict[int, float] | None:
    """CPU time used so far by each live thread of process `pid`, by thread id, from the
    scheduler's nanosecond counters (/proc/PID/task/*/schedstat); None where there are none
    (not Linux)."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        return None
    used = {}
    for task in tasks.iterdir():
        try:
            used[int(task.name)] = int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return used


def cpu_seconds(pid: int) -> float:
    """CPU time used so far by every live thread of process `pid`: on Linux from the
    scheduler's nanosecond counters, since an idle daemon's share is below the 10 ms tick
    psutil counts in; elsewhere from psutil."""
    threads = thread_cpu_seconds(pid)
    if threads is not None:
        return sum(threads.values())
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def child_usage(
    command: Sequence[str], env: dict[str, str] | None = None
) -> tuple[float, int | None]:
    """(wall seconds, peak RSS in bytes) of `command`. The peak is the kernel's high water mark
    of the command's own memory (Linux's VmHWM), read every 10 ms while it runs (rusage's
    ru_maxrss would also count this process's memory, which a child holds until its exec);
    None where there is no /proc."""
    began = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True
    )
    peak = 0
    while process.poll() is None:
        peak = max(peak, high_water(process.pid))
        time.sleep(0.01)
    elapsed = time.perf_counter() - began
    if process.returncode != 0:
        stderr = process.stderr.read() if process.stderr else ""
        raise BenchError(
            f"{' '.join(command[:4])} ... exited {process.returncode}: {stderr[-500:]}"
        )
    return elapsed, peak or None


def high_water(pid: int) -> int:
    """VmHWM of `pid` in bytes (0 once it has gone, or where /proc has none)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def no_power_source(why: str) -> dict[str, Any]:
    """info.ok's `power` for a stand-in agent that has no meter (docs/protocol.md): source
    `none`, no rails, no reading, and `why` as its error."""
    return {
        "source": "none",
        "simulated": False,
        "rails": [],
        "resolution_s": None,
        "reading": None,
        "error": why,
    }


def subscribe(
    ctx: zmq.Context, endpoint: str, server_key: str | None, keypair: Keypair | None = None
) -> zmq.Socket:
    """A SUB to every topic at `endpoint`; CURVE when the server's key is given, as `keypair`,
    this MLX_FLEET_HOME's own by default (which a daemon run from the same home trusts)."""
    sock = ctx.socket(zmq.SUB)
    sock.linger = 0
    if server_key:
        keypair = keypair or own_keypair()
        sock.curve_secretkey = keypair.secret.encode()
        sock.curve_publickey = keypair.public.encode()
        sock.curve_serverkey = server_key.encode()
    sock.subscribe(b"")
    sock.connect(endpoint)
    return sock


def drain(sock: zmq.Socket, received: list[int], stop: threading.Event) -> None:
    """Receive and count (in received[0]) until `stop` is set: a subscriber's thread."""
    while not stop.is_set():
        if sock.poll(50):
            while True:
                try:
                    sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                received[0] += 1


def require_loopback(addresses: Sequence[str]) -> None:
    """BenchError unless every address can be bound here (127.0.0.2 and up are loopback on
    Linux; macOS has only 127.0.0.1 unless aliased)."""
    for address in addresses:
        try:
            socket.socket().bind((address, 0))
        except OSError:
            raise BenchError(f"{address} cannot be bound on this machine's loopback") from None


READY = re.compile(r"listening on tcp://(\S+) curve-key=(\S+)")


def start_agent(
    stack: ExitStack, home: Path, address: str, thermal: str = "none"
) -> tuple[str, str]:
    """A real `agent serve` on `address` (port 0) with its own `home`, trusting this
    MLX_FLEET_HOME's key, ended when `stack` closes; its (address, CURVE key)."""
    from shared.io.trust import trust

    (home / "keys" / "trusted").mkdir(parents=True)
    trust(own_keypair().public, "bench", directory=home / "keys" / "trusted")
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "agent"), "serve", "--bind", f"{address}:0",
         "--thermal-source", thermal],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "MLX_FLEET_HOME": str(home)}, start_new_session=True,
    )  # fmt: skip
    stack.callback(lambda: (process.kill(), process.wait(10)))
    assert process.stdout is not None
    if not select.select([process.stdout], [], [], 120)[0]:
        raise BenchError(f"the agent on {address} did not get ready")
    match = READY.search(process.stdout.readline())
    if match is None:
        raise BenchError(f"the agent on {address} failed to start")
    return match.group(1), match.group(2)
