"""How fast does `agent run` react to a crossing? Crossing -> SIGSTOP observed, at p50 and p99,
printed as ratios to the poll interval.

The supervisor runs in this process the way `agent run` runs it (a LocalFeed over a ThermalMonitor,
events recorded in SQLite) around a real `sleep`. The temperature is a value this script flips, so
each crossing's time is known exactly rather than inferred from a replay's start, and each one
lands at a random phase of the sampler's ticks. A sampler that reads every interval and acts at
once gives p50 near 0.5 and p99 near 1.0 intervals; the Done-when bound is interval + 100 ms.
Nothing here is asserted.

    python bench/bench_reaction.py [--poll-interval 0.1] [--crossings 40] [--repeats 5] [--quick]

Each round is its own supervised process; figures are median (min–max) over the rounds.
"""

from __future__ import annotations

import os
import random
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

import psutil
from support import BenchError, machine, parser, round_count, run, spread

from agent.cooling.events import EventLog
from agent.cooling.supervise import LocalFeed, Supervisor
from agent.thermal import ThermalMonitor
from shared.cooling.policy import ThermalPolicy
from shared.io.paths import HOME_ENV

COOL, HOT, STOP = 60.0, 90.0, 99.0
POLICY = ThermalPolicy(max_speed_temp=75.0, pause_temp=85.0, stop_temp=95.0)


def stopped(pid: int) -> bool:
    return psutil.Process(pid).status() == psutil.STATUS_STOPPED


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> float:
    """Poll every 0.5 ms; the monotonic time the condition was first seen true."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the supervisor never acted")
        time.sleep(0.0005)
    return time.monotonic()


def drive(
    supervisor: Supervisor,
    celsius: list[float],
    crossings: int,
    interval: float,
    latencies: list[float],
) -> None:
    """Cross pause_temp at random phases, time each SIGSTOP, cool down; then cross stop_temp."""
    try:
        wait_for(lambda: supervisor.pid is not None)
        pid = supervisor.pid
        assert pid is not None
        for _ in range(crossings):
            time.sleep(random.uniform(0.0, interval))
            celsius[0] = HOT
            crossed = time.monotonic()
            latencies.append(wait_for(lambda: stopped(pid)) - crossed)
            celsius[0] = COOL
            wait_for(lambda: not stopped(pid))
    finally:
        celsius[0] = STOP


def session(interval: float, crossings: int) -> list[float]:
    """One supervised `sleep` and `crossings` crossings: each one's latency, in seconds."""
    with tempfile.TemporaryDirectory() as home:
        os.environ[HOME_ENV] = home  # the bench's events and state file stay out of the user's
        celsius = [COOL]
        latencies: list[float] = []
        log = EventLog()
        supervisor = Supervisor(["sleep", "3600"], grace=1.0, sinks=[log.record])
        monitor = ThermalMonitor(poll_interval=interval, source=lambda: celsius[0])
        driver = threading.Thread(
            target=drive, args=(supervisor, celsius, crossings, interval, latencies)
        )
        driver.start()
        code = supervisor.run(LocalFeed(monitor, POLICY))  # the main thread: it takes signals
        driver.join()
        log.close()
    if len(latencies) != crossings or code != 75:
        raise BenchError(f"{len(latencies)} of {crossings} crossings timed, exit code {code}")
    return latencies


def main() -> None:
    args = parser(__doc__)
    args.add_argument("--poll-interval", type=float, default=0.1)
    args.add_argument("--crossings", type=int, default=40)
    opts = args.parse_args()
    if opts.quick:
        opts.crossings = 5
    repeats = round_count(opts)
    interval = opts.poll_interval
    rounds: dict[str, list[float]] = {"p50": [], "p99": [], "max": []}
    for _ in range(repeats):
        latencies = session(interval, opts.crossings)
        rounds["p50"].append(statistics.median(latencies))
        rounds["p99"].append(statistics.quantiles(latencies, n=100, method="inclusive")[98])
        rounds["max"].append(max(latencies))
    print(f"machine: {machine()}")
    print(
        f"poll interval {interval:.3f} s; {repeats} rounds of {opts.crossings} crossings; "
        f"the Done-when bound is interval + 100 ms = {(interval + 0.1) * 1000:.0f} ms"
    )
    print(f"{'':26} {'ms':>24} {'× poll interval':>20}")
    for name, values in rounds.items():
        print(
            f"{'crossing -> SIGSTOP ' + name:26} {spread(values, 1000, 1):>24} "
            f"{spread([v / interval for v in values]):>20}"
        )


if __name__ == "__main__":
    run(main)
