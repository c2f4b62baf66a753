"""`agent doctor --load SECONDS`: every thermal and power source this OS may have, read at idle
and then under a loop of MLX matmuls, in this one process (sampled between iterations, no
thread), each judged by agent.doctor.load. Simulated sources (sim, replay) are no sensors and
are not checked."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

from agent.doctor.check import Check
from agent.doctor.load import CANNOT_TELL, Verdict, power_verdict, thermal_verdict, window_watts
from agent.sensors.base import Source, SourceUnavailable
from shared.cooling.sources import auto_order, power_auto_order

SAMPLE_INTERVAL_S = 0.5
IDLE_MAX_S = 3.0
"""Idle lasts as long as the load, at most this: enough readings for a mean, no long wait."""
MATMUL_SIZE = 512
STEP_S = 0.02
MAX_BATCH = 64
CALIBRATION_RUNS = 3
"""An iteration takes about STEP_S (a batch of up to MAX_BATCH matmuls): long enough that a
GPU is kept busy between two evaluations, short enough that reads stay on time."""
FIXES = {
    "thermal": "its degrees do not follow the work: pick another --thermal-source",
    "power": "its watts do not follow the work: pick another --power-source",
}


@dataclass
class Watched:
    """One open source and what it read in each window; `reason`: why the latest read gave
    nothing."""

    kind: str
    name: str
    source: Source
    idle: list[float] = field(default_factory=list)
    load: list[float] = field(default_factory=list)
    idle_energy: list[tuple[float, float | None]] = field(default_factory=list)
    load_energy: list[tuple[float, float | None]] = field(default_factory=list)
    reason: str | None = None

    def sample(self, under_load: bool) -> None:
        reading = self.source.read()
        if reading is None:
            self.reason = self.source.last_error
        elif self.kind == "power":
            energy = self.load_energy if under_load else self.idle_energy
            energy.append((reading.monotonic, reading.total_j))
        elif reading.celsius is None:
            pressure = f", only pressure {reading.pressure}" if reading.pressure else ""
            self.reason = f"{self.name}: no degrees{pressure}"
        else:
            (self.load if under_load else self.idle).append(reading.celsius)

    def verdict(self) -> Verdict:
        if self.kind == "thermal":
            return thermal_verdict(self.idle, self.load, self.reason)
        # The load's energy window opens at idle's last read, taken as the load began.
        idle_w = window_watts(self.idle_energy)
        load_w = window_watts(self.idle_energy[-1:] + self.load_energy)
        return power_verdict(idle_w, load_w, self.reason)

    def check(self) -> Check:
        found = self.verdict()
        fix = FIXES[self.kind] if CANNOT_TELL in found.detail else None
        return Check(f"load: {self.kind} {self.name}", found.ok, found.detail, fix)


def load_checks(seconds: float) -> list[Check]:
    """A `load` row saying what ran, then one row per source, in `auto`'s order (thermal, then
    power); a source that cannot open is a failed row with its reason."""
    try:
        step, size, device = mlx_step()
    except Exception as exc:  # whatever MLX raises, the row says it
        return [
            Check("load", False, f"no MLX load: {type(exc).__name__}: {exc}", "pip install mlx")
        ]
    idle_s = min(seconds, IDLE_MAX_S)
    with ExitStack() as stack:
        rows: list[Check | Watched] = [*open_all("thermal", stack), *open_all("power", stack)]
        watched = [row for row in rows if isinstance(row, Watched)]
        try:
            sample_for(idle_s, watched, False, None)
            iterations = sample_for(seconds, watched, True, step)
        except Exception as exc:  # MLX failing mid-loop: no figure is kept
            return [Check("load", False, f"the load failed: {type(exc).__name__}: {exc}")]
        ran = Check(
            "load",
            True,
            f"{seconds:g} s of {MATMUL_SIZE}x{MATMUL_SIZE} fp32 matmuls on {device} "
            f"({iterations} iterations, {size} at a time) after {idle_s:g} s idle, every "
            f"source read every {SAMPLE_INTERVAL_S:g} s",
        )
        return [ran, *(row.check() if isinstance(row, Watched) else row for row in rows)]


def open_all(kind: str, stack: ExitStack) -> list[Check | Watched]:
    """Every hardware source of `kind` this OS may have, opened (closed with `stack`), or a
    failed row saying why it cannot open."""
    from agent.power.registry import open_power_source
    from agent.thermal import open_source

    names = auto_order if kind == "thermal" else power_auto_order
    opener: Callable[..., Source] = open_source if kind == "thermal" else open_power_source
    rows: list[Check | Watched] = []
    for name in names(platform.system()):
        try:
            source = stack.enter_context(opener(name, interval_s=SAMPLE_INTERVAL_S))
        except SourceUnavailable as exc:
            reason = str(exc).split("; this machine")[0]
            rows.append(Check(f"load: {kind} {name}", False, f"unavailable: {reason}"))
            continue
        rows.append(Watched(kind, name, source))
    return rows


def sample_for(
    seconds: float, watched: list[Watched], under_load: bool, step: Callable[[], None] | None
) -> int:
    """Read every source every SAMPLE_INTERVAL_S and at the end of `seconds`, and at its start
    when idle (the load starts where idle's last read ended); between reads run `step` over and
    over (None: sleep). Returns how many steps ran."""
    started = time.monotonic()
    end = started + seconds
    steps = 0
    if not under_load:
        for source in watched:
            source.sample(under_load)
    following = started + SAMPLE_INTERVAL_S
    while (now := time.monotonic()) < end:
        due = min(following, end)
        if step is None:
            time.sleep(max(0.0, due - now))
        else:
            while time.monotonic() < due:
                step()
                steps += 1
        if time.monotonic() >= due:
            for source in watched:
                source.sample(under_load)
            following = due + SAMPLE_INTERVAL_S
    return steps


def mlx_step() -> tuple[Callable[[], None], int, str]:
    """One iteration of the load, compiled and run; the matrices it multiplies at once; the
    device it runs on. A fast device multiplies a batch of matrices per evaluation, so that
    waiting on each one does not leave it idle: about STEP_S of work per iteration."""
    import mlx.core as mx

    def batch(size: int) -> Callable[[], None]:
        x = mx.random.normal((size, MATMUL_SIZE, MATMUL_SIZE)) / MATMUL_SIZE**0.5

        def step() -> None:
            mx.eval(mx.matmul(x, x))

        step()  # kernels compile on first use
        return step

    one = batch(1)
    started = time.perf_counter()
    for _ in range(CALIBRATION_RUNS):
        one()
    each = (time.perf_counter() - started) / CALIBRATION_RUNS
    size = max(1, min(MAX_BATCH, round(STEP_S / max(each, 1e-9))))
    return (one if size == 1 else batch(size)), size, str(mx.default_device())
