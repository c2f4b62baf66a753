"""A fine-tune-like load that follows the thermal plant's clock (bench_cooling.py runs it under
`agent run`): it computes without pause, like a training loop driving the GPU, and credits its
work at the rate the plant's clock allows (`clock_factor` from $MLX_FLEET_PLANT_STATE,
agent.thermal.plant). Its work is counted as the time it ran or waited to run
(/proc/self/schedstat, the same demand that heats the plant) times the clock factor then: what it
would have done on the Mac the plant models, not what a crowded 2-core machine granted it.
Where schedstat is missing it counts CPU time. Full speed is 1 unit of work per second.

    python bench/plant_load.py SECONDS PROGRESS_FILE

Every 50 ms it writes {"pid", "work", "demand_s", "wall_s"} to PROGRESS_FILE (atomically); it
ends SECONDS of wall time after it started, however long it was stopped.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from agent.thermal.plant import read_plant_state

CHUNK_S = 0.002  # computing between two looks at the clock: well under the pace tier's slices
REPORT_S = 0.05
CLOCK_REFRESH_S = 0.02


def demand_s() -> float:
    """This (single-threaded) process's time on a CPU plus waiting for one, in seconds."""
    try:
        fields = Path("/proc/thread-self/schedstat").read_bytes().split()
        return (int(fields[0]) + int(fields[1])) / 1e9
    except (OSError, ValueError, IndexError):
        return time.process_time()


def report(path: Path, work: float, demand: float, began: float) -> None:
    partial = path.with_suffix(".partial")
    data = {"pid": os.getpid(), "work": work, "demand_s": demand, "wall_s": time.time() - began}
    partial.write_text(json.dumps(data))
    os.replace(partial, path)


def main() -> None:
    seconds, progress = float(sys.argv[1]), Path(sys.argv[2])
    began, work, factor = time.time(), 0.0, 1.0
    last_demand = demand_s()
    next_report = next_clock = 0.0
    accumulator = 1
    while (now := time.time()) - began < seconds:
        if now >= next_clock:
            state = read_plant_state()
            factor = float(state["clock_factor"]) if state else factor  # type: ignore[arg-type]
            next_clock = now + CLOCK_REFRESH_S
        until = time.perf_counter() + CHUNK_S
        while time.perf_counter() < until:
            accumulator = (accumulator * 1_103_515_245 + 12_345) % 2**31  # the computing
        demand = demand_s()
        work += (demand - last_demand) * factor
        last_demand = demand
        if now >= next_report:
            report(progress, work, demand, began)
            next_report = now + REPORT_S
    report(progress, work, last_demand, began)


if __name__ == "__main__":
    main()
