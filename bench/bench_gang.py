"""How far apart do the ranks of a distributed job pause, and what does a paused peer burn?

Two real `agent serve` processes on 127.0.0.2 and 127.0.0.3 (each its own data directory, a
constant replayed 70 °C, the default 1 s poll, keys exchanged with `agent keys trust --peer`),
and a real 2-rank MLX ring job (tests/jobs/ring_steps.py: an `all_sum` every step) with each
rank under `agent run`. No coordinator. Each cycle pushes a policy that makes one Mac (the two
take turns) ask for a pause, then one that lets it resume, and reads every rank's job process
state every millisecond from /proc: the skew is how far apart the two ranks' processes entered
(and left) state T. Then, while the gang is paused, each rank's CPU over --window seconds,
beside what the same job's peer burns when only one rank is stopped (SIGSTOP of one rank's
process, which is what pausing one Mac did before gangs): the peer waits in all_sum.

    python bench/bench_gang.py [--cycles 20] [--window 2] [--quick]

Printed: pause and resume skew p50 / p99 / max over the cycles (ms, and p99 × the 1 s target),
the reaction (policy pushed -> first rank parked: up to a poll), and the CPU shares. Everything
stays on loopback and in temporary MLX_FLEET_HOMEs; nothing is asserted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import zmq
from support import BenchError, machine, parser, require_loopback, run
from support import start_agent as support_start_agent

from shared.io.keys import own_keypair
from shared.io.transport import AgentClient
from shared.io.trust import trust

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "jobs" / "ring_steps.py"
BIN = Path(sys.executable).parent
ADDRESSES = ("127.0.0.2", "127.0.0.3")
PAUSE = {"max_speed_temp": 50.0, "pause_temp": 60.0, "stop_temp": 95.0, "hysteresis": 2.0}
ALLOW = {"max_speed_temp": 75.0, "pause_temp": 85.0, "stop_temp": 95.0, "hysteresis": 2.0}
TARGET_MS = 1000.0
"""Issue 25's target for the pause skew (p99), far under Metal's ~5 s command-buffer watchdog."""


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def start_agent(stack: ExitStack, home: Path, address: str) -> tuple[str, str]:
    """An agent reading a constant replayed 70 °C."""
    home.mkdir(parents=True)
    curve = home / "flat.csv"
    curve.write_text("seconds,celsius\n0,70\n1000000,70\n")
    return support_start_agent(stack, home, address, f"replay:{curve}")


def job_pid(agent_run: subprocess.Popen[str], deadline: float) -> int:
    """The job process under one rank's agent run (its first child that runs the job)."""
    while time.monotonic() < deadline:
        children = Path(f"/proc/{agent_run.pid}/task/{agent_run.pid}/children")
        for pid in children.read_text().split():
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if args[1:2] == [str(JOB).encode()]:  # python JOB: not a child still between fork
                return int(pid)  # and exec, whose arguments are agent run's own
        time.sleep(0.01)
    raise BenchError("a rank's job did not start")


