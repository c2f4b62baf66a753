"""Which cooling policy gets the most work out of a fanless Mac held under its throttle point?
The same fine-tune-like load under `agent run` on the fanless thermal plant (sim:plant:air),
under each policy at the same cap, rounds interleaved:

- none: no policy acts (thresholds above anything the plant reaches): the firmware throttles;
- pause: the pause tier at the calibrated cap (pause at the onset, reduce 5 °C under it, as
  `agent calibrate` sets it: shared.cooling.throttle_point.calibrated_thresholds);
- pace: the pace tier at the same cap, when this checkout has it.

The load (bench/plant_load.py) computes without pause and credits work at the plant's clock
factor, so a throttled clock does proportionally less; the plant is heated by its real duty cycle
(agent/sensors/job_load.py), so a stopped load adds no heat. The cap is the plant's throttle
onset, its firmware's limit (what `agent calibrate` finds on it). Each run starts the plant 5 °C
under the cap (a Mac already warm), and is measured after its first third (the transient).

Printed per policy: work per wall second (1.0 is the load at full clock, never stopped), the
share of the plant's time throttled, the hottest die reading, the longest single stop of the
load's process (its state T in /proc, looked at every 10 ms), and the plant's analytic best work
rate under the cap with the clock never lowered (what stopping and continuing can reach at
best) beside the best with the firmware's DVFS (what throttling reaches). The plant's time runs
`--speed` times the wall's (labelled); stops are wall seconds, the job's own.

    python bench/bench_cooling.py [--seconds 60] [--speed 10] [--poll-interval 0.1]
                                  [--repeats 3] [--quick]

The plant's firmware looks every plant second; at the defaults `agent run` reads the plant every
plant second too (0.1 s x 10), as it reads a real Mac at its 1 s poll: a faster plant would
handicap every policy against the firmware.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from support import BenchError, interleave, machine, parser, round_count, run, spread

from agent.thermal.plant import PLANT_STATE_ENV, read_plant_state
from shared.cooling.plant import PRESETS, best_work_rate, plant_spec, unthrottled_optimum
from shared.io.paths import HOME_ENV

LOAD = Path(__file__).with_name("plant_load.py")
PLANT = PRESETS["air"]
CAP_C = PLANT.limit_c
"""The calibrated cap: the plant's throttle onset is its firmware's limit."""
REDUCE_BELOW_C = 5.0
START_BELOW_C = 5.0
"""Each run starts the plant this far under the cap: a Mac warm, at its reduce threshold."""
STOP_ABOVE_C = 5.0
WATCH_S = 0.01
HELD_THROTTLED = 0.05
"""A policy holds the cap when the plant spent at most this share of its time throttled."""
NEVER = ("--max-speed-temp", "140", "--pause-temp", "145", "--stop-temp", "150")
"""Thresholds the plant never reaches: its firmware holds the die near its limit."""
CALIBRATED = (
    "--max-speed-temp",
    f"{CAP_C - REDUCE_BELOW_C:g}",
    "--pause-temp",
    f"{CAP_C:g}",
    "--stop-temp",
    f"{CAP_C + STOP_ABOVE_C:g}",
)


@dataclass(frozen=True)
class Outcome:
    work_rate: float
    throttled: float
    max_c: float
    longest_stop_s: float

    def figures(self) -> tuple[float, ...]:
        return (self.work_rate, self.throttled, self.max_c, self.longest_stop_s)


def snapshot(progress: Path, plant: Path) -> tuple[float, dict[str, float]] | None:
    """(the load's work, the plant's state) now; None while either is not there yet."""
    state = read_plant_state(plant)
    try:
        work = float(json.loads(progress.read_text())["work"])
    except (OSError, ValueError, KeyError):
        return None
    return (work, state) if state else None  # type: ignore[return-value]


def process_state(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[0]


def measure(flags: tuple[str, ...], seconds: float, speed: float, poll: float) -> Outcome:
    """One run of the load under `agent run` with `flags`; its figures after the warm-up."""
    with tempfile.TemporaryDirectory(prefix="bench-cooling-") as folder:
        root = Path(folder)
        progress, plant = root / "progress.json", root / "plant.json"
        spec = plant_spec(PLANT.__class__(**{**PLANT.__dict__, "speed": speed}))
        spec += f",start_c={CAP_C - START_BELOW_C:g}"
        env = {**os.environ, HOME_ENV: str(root / "home"), PLANT_STATE_ENV: str(plant)}
        command = [
            *(sys.executable, "-m", "agent", "run", "--thermal-source", spec),
            *("--poll-interval", str(poll), *flags, "--"),
            *(sys.executable, str(LOAD), str(seconds), str(progress)),
        ]
        with open(root / "agent-run.log", "w+", encoding="utf-8") as log:
            process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True
            )
            outcome = watch(process, progress, plant, seconds)
            if process.wait(timeout=60) != 0:
                log.seek(0)
                raise BenchError(f"agent run exited {process.returncode}: {log.read()[-800:]}")
    return outcome


def watch(process: subprocess.Popen[bytes], progress: Path, plant: Path, seconds: float) -> Outcome:
    """Looks at the load's process state every WATCH_S and the plant's file as it changes,
    until the load's end; the figures between a third of the way and just before the end."""
    began = time.monotonic()
    warm_at, end_at = began + seconds / 3, began + seconds - 0.3
    first = last = None
    pid: int | None = None
    stopped_since: float | None = None
    longest = max_c = 0.0
    while process.poll() is None and time.monotonic() < end_at:
        now = time.monotonic()
        if pid is None:
            with contextlib.suppress(OSError, ValueError, KeyError):  # not written yet
                pid = int(json.loads(progress.read_text())["pid"])
        elif process_state(pid) == "T":
            stopped_since = stopped_since or now
            longest = max(longest, now - stopped_since)
        else:
            stopped_since = None
        if now >= warm_at:
            taken = snapshot(progress, plant)
            if taken is not None:
                first = first or (now, taken)
                last = (now, taken)
                max_c = max(max_c, float(taken[1]["celsius"]))
        time.sleep(WATCH_S)
    if first is None or last is None or last[0] - first[0] < seconds / 4:
        raise BenchError("the load or the plant reported nothing to measure over")
    (t0, (work0, plant0)), (t1, (work1, plant1)) = first, last
    plant_s = plant1["plant_time_s"] - plant0["plant_time_s"]
    throttled = (plant1["throttled_s"] - plant0["throttled_s"]) / plant_s if plant_s else 0.0
    return Outcome((work1 - work0) / (t1 - t0), throttled, max_c, longest)


