"""What watching the temperature costs: per sample, and as a share of one CPU while idle at 1 Hz.

Each source is printed beside two baselines: a plain Python function (the floor) and spawning
one process per reading (what the seed did with `sudo powermetrics -n 1`, here with `true`, which
is cheaper than powermetrics, so the real difference is larger). CPU is process CPU time
(time.process_time, all threads) plus the CPU of any tool process the source runs.

    .venv/bin/python bench/bench_thermal.py [--sources sim,replay,auto] [--seconds 5]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from agent.thermal import SourceSpecError, SourceUnavailable, ThermalMonitor, open_source
from agent.thermal.base import CallableSource, ThermalSource


def own_cpu_s() -> float:
    """CPU seconds used so far by this process (all threads) and its finished children (the
    process-per-reading baseline). Cheap enough to call around a tight loop."""
    finished = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + finished.ru_utime + finished.ru_stime


def cpu_s() -> float:
    """own_cpu_s() plus the running children: the macmon or powermetrics stream (and sudo)."""
    total = own_cpu_s()
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def per_sample(read: Callable[[], object], samples: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) per call, averaged over `samples` calls."""
    read()  # warm: first reads may start a tool or wait for its first sample
    wall, cpu = time.perf_counter(), own_cpu_s()
    for _ in range(samples):
        read()
    return (time.perf_counter() - wall) / samples, (own_cpu_s() - cpu) / samples


def idle_share(
    poller: ThermalMonitor | threading.Thread | None, seconds: float
) -> tuple[float, float]:
    """(CPU seconds, share of one CPU) over `seconds` of wall time while `poller` runs."""
    if poller is not None:
        poller.start()
    cpu, wall = cpu_s(), time.perf_counter()
    time.sleep(seconds)
    used = cpu_s() - cpu
    elapsed = time.perf_counter() - wall
    if isinstance(poller, ThermalMonitor):
        poller.stop()
    return used, used / elapsed


def bare_thread(stop: threading.Event) -> threading.Thread:
    """A thread that only wakes at 1 Hz: what any polling thread costs before it reads anything."""

    def wake() -> None:
        while not stop.wait(1.0):
            pass

    return threading.Thread(target=wake, daemon=True)


def label(name: str, source: ThermalSource) -> str:
    """The name asked for, and what `auto` resolved to."""
    return name if source.name.startswith(name) else f"{name} -> {source.name}"


def micro(seconds: float) -> str:
    return f"{seconds * 1e6:12.1f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", default="sim,replay,auto", help="comma list of sources")
    parser.add_argument("--seconds", type=float, default=5.0, help="idle measurement per source")
    parser.add_argument("--samples", type=int, default=200, help="reads per cost measurement")
    args = parser.parse_args()

    stop = threading.Event()
    costs = [
        ("baseline: python function", *per_sample(CallableSource(lambda: 50.0).read, args.samples)),
        (
            "baseline: process per reading",
            *per_sample(lambda: subprocess.run(["true"], check=False), args.samples),
        ),
    ]
    shares = [
        ("baseline: no monitor", *idle_share(None, args.seconds)),
        ("baseline: bare 1 Hz thread", *idle_share(bare_thread(stop), args.seconds)),
    ]
    stop.set()
    with tempfile.TemporaryDirectory() as tmp:
        curve = Path(tmp) / "curve.csv"
        curve.write_text("0,60\n1,70\n2,80\n")
        for name in filter(None, (n.strip() for n in args.sources.split(","))):
            # One source at a time, so a tool process only counts against its own source.
            try:
                source = open_source(f"replay:{curve}" if name == "replay" else name)
            except (SourceSpecError, SourceUnavailable) as exc:
                print(f"skipping {name}: {exc}")
                continue
            with source:
                costs.append((label(name, source), *per_sample(source.read, args.samples)))
                monitor = ThermalMonitor(poll_interval=1.0, source=source)
                shares.append(
                    ("monitor over " + label(name, source), *idle_share(monitor, args.seconds))
                )

    print(f"cost per sample ({args.samples} reads)      wall            CPU")
    for text, wall, cpu in costs:
        print(f"  {text:38s}{micro(wall)}{micro(cpu)}")
    print(f"\nidle CPU over {args.seconds:g} s at 1 Hz               CPU s      share of 1 CPU")
    for text, used, share in shares:
        print(f"  {text:38s}{used:10.4f} s {share:12.3%}")


if __name__ == "__main__":
    main()
