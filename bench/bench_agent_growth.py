"""Does `agent serve` come back to its baseline after work? Its RSS and open files, measured.

A real `agent serve` (CURVE on, a temporary MLX_FLEET_HOME, the `none` thermal source) is
warmed up with one request of each kind and one short job (imports and caches made once are not
growth); then measured after every phase:
  1. --requests of each request type (hello, ping, info, job.get, history.get, policy.get,
     policy.set, job.event with the agent's own key, and refused ones: a bad bench.start, one
     over the cell limit, a bench.cancel of an unknown job, a malformed message);
  2. --jobs short benchmark jobs (one tiny cell each, a job process each).
Printed as MB and open file descriptors, and as a ratio to the warmed-up baseline (1.00 = no
growth). Numbers are printed, never asserted: `python bench/bench_agent_growth.py [--requests
1000] [--jobs 100] [--quick]`. Exits 1 when it cannot measure (the agent did not start, died,
or left a request unanswered).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import psutil
import zmq
from support import machine

from shared.io.keys import Keypair, own_keypair
from shared.io.transport import AgentClient, AgentError, HostError
from shared.io.trust import trust
from shared.wire import protocol as p

READY = re.compile(r"listening on tcp://(\S+) curve-key=(\S+)")
JOB = {"models": ["small"], "n_prompt": [8], "n_gen": [0], "warmup": 0, "iterations": 1}
BIG = {"models": ["small"], "n_prompt": list(range(1, 1025)), "batch_sizes": [1, 2]}
"""2048 cells, over the limit: refused, but only after the agent read and checked it all."""
EVENT = {
    "job": "bench",
    "pid": 1,
    "action": "pause",
    "time": 0.0,
    "celsius": None,
    "source": "none",
    "simulated": False,
    "detail": None,
    "policy": None,
    "seq": None,
}


class CannotMeasure(RuntimeError):
    pass


@dataclass
class Usage:
    rss: int
    fds: int


def usage(pid: int) -> Usage:
    process = psutil.Process(pid)
    fds = process.num_fds() if hasattr(process, "num_fds") else len(process.open_files())
    return Usage(process.memory_info().rss, fds)


def start_agent(home: Path) -> tuple[subprocess.Popen[str], str, str]:
    env = os.environ | {"MLX_FLEET_HOME": str(home)}
    command = [sys.executable, "-m", "agent", "serve", "--bind", "127.0.0.1:0"]
    agent = subprocess.Popen(
        [*command, "--thermal-source", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert agent.stdout is not None
    found = READY.search(agent.stdout.readline())
    if found is None:
        agent.kill()
        raise CannotMeasure("agent serve did not print its ready line")
    return agent, found.group(1), found.group(2)


def requests_of_each_kind(
    client: AgentClient, own: AgentClient, raw: zmq.Socket, job: str
) -> dict[str, Callable[[int], Any]]:
    """One call per request kind, each answered or refused as it should be."""

    def refused(type_: str, body: dict[str, Any], code: str) -> Callable[[int], None]:
        def call(_: int) -> None:
            try:
                client.request(type_, body)
            except AgentError as exc:
                if exc.code != code:
                    raise CannotMeasure(f"{type_}: {exc.code}, not {code}") from None
            else:
                raise CannotMeasure(f"{type_} was not refused")

        return call

    def malformed(_: int) -> None:
        raw.send(msgpack.packb([1, 2]))
        if not raw.poll(10_000):
            raise CannotMeasure("no answer to a malformed message")
        raw.recv()

    history = {"samples_after": 0, "events_after": 0, "limit": 100}
    return {
        "hello": lambda _: client.request("hello", {"client": "bench"}),
        "ping": lambda _: client.request("ping"),
        "info": lambda _: client.request("info"),
        "job.get": lambda _: client.request("job.get", {"job": job}),
        "history.get": lambda _: client.request("history.get", history),
        "policy.get": lambda _: client.request("policy.get"),
        "policy.set": lambda i: client.request("policy.set", {"policy": {"hysteresis": i % 2}}),
        "job.event": lambda i: own.request("job.event", EVENT | {"time": float(i)}),
        "bench.start (bad)": refused("bench.start", {"matrix": {"models": []}}, p.BAD_MATRIX),
        "bench.start (too big)": refused("bench.start", {"matrix": BIG}, p.BAD_MATRIX),
        "bench.cancel (unknown)": refused("bench.cancel", {"job": "j-none"}, p.UNKNOWN_JOB),
        "malformed": malformed,
    }


def run_job(client: AgentClient) -> str:
    stream = list(client.stream(client.send("bench.start", {"matrix": JOB})))
    done = stream[-1].body
    if done["status"] != p.JOB_OK:
        raise CannotMeasure(f"a short job ended {done['status']}: {done['error']}")
    return str(done["job"])


def report(name: str, now: Usage, base: Usage) -> None:
    print(
        f"{name:<28} RSS {now.rss / 1e6:8.1f} MB ({now.rss / base.rss:5.2f}x)   "
        f"open files {now.fds:4d} ({now.fds / base.fds:5.2f}x)",
        flush=True,
    )


def measure(requests: int, jobs: int, home: Path) -> None:
    keypair = own_keypair()
    trusted = home / "keys" / "trusted"
    trusted.mkdir(mode=0o700, parents=True)
    trust(keypair.public, "bench", directory=trusted)
    agent, address, key = start_agent(home)
    ctx = zmq.Context()
    try:
        client = AgentClient(ctx, address, key, keypair, 30.0)
        client.connect()
        own = AgentClient(ctx, address, key, own_keypair(home / "keys"), 30.0)
        own.connect()
        raw = raw_socket(ctx, address, key, keypair)
        started = usage(agent.pid)
        job = run_job(client)
        calls = requests_of_each_kind(client, own, raw, job)
        for call in calls.values():
            call(0)
        base = usage(agent.pid)
        report("at start", started, base)
        report("warmed up (baseline)", base, base)
        for name, call in calls.items():
            for index in range(requests):
                call(index)
            report(f"{requests} x {name}", usage(agent.pid), base)
        began = time.monotonic()
        for _ in range(jobs):
            run_job(client)
        time.sleep(1.0)  # the last job process reaped, its listing expiring
        report(f"{jobs} short jobs", usage(agent.pid), base)
        print(f"({jobs} jobs took {time.monotonic() - began:.0f} s)")
        if agent.poll() is not None:
            raise CannotMeasure(f"agent serve died (exit {agent.returncode})")
        for sock in (client, own):
            sock.close()
        raw.close()
    except (HostError, psutil.Error, OSError) as exc:
        raise CannotMeasure(str(exc)) from None
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        ctx.destroy(linger=0)


def raw_socket(ctx: zmq.Context, address: str, key: str, keypair: Keypair) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.curve_secretkey = keypair.secret.encode()
    sock.curve_publickey = keypair.public.encode()
    sock.curve_serverkey = key.encode()
    sock.connect(f"tcp://{address}")
    return sock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000, help="of each kind")
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="seconds: checks the script runs")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.jobs = 3, 1
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as folder:
        os.environ["MLX_FLEET_HOME"] = str(Path(folder) / "coordinator")
        try:
            measure(args.requests, args.jobs, Path(folder) / "agent")
        except CannotMeasure as exc:
            print(f"cannot measure: {exc}", file=sys.stderr)
            sys.exit(1)


if __name__ == "__main__":
    main()