def pace_flags() -> tuple[str, ...] | None:
    """The pace tier's options at the cap, where this checkout's `agent run` has them."""
    help_text = subprocess.run(
        [sys.executable, "-m", "agent", "run", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    ).stdout
    if "--pace-temp" not in help_text:
        return None
    return (*CALIBRATED, "--pace-temp", f"{CAP_C:g}")


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument("--seconds", type=float, default=None, help="wall seconds per run")
    cli.add_argument("--speed", type=float, default=10.0, help="plant seconds per wall second")
    cli.add_argument("--poll-interval", type=float, default=0.1, help="agent run's poll, s")
    opts = cli.parse_args()
    seconds = opts.seconds or (20.0 if opts.quick else 60.0)
    policies: dict[str, tuple[str, ...]] = {"none": NEVER, "pause": CALIBRATED}
    pace = pace_flags()
    if pace is not None:
        policies["pace"] = pace
    print(f"machine: {machine()}")
    print(
        f"plant {plant_spec(PLANT)} at plant time x{opts.speed:g} (simulated), cap {CAP_C:g} °C, "
        f"agent run --poll-interval {opts.poll_interval:g} s, {seconds:g} s runs"
        + ("" if pace else "; no pace tier in this checkout: none and pause only")
    )
    rounds = interleave(
        {
            name: lambda flags=flags: measure(
                flags, seconds, opts.speed, opts.poll_interval
            ).figures()
            for name, flags in policies.items()
        },
        round_count(opts, 3),
    )
    unthrottled = unthrottled_optimum(PLANT, CAP_C)
    throttled_best, clock = best_work_rate(PLANT, CAP_C)
    print(
        f"analytic best under {CAP_C:g} °C: {unthrottled:.3f} with the clock never lowered "
        f"(duty-cycled at the top clock), {throttled_best:.3f} with the firmware's DVFS "
        f"(clock {clock:.2f} of the top)"
    )
    print(f"{'policy':<7} {'work/s':>20} {'throttled %':>22} {'max °C':>24} {'longest stop s':>22}")
    for name in policies:
        print(
            f"{name:<7} {spread(rounds.figures(name, 0), digits=3):>20} "
            f"{spread(rounds.figures(name, 1), 100, 1):>22} "
            f"{spread(rounds.figures(name, 2), digits=1):>24} "
            f"{spread(rounds.figures(name, 3)):>22}"
        )
    held = [name for name in policies if max(rounds.figures(name, 1)) <= HELD_THROTTLED]
    print(
        f"held under the cap (throttled <= {HELD_THROTTLED:.0%} in every round): "
        f"{', '.join(held) or 'none of them'}; a stop is wall seconds, and a pause lasts whole "
        f"polls ({opts.poll_interval:g} s here, 1 s at agent run's default on a Mac)"
    )
    base = "pace" if pace is not None else "pause"
    print(
        f"{base}/optimum (clock never lowered): "
        f"{spread([w / unthrottled for w in rounds.figures(base, 0)], digits=3)}"
    )
    stop = max(rounds.figures(base, 3))
    if pace is None:
        print(
            "SUMMARY work pace/none unavailable (no pace tier), "
            f"pause/none {spread(rounds.ratios('pause', 'none', 0), digits=3)}, "
            f"throttled pause {spread(rounds.figures('pause', 1), 100, 1)} % "
            f"none {spread(rounds.figures('none', 1), 100, 1)} %, longest stop {stop:.2f} s"
        )
        return
    print(
        f"SUMMARY work pace/none {spread(rounds.ratios('pace', 'none', 0), digits=3)}, "
        f"pace/pause {spread(rounds.ratios('pace', 'pause', 0), digits=3)}, "
        f"pace/optimum {spread([w / unthrottled for w in rounds.figures('pace', 0)], digits=3)}, "
        f"throttled pace {spread(rounds.figures('pace', 1), 100, 1)} % "
        f"none {spread(rounds.figures('none', 1), 100, 1)} %, longest stop {stop:.2f} s"
    )


if __name__ == "__main__":
    run(main)
