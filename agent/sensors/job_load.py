"""How hard the job ran between two calls: what drives the thermal plant (agent.thermal.plant).

The job is the process trees the plant is told of: every descendant of the process that opened
it (`agent run`'s CMD, when `agent run` reads the plant itself; `agent calibrate`'s load; a
benchmark's children), and the trees rooted at the pids `roots()` names (the agent daemon's
supervised jobs). The process that reads is never counted: its own sampling is not the job.

Each task's demand is its time on a CPU plus, on Linux, its time runnable but waiting for one
(/proc/PID/task/TID/schedstat, fields 1 and 2: Documentation/scheduler/sched-stats.rst). A busy
job on a crowded 2-core machine is granted less CPU than it asks for, but its demand is the
same, so the plant heats the same: the job's duty cycle, not the machine's contention. A
stopped (SIGSTOP) task is neither running nor runnable: no demand, no heat. Where schedstat is
missing (macOS) the demand is CPU time alone (psutil), which a crowded machine lowers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

PROC = Path("/proc")

TaskKey = tuple[int, float, int]
"""(pid, the process's create time, tid): a reused pid is a new task."""


def task_demand_ns(pid: int) -> dict[int, int] | None:
    """Each thread's (on-CPU + runqueue-wait) nanoseconds from schedstat; None where the kernel
    has none (not Linux, or the process is gone)."""
    try:
        tids = os.listdir(PROC / str(pid) / "task")
    except OSError:
        return None
    demand: dict[int, int] = {}
    for tid in tids:
        try:
            fields = (PROC / str(pid) / "task" / tid / "schedstat").read_bytes().split()
            demand[int(tid)] = int(fields[0]) + int(fields[1])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended between the listing and the read
    return demand or None


class JobLoad:
    """Each call: the job's demand since the previous call, in CPU-seconds (a job that kept one
    thread busy for the whole interval gives the interval's length). The first call only
    starts counting."""

    def __init__(self, roots: Callable[[], Iterable[int]] = tuple, own_pid: int | None = None):
        self.roots = roots
        """The pids of more job process trees (settable: the daemon names its jobs once open)."""
        self._own_pid = os.getpid() if own_pid is None else own_pid
        self._last: dict[TaskKey, float] | None = None

    def __call__(self) -> float:
        now = self._sample()
        last, self._last = self._last, now
        if last is None:
            return 0.0
        # a task first seen now ran only since the previous call (it was not there then)
        return sum(seconds - last.get(key, 0.0) for key, seconds in now.items())

    def processes(self) -> list[psutil.Process]:
        """The job's processes now: the reader's descendants and the named roots' trees."""
        found: dict[int, psutil.Process] = {}
        with contextlib.suppress(psutil.Error):
            found.update((p.pid, p) for p in psutil.Process(self._own_pid).children(True))
        for pid in self.roots():
            try:
                root = psutil.Process(pid)
                found.setdefault(pid, root)
                found.update((p.pid, p) for p in root.children(True))
            except psutil.Error:
                continue  # ended: its last interval's demand is lost, as a gone job's is
        found.pop(self._own_pid, None)
        return list(found.values())

    def _sample(self) -> dict[TaskKey, float]:
        sample: dict[TaskKey, float] = {}
        for process in self.processes():
            try:
                born = process.create_time()
                demand = task_demand_ns(process.pid)
                if demand is None:
                    times = process.cpu_times()
                    sample[(process.pid, born, 0)] = times.user + times.system
                    continue
            except psutil.Error:
                continue
            for tid, nanoseconds in demand.items():
                sample[(process.pid, born, tid)] = nanoseconds / 1e9
        return sample
