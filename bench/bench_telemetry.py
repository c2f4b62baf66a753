"""What publishing telemetry costs the agent, per sample.

A real AgentDaemon (in this process, its sensor `none` and its own poll pushed out of the way)
takes N readings through its whole per-sample path: judge by the policy, trend, job table, SQLite,
publish on the CURVE PUB socket to one connected subscriber, and Prometheus. Printed beside its
pieces and a baseline: a bare PUB send of the same, already encoded, frames without CURVE. The
last column is the time per sample as a share of a 1 s poll interval.

    .venv/bin/python bench/bench_telemetry.py [--samples 2000] [--insecure] [--repeats 5]
        [--quick]

Each part is measured in every round, the rounds interleave the parts; figures are median
(min–max) over the rounds.

The coordinator side (samples recorded per second from many agents) is
bench/bench_telemetry_coordinator.py.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import zmq
from support import (
    BenchError,
    drain,
    interleave,
    machine,
    parser,
    round_count,
    run,
    spread,
    subscribe,
)

from agent.daemon.loop import AgentDaemon
from agent.daemon.telemetry import sample
from agent.sensors.base import SourceInfo
from agent.thermal import ThermalReading
from shared.cooling.policy import CoolingState
from shared.io.paths import HOME_ENV
from shared.wire import protocol as p

READING = ThermalReading(celsius=71.5, source="bench", pressure=None, simulated=True)
JOBS = [
    {
        "job": "3f2a9c1e",
        "pid": 4242,
        "command": "python -m mlx_lm lora --train",
        "state": "running",
        "kind": "run",
    }
]


def per_call(call: Callable[[], object], count: int) -> float:
    """Seconds per call, averaged over `count` calls."""
    started = time.perf_counter()
    for _ in range(count):
        call()
    return (time.perf_counter() - started) / count


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--samples", type=int, default=2000)
    args.add_argument("--insecure", action="store_true", help="publish without CURVE")
    opts = args.parse_args()
    count = 200 if opts.quick else opts.samples
    repeats = round_count(opts)
    with tempfile.TemporaryDirectory() as home:
        os.environ[HOME_ENV] = home
        measure(count, not opts.insecure, repeats)


def measure(count: int, secure: bool, repeats: int) -> None:
    daemon = AgentDaemon(
        "127.0.0.1:0", secure, "none", poll_interval=3600.0, prometheus="127.0.0.1:0"
    )
    daemon.start()
    ctx = zmq.Context()
    sub = subscribe(ctx, daemon.telemetry, daemon.public_key)
    deadline = time.monotonic() + 30
    while not sub.poll(100):  # until the subscription has reached the publisher
        if time.monotonic() > deadline:
            raise BenchError("the subscriber never received a sample")
        daemon.sockets.read_subscriptions()  # what the daemon's loop does when it arrives
        daemon.hub._on_reading(time.time(), READING, None)
    received, stop = [0], threading.Event()
    draining = threading.Thread(target=drain, args=(sub, received, stop), daemon=True)
    draining.start()

    def full_path() -> None:
        now = time.time()
        daemon.hub._on_reading(now, replace(READING, time=now), daemon.hub.instruments.read_power())

    source = SourceInfo("bench", True)
    taken = sample(time.time(), READING, source, CoolingState.OK, 0.4, 0.0, JOBS)
    body = replace(taken, seq=1).body("bench-host")
    frames = p.telemetry_frames(p.make("telemetry.sample", body))
    bare = ctx.socket(zmq.PUB)
    bare.bind("tcp://127.0.0.1:*")
    bare_sub = subscribe(ctx, bare.last_endpoint.decode(), None)
    time.sleep(0.2)
    sides = {
        "whole per-sample path": full_path,
        "  build the sample": lambda: sample(
            time.time(), READING, source, CoolingState.OK, 0.4, 0.0, JOBS
        ).body("bench-host"),
        "  encode (validate + msgpack)": lambda: p.telemetry_frames(
            p.make("telemetry.sample", body)
        ),
        "  store (SQLite, a commit per 10)": lambda: daemon.hub.history.add_sample(taken),
        "  publish" + (" (CURVE)" if secure else ""): lambda: (
            daemon.sockets.publisher.send_multipart(frames)
        ),
        "bare PUB send, no CURVE (baseline)": lambda: bare.send_multipart(frames),
    }
    rounds = interleave(
        {name: partial(per_call, call, count) for name, call in sides.items()}, repeats
    )
    time.sleep(0.5)
    stop.set()
    draining.join()
    print(f"machine: {machine()}; {repeats} interleaved rounds of {count} calls a side")
    print(
        f"{count} samples a round, {len(frames[1])} bytes each; the subscriber received "
        f"{received[0]} (PUB drops what a slow subscriber cannot take)"
    )
    print(f"{'':38} {'µs/sample':>22} {'× bare send':>20} {'of a 1 s poll, %':>22}")
    base = "bare PUB send, no CURVE (baseline)"
    for name in sides:
        print(
            f"{name:38} {spread(rounds.values[name], 1e6, 1):>22} "
            f"{spread(rounds.ratios(name, base), 1, 1):>20} "
            f"{spread(rounds.values[name], 100, 4):>22}"
        )
    for sock in (sub, bare, bare_sub):
        sock.close(linger=0)
    ctx.term()
    daemon.close()


if __name__ == "__main__":
    run(main)
