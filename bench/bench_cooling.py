"""Which cooling policy gets the most work out of a fanless Mac held under its throttle point?
The same fine-tune-like load under `agent run` on the fanless thermal plant (sim:plant:air),
under each policy at the same cap, rounds interleaved:

- none: no policy acts (thresholds above anything the plant reaches): the firmware throttles;
- pause: the pause tier holding the same cap, as a lab would set it to prevent throttling
  (pause_rule): it pauses one margin under the cap, the larger of the die's rise over one poll
  at full speed and the pace tier's margin (shared.cooling.pace.PACE_MARGIN_C), so both aim at
  the same set point, and resumes one poll's rise under that: a pause lasts a poll or more.
  Pausing at the onset itself would act only once the firmware throttled;
- pace: the pace tier at the same cap.

The load (bench/plant_load.py) computes without pause and credits work at the plant's clock
factor, so a throttled clock does proportionally less; the plant is heated by its real duty cycle
(agent/sensors/job_load.py), so a stopped load adds no heat. The cap is the plant's throttle
onset, its firmware's limit (what `agent calibrate` finds on it). Each run starts the plant 5 °C
under the cap (a Mac already warm), and is measured after its first third (the transient).

Printed per policy: work per wall second (1.0 is the load at full clock, never stopped), the
share of the plant's time throttled, the hottest die reading, the longest single stop of the
load's process (its state T in /proc, looked at every 10 ms), and the plant's analytic best work
rate under the cap with the clock never lowered (what stopping and continuing can reach at
best) beside the best with the firmware's DVFS (what throttling reaches).

Time scale: the plant's time runs `--speed` times the wall's (labelled), and the settings are
the Mac's scaled by it, so a stop lasts as long against the die as it would on a Mac: agent run
polls every plant second (0.1 s x 10, a Mac's 1 s poll; the firmware also looks every plant
second), and paces in slices of a Mac's 0.2 s in plant time where agent run allows it (at most
x4: its shortest slice is 0.05 s; at x10 the slices are 0.5 plant s). A stop is printed in plant
seconds (what a Mac would see: issue 41's "no stop of 1 s") and in wall seconds (what was
measured); a pause lasts whole polls. The pace controller integrates in the plant's time (the
reading's die_time), so it settles in as many plant seconds as on a Mac whatever `--speed`.

    python bench/bench_cooling.py [--seconds 60] [--speed 10] [--repeats 3] [--quick]
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from support import BenchError, interleave, machine, parser, round_count, run, spread

from agent.thermal.plant import PLANT_STATE_ENV, read_plant_state
from shared.cooling.pace import PACE_MARGIN_C, PACE_SLICE_S, SLICE_RANGE_S
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
MAC_POLL_S = 1.0
"""agent run's poll on a Mac; the bench polls the plant every MAC_POLL_S plant seconds."""
WATCH_S = 0.01
HELD_THROTTLED = 0.05
"""A policy holds the cap when the plant spent at most this share of its time throttled."""
NEVER = ("--max-speed-temp", "140", "--pause-temp", "145", "--stop-temp", "150")
"""Thresholds the plant never reaches: its firmware holds the die near its limit."""


def rise_per_poll(poll_s: float) -> float:
    """°C the die rises over one poll (plant seconds) at full speed from the cap: the plant's
    heating rate there times the poll (the exact RC step)."""
    hottest = PLANT.steady_c(len(PLANT.states) - 1, 1.0)
    return (hottest - CAP_C) * (1 - math.exp(-poll_s / PLANT.tau_s))


def pause_rule(poll_s: float) -> tuple[float, float]:
    """(pause_temp, hysteresis) that hold CAP_C with a poll of `poll_s` plant seconds: pause
    one margin under the cap, the larger of one poll's rise at full speed (so a reading just
    under pause_temp is not followed by one over the cap) and the pace tier's margin
    (PACE_MARGIN_C: both tiers then aim at the same set point); resume one poll's rise under
    pause_temp, so a pause outlasts a single poll's cooling."""
    rise = rise_per_poll(poll_s)
    return CAP_C - max(rise, PACE_MARGIN_C), rise