def state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def transition(pids: list[int], stopped: bool, logs: Path, timeout: float = 30.0) -> list[float]:
    """When each process entered (stopped=True) or left state T, read every millisecond; a
    timeout fails with what the ranks' agent runs said."""
    seen: dict[int, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(pids):
        if time.monotonic() > deadline:
            said = "".join(path.read_text() for path in sorted(logs.glob("rank-*.log")))
            what = "paused" if stopped else "resumed"
            states = {pid: state(pid) for pid in pids}
            raise BenchError(f"ranks not {what} within {timeout} s (states {states}):\n{said}")
        for pid in pids:
            if pid not in seen and (state(pid) == "T") == stopped:
                seen[pid] = time.monotonic()
        time.sleep(0.001)
    return [seen[pid] for pid in pids]


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--cycles", type=int, default=20)
    args.add_argument("--window", type=float, default=2.0, help="seconds of CPU measured")
    opts = args.parse_args()
    cycles = 2 if opts.quick else opts.cycles
    window = 0.5 if opts.quick else opts.window
    require_loopback(ADDRESSES)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        root = Path(tmp)
        os.environ["MLX_FLEET_HOME"] = str(root / "bench")
        homes = [root / address for address in ADDRESSES]
        agents = [start_agent(stack, h, a) for h, a in zip(homes, ADDRESSES, strict=True)]
        for home, (address, key) in zip(homes, reversed(agents), strict=True):  # each the other
            name = address.rsplit(":", 1)[0]
            trust(key, name, directory=home / "keys" / "trusted", peer=address)
        hostfile = root / "hosts.json"
        hostfile.write_text(json.dumps([[f"{a}:{free_port(a)}"] for a in ADDRESSES]))
        ranks = []
        for rank, home in enumerate(homes):
            env = {**os.environ, "MLX_FLEET_HOME": str(home), "MLX_RANK": str(rank),
                   "MLX_HOSTFILE": str(hostfile), "STEPS": "1000000000",
                   "PROGRESS_DIR": tmp}  # fmt: skip
            log = stack.enter_context(open(root / f"rank-{rank}.log", "w"))
            process = subprocess.Popen(
                [str(BIN / "agent"), "run", "--", sys.executable, str(JOB)], env=env,
                stdout=subprocess.DEVNULL, stderr=log, text=True, start_new_session=True,
            )  # fmt: skip
            stack.callback(lambda p=process: (os.killpg(p.pid, signal.SIGKILL), p.wait(10)))
            ranks.append(process)
        deadline = time.monotonic() + 120
        pids = [job_pid(process, deadline) for process in ranks]
        while not all((Path(tmp) / f"rank-{r}").exists() for r in range(2)):
            if time.monotonic() > deadline:
                raise BenchError("the ring job did not start stepping")
            time.sleep(0.05)
        ctx = zmq.Context()
        stack.callback(ctx.destroy, linger=0)
        clients = []
        for address, key in agents:
            client = AgentClient(ctx, address, key, own_keypair())
            client.connect()
            clients.append(client)
        pause_skew, resume_skew, reaction, gang_cpu = [], [], [], []
        for cycle in range(cycles):
            hot = clients[cycle % 2]
            pushed = time.monotonic()
            hot.request("policy.set", {"policy": PAUSE})
            entered = transition(pids, stopped=True, logs=root)
            reaction.append(min(entered) - pushed)
            pause_skew.append(abs(entered[0] - entered[1]))
            if cycle == 0:
                before = [cpu_s(pid) for pid in pids]
                time.sleep(window)  # a window to measure, not a wait for a condition
                gang_cpu = [(cpu_s(pid) - b) / window for pid, b in zip(pids, before, strict=True)]
            hot.request("policy.set", {"policy": ALLOW})
            left = transition(pids, stopped=False, logs=root)
            resume_skew.append(abs(left[0] - left[1]))
        os.kill(pids[0], signal.SIGSTOP)  # one rank alone, as before gangs
        before_peer = cpu_s(pids[1])
        time.sleep(window)
        solo_peer = (cpu_s(pids[1]) - before_peer) / window
        os.kill(pids[0], signal.SIGCONT)
    print(f"machine: {machine()}; {cycles} pause/resume cycles, agents polling every 1 s")
    print(f"{'':34}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}{'p99 × 1 s':>12}")
    for name, values in (("pause skew between ranks", pause_skew),
                         ("resume skew between ranks", resume_skew),
                         ("policy pushed -> first rank T", reaction)):  # fmt: skip
        ms = [v * 1000 for v in values]
        p50, p99 = statistics.median(ms), percentile(ms, 0.99)
        print(f"{name:34}{p50:10.1f}{p99:10.1f}{max(ms):10.1f}{p99 / TARGET_MS:12.2f}")
    print(f"CPU while the gang is paused, {window:g} s: rank 0 {gang_cpu[0]:.1%}, rank 1 "
          f"{gang_cpu[1]:.1%} of a core")  # fmt: skip
    print(f"CPU of the peer when one rank alone is stopped: {solo_peer:.1%} of a core")


if __name__ == "__main__":
    run(main)
