"""What watching the temperature costs: per sample, and as a share of one CPU while idle at 1 Hz.

Each source is printed beside two baselines: a plain Python function (the floor) and spawning
one process per reading (what the seed did with `sudo powermetrics -n 1`, here with `true`, which
is cheaper than powermetrics, so the real difference is larger). CPU is process CPU time
(time.process_time, all threads) plus the CPU of any tool process the source runs.

    .venv/bin/python bench/bench_thermal.py [--sources sim,replay,auto] [--seconds 5]
        [--repeats 3] [--quick]

Every source and baseline is measured in every round, the rounds interleave them; figures are
median (min–max) over the rounds.
"""

from __future__ import annotations

import resource
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import psutil
from support import interleave, machine, parser, run, spread

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


def bare_share(seconds: float) -> float:
    stop = threading.Event()
    thread = bare_thread(stop)
    share = idle_share(thread, seconds)[1]
    stop.set()
    thread.join()
    return share


def main() -> None:
    args = parser(__doc__.splitlines()[0])
    args.add_argument("--sources", default="sim,replay,auto", help="comma list of sources")
    args.add_argument("--seconds", type=float, default=5.0, help="idle measurement per source")
    args.add_argument("--samples", type=int, default=200, help="reads per cost measurement")
    opts = args.parse_args()
    if opts.quick:
        opts.sources, opts.seconds, opts.samples = "sim,replay", 0.5, 20
    repeats = opts.repeats or (1 if opts.quick else 3)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        curve = Path(tmp) / "curve.csv"
        curve.write_text("0,60\n1,70\n2,80\n")
        sources = {}
        for name in filter(None, (n.strip() for n in opts.sources.split(","))):
            try:
                source = open_source(f"replay:{curve}" if name == "replay" else name)
            except (SourceSpecError, SourceUnavailable) as exc:
                print(f"skipping {name}: {exc}")
                continue
            sources[label(name, source)] = stack.enter_context(source)
        cpu: dict[str, list[float]] = {}

        def cost(name: str, read: Callable[[], object]) -> Callable[[], float]:
            def measure() -> float:
                wall, used = per_sample(read, opts.samples)
                cpu.setdefault(name, []).append(used)
                return wall

            return measure

        readers: dict[str, Callable[[], object]] = {
            "baseline: python function": CallableSource(lambda: 50.0).read,
            "baseline: process per reading": lambda: subprocess.run(["true"], check=False),
        }
        readers |= {name: source.read for name, source in sources.items()}
        costs = interleave({name: cost(name, read) for name, read in readers.items()}, repeats)
        # One monitor at a time, so a tool process only counts against its own source.
        idles: dict[str, Callable[[], float]] = {
            "baseline: no monitor": lambda: idle_share(None, opts.seconds)[1],
            "baseline: bare 1 Hz thread": lambda: bare_share(opts.seconds),
        }

        def watched(source: ThermalSource) -> float:
            return idle_share(ThermalMonitor(poll_interval=1.0, source=source), opts.seconds)[1]

        for name, source in sources.items():
            idles["monitor over " + name] = partial(watched, source)
        shares = interleave(idles, repeats)
    print(f"machine: {machine()}; {repeats} interleaved rounds")
    print(f"cost per sample ({opts.samples} reads a round)  {'wall µs':>22} {'CPU µs':>22}")
    for name in readers:
        print(
            f"  {name:38s}{spread(costs.values[name], 1e6, 1):>22} {spread(cpu[name], 1e6, 1):>22}"
        )
    print(f"\nidle CPU over {opts.seconds:g} s at 1 Hz        {'% of one CPU':>22}")
    for name in idles:
        print(f"  {name:38s}{spread(shares.values[name], 100, 3):>22}")


if __name__ == "__main__":
    run(main)