def thresholds(pause_temp: float, *more: str) -> tuple[str, ...]:
    return (
        *("--max-speed-temp", f"{CAP_C - REDUCE_BELOW_C:g}", "--pause-temp", f"{pause_temp:g}"),
        *("--stop-temp", f"{CAP_C + STOP_ABOVE_C:g}", *more),
    )


@dataclass(frozen=True)
class Outcome:
    work_rate: float
    throttled: float
    max_c: float
    longest_stop_s: float

    def figures(self) -> tuple[float, ...]:
        return (self.work_rate, self.throttled, self.max_c, self.longest_stop_s)


def snapshot(progress: Path, plant: Path) -> tuple[float, float, dict[str, float]] | None:
    """(the load's work, the load's clock when it wrote it, the plant's state) now; None while
    either is not there yet. The load writes nothing while stopped: its work is taken at its
    own clock, so a stop around a snapshot shifts the window without biasing the rate (a pause
    lasts polls: its stale progress would otherwise count a stop's time without its work)."""
    state = read_plant_state(plant)
    try:
        data = json.loads(progress.read_text())
        work, at = float(data["work"]), float(data["wall_s"])
    except (OSError, ValueError, KeyError):
        return None
    return (work, at, state) if state else None  # type: ignore[return-value]


def process_state(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[0]


def measure(flags: tuple[str, ...], seconds: float, speed: float) -> Outcome:
    """One run of the load under `agent run` with `flags`; its figures after the warm-up."""
    with tempfile.TemporaryDirectory(prefix="bench-cooling-") as folder:
        root = Path(folder)
        progress, plant = root / "progress.json", root / "plant.json"
        spec = plant_spec(PLANT.__class__(**{**PLANT.__dict__, "speed": speed}))
        spec += f",start_c={CAP_C - START_BELOW_C:g}"
        env = {**os.environ, HOME_ENV: str(root / "home"), PLANT_STATE_ENV: str(plant)}
        command = [
            *(sys.executable, "-m", "agent", "run", "--thermal-source", spec),
            *("--poll-interval", f"{MAC_POLL_S / speed:g}", *flags, "--"),
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
                max_c = max(max_c, float(taken[2]["celsius"]))
        time.sleep(WATCH_S)
    if first is None or last is None or last[0] - first[0] < seconds / 4:
        raise BenchError("the load or the plant reported nothing to measure over")
    (_, (work0, at0, plant0)), (_, (work1, at1, plant1)) = first, last
    plant_s = plant1["plant_time_s"] - plant0["plant_time_s"]
    throttled = (plant1["throttled_s"] - plant0["throttled_s"]) / plant_s if plant_s else 0.0
    return Outcome((work1 - work0) / (at1 - at0), throttled, max_c, longest)


def pace_slice(speed: float) -> float:
    """The pace slice in wall seconds: a Mac's default in plant time, or agent run's shortest
    where the plant runs faster than that allows."""
    return max(PACE_SLICE_S / speed, SLICE_RANGE_S[0])


def pace_flags(speed: float) -> tuple[str, ...] | None:
    """The pace tier's options at the cap, its slice a Mac's in plant time, where this
    checkout's `agent run` has them."""
    help_text = subprocess.run(
        [sys.executable, "-m", "agent", "run", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        check=False,
    ).stdout
    if "--pace-temp" not in help_text:
        return None
    slice_flag = ("--pace-slice", f"{pace_slice(speed):g}")
    return thresholds(CAP_C, "--pace-temp", f"{CAP_C:g}", *slice_flag)


def main() -> None:
    cli = parser(__doc__)
    cli.add_argument("--seconds", type=float, default=None, help="wall seconds per run")
    cli.add_argument("--speed", type=float, default=10.0, help="plant seconds per wall second")
    opts = cli.parse_args()
    seconds = opts.seconds or (6.0 if opts.quick else 60.0)
    if not 1 <= opts.speed <= 60:
        raise BenchError(f"--speed must be 1 to 60 plant seconds a wall second, got {opts.speed:g}")
    pace = pace_flags(opts.speed)
    if pace is None:
        raise BenchError("this checkout's agent run has no pace tier (--pace-temp)")
    pause_temp, hysteresis = pause_rule(MAC_POLL_S)
    policies = {
        "none": NEVER,
        "pause": thresholds(pause_temp, "--hysteresis", f"{hysteresis:.3g}"),
        "pace": pace,
    }
    print(f"machine: {machine()}")
    print(
        f"plant {plant_spec(PLANT)} at plant time x{opts.speed:g} (simulated), cap {CAP_C:g} °C, "
        f"a poll every {MAC_POLL_S:g} plant s ({MAC_POLL_S / opts.speed:g} s), "
        f"{seconds:g} s runs ({seconds * opts.speed:g} plant s)"
    )
    print(
        f"pause tier: pause at {pause_temp:.2f} °C, resume under {pause_temp - hysteresis:.2f} °C "
        f"(the die rises {rise_per_poll(MAC_POLL_S):.3f} °C a poll at full speed at the cap); "
        f"pace tier: cap {CAP_C:g} °C, slices of {pace_slice(opts.speed) * opts.speed:g} plant s "
        f"({pace_slice(opts.speed):g} s; a Mac's are {PACE_SLICE_S:g} s)"
    )
    rounds = interleave(
        {
            name: lambda flags=flags: measure(flags, seconds, opts.speed).figures()
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
    print(f"{'policy':<7} {'work/s':>20} {'throttled %':>19} {'max °C':>22} {'longest stop':>24}")
    for name in policies:
        stops = [s * opts.speed for s in rounds.figures(name, 3)]
        print(
            f"{name:<7} {spread(rounds.figures(name, 0), digits=3):>20} "
            f"{spread(rounds.figures(name, 1), 100, 1):>19} "
            f"{spread(rounds.figures(name, 2), digits=2):>22} "
            f"{spread(stops):>19} pl.s"
        )
    held = [name for name in policies if max(rounds.figures(name, 1)) <= HELD_THROTTLED]
    print(
        f"held under the cap (throttled <= {HELD_THROTTLED:.0%} in every round): "
        f"{', '.join(held) or 'none of them'}; a stop in plant seconds (pl.s, as on a Mac) is "
        f"the wall's x{opts.speed:g}: longest pause {max(rounds.figures('pause', 3)):.3f} s, "
        f"pace {max(rounds.figures('pace', 3)):.3f} s of wall time"
    )
    print(
        "pace/optimum (clock never lowered): "
        f"{spread([w / unthrottled for w in rounds.figures('pace', 0)], digits=3)}, "
        f"pause/optimum {spread([w / unthrottled for w in rounds.figures('pause', 0)], digits=3)}"
    )
    stop = max(rounds.figures("pace", 3)) * opts.speed
    print(
        f"SUMMARY work pace/none {spread(rounds.ratios('pace', 'none', 0), digits=3)}, "
        f"pace/pause {spread(rounds.ratios('pace', 'pause', 0), digits=3)}, "
        f"pace/optimum {spread([w / unthrottled for w in rounds.figures('pace', 0)], digits=3)}, "
        f"throttled pace {spread(rounds.figures('pace', 1), 100, 1)} % "
        f"pause {spread(rounds.figures('pause', 1), 100, 1)} % "
        f"none {spread(rounds.figures('none', 1), 100, 1)} %, longest stop {stop:.2f} s "
        "(plant seconds)"
    )


if __name__ == "__main__":
    run(main)
