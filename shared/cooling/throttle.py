"""Throttling as a state: the one rule that says, poll after poll, whether a Mac under load is
throttling, and why (its evidence: `GPU 1.10 GHz of 1.40 sustained`, `312 tok/s of 402`).

Two signals, either enough (docs/thermal.md, "Throttling"):
- the clock: the GPU's active frequency more than CLOCK_MARGIN below this Mac's sustained
  clock, while the GPU is busy (active for at least LOADED_GPU_ACTIVE of the poll: an idle GPU
  sits in a low state by choice, not by throttling);
- the work rate: the job's own rate (tok/s, it/s) more than RATE_MARGIN below its early best,
  the best of its first EARLY_READINGS readings (a cool Mac's speed; a running best would let
  one lucky burst set the bar).
Each signal must hold for POLLS polls in a row to count: one slow report (a validation pass, a
long batch) or one low clock reading (a DVFS step mid-interval) is not throttling. A poll with
neither signal (no busy GPU, no rate yet) has no verdict. The work rate arrives when the job
reports it (mlx_lm every `--steps-per-report` steps), so between two reports the rate signal
holds its last reading, counted once: a watch lives as long as one job.

The sustained clock: the Mac's calibration when it has one (`agent calibrate`), else the
highest GPU clock seen under load in this run (so the first loaded polls only set it).

Pure: the agent's telemetry, `agent run`, a benchmark cell's verdict, the sustained-run curve
and calibration all apply this rule, from live readings or from records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

CLOCK_MARGIN = 0.10
"""Throttling by clock: more than 10 % below the sustained clock. Apple GPUs under a steady load
hold their top DVFS state (residency-weighted averages sit within a few % of it); firmware
throttling steps several states down at once (docs/thermal.md, Throttling)."""
RATE_MARGIN = 0.15
"""Throttling by work rate: more than 15 % below the early best. Wider than the clock's: a
job's rate also moves with its batches (mlx_lm's tok/s follows the padded lengths of each
report's batches), and the throttled Macs of issue 41 lose 15–65 %."""
POLLS = 3
"""Polls in a row a signal must hold (3 s at the default 1 s poll; for the rate, 3 fresh
reports)."""
EARLY_READINGS = 5
"""The work rate's reference: the best of the job's first this many rate readings."""
LOADED_GPU_ACTIVE = 0.5
"""The GPU counts as under load when active for at least half the poll."""

CALIBRATED = "calibrated"
SEEN_UNDER_LOAD = "seen under load"


def _positive(value: float | None) -> float | None:
    """The value when it is a finite number above 0, else None (an unknown is never a zero)."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


@dataclass(frozen=True)
class ThrottlePoll:
    """What one poll brings: the GPU clock (Hz) and active share (0…1) when the machine reads
    them; the job's work rate when a fresh one came in this poll (`rate_unit`: tok/s, it/s)."""

    gpu_hz: float | None = None
    gpu_active: float | None = None
    rate: float | None = None
    rate_unit: str = "tok/s"

    @property
    def clock_loaded(self) -> bool:
        active = self.gpu_active
        return (
            _positive(self.gpu_hz) is not None
            and active is not None
            and math.isfinite(active)
            and active >= LOADED_GPU_ACTIVE
        )


@dataclass(frozen=True)
class ThrottleVerdict:
    """The rule's answer for one poll: `throttling` True/False under load, None without load
    (no verdict); `evidence` says what the signals read (`GPU 1.10 GHz of 1.40 sustained`,
    `312 tok/s of 402`), the throttling ones when it throttles."""

    throttling: bool | None
    evidence: tuple[str, ...] = ()
    low: bool = False
    """Whether a signal read below its margin this poll (throttling or on its way to it)."""

    @property
    def text(self) -> str | None:
        """The evidence as one line (`; ` between the signals), None without any."""
        return "; ".join(self.evidence) or None


@dataclass(frozen=True)
class ThrottleWatch:
    """The rule's memory between polls. `sustained_hz` and where it came from (CALIBRATED,
    SEEN_UNDER_LOAD); the work rate's early best and how many readings made it; how many polls
    in a row each signal has read low."""

    sustained_hz: float | None = None
    sustained_origin: str | None = None
    early_readings: int = EARLY_READINGS
    """How many first rate readings make the early best: EARLY_READINGS for reports and
    iterations; 1 for a sustained run's windows, each already seconds of work."""
    best_rate: float | None = None
    rates_seen: int = 0
    clock_low: int = 0
    rate_low: int = 0
    rate_text: str | None = None
    """The last rate reading's evidence, which a poll without a fresh one holds."""

    @classmethod
    def start(
        cls, calibrated_hz: float | None = None, early_readings: int = EARLY_READINGS
    ) -> ThrottleWatch:
        """A watch for a run: with the Mac's calibrated sustained clock when it has one."""
        hz = _positive(calibrated_hz)
        return cls(hz, CALIBRATED if hz else None, max(1, early_readings))

    def observe(self, poll: ThrottlePoll) -> tuple[ThrottleWatch, ThrottleVerdict]:
        """The watch after `poll`, and the verdict for it."""
        watch, clock = self._clock(poll)
        watch, rate = watch._rate(poll)
        signals = [s for s in (clock, rate) if s is not None]
        if not signals:
            return watch, ThrottleVerdict(None)
        low = any(count > 0 for count, _ in signals)
        throttled = tuple(text for count, text in signals if count >= POLLS)
        if throttled:
            return watch, ThrottleVerdict(True, throttled, low)
        return watch, ThrottleVerdict(False, tuple(text for _, text in signals), low)

    def _clock(self, poll: ThrottlePoll) -> tuple[ThrottleWatch, tuple[int, str] | None]:
        """The clock signal: (polls in a row low, evidence), None when the GPU is not under
        load. A run without calibration first learns its sustained clock from loaded polls."""
        if not poll.clock_loaded:
            return replace(self, clock_low=0), None
        hz = float(poll.gpu_hz)  # type: ignore[arg-type]  # clock_loaded: a positive number
        watch = self
        if self.sustained_origin != CALIBRATED and (
            self.sustained_hz is None or hz > self.sustained_hz
        ):
            watch = replace(self, sustained_hz=hz, sustained_origin=SEEN_UNDER_LOAD)
        sustained = watch.sustained_hz
        assert sustained is not None
        low = watch.clock_low + 1 if hz < (1 - CLOCK_MARGIN) * sustained else 0
        return replace(watch, clock_low=low), (low, clock_evidence(hz, sustained))

    def _rate(self, poll: ThrottlePoll) -> tuple[ThrottleWatch, tuple[int, str] | None]:
        """The work-rate signal: (readings in a row low, evidence); without a fresh rate the
        last reading's, None before the first. The first EARLY_READINGS readings set the best
        and are never low."""
        rate = _positive(poll.rate)
        if rate is None:
            return self, None if self.rate_text is None else (self.rate_low, self.rate_text)
        if self.rates_seen < self.early_readings:
            best = max(rate, self.best_rate or 0.0)
            text = rate_evidence(rate, best, poll.rate_unit)
            watch = replace(self, best_rate=best, rates_seen=self.rates_seen + 1, rate_text=text)
            return watch, (0, text)
        best = self.best_rate
        assert best is not None
        low = self.rate_low + 1 if rate < (1 - RATE_MARGIN) * best else 0
        text = rate_evidence(rate, best, poll.rate_unit)
        return replace(self, rate_low=low, rate_text=text), (low, text)


def clock_evidence(hz: float, sustained_hz: float) -> str:
    """`GPU 1.10 GHz of 1.40 sustained`."""
    return f"GPU {hz / 1e9:.2f} GHz of {sustained_hz / 1e9:.2f} sustained"


def rate_evidence(rate: float, best: float, unit: str = "tok/s") -> str:
    """`312 tok/s of 402` (three significant figures at least: `4.1 it/s of 5.2`)."""
    return f"{_figure(rate)} {unit} of {_figure(best)}"


def _figure(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def judge(
    polls: Iterable[ThrottlePoll],
    calibrated_hz: float | None = None,
    early_readings: int = EARLY_READINGS,
) -> list[ThrottleVerdict]:
    """The verdict for each poll of a run, in order (a record's or a calibration's series)."""
    watch = ThrottleWatch.start(calibrated_hz, early_readings)
    verdicts = []
    for poll in polls:
        watch, verdict = watch.observe(poll)
        verdicts.append(verdict)
    return verdicts


def first_throttled(verdicts: Sequence[ThrottleVerdict]) -> int | None:
    """Where the run first throttled: the index of the first low poll of the first low stretch
    that the rule called throttling; None when it never did. A poll without a verdict breaks
    a stretch, as it breaks the rule's count."""
    start = None
    for index, verdict in enumerate(verdicts):
        if not verdict.low:
            start = None
            continue
        start = index if start is None else start
        if verdict.throttling:
            return start
    return None


def throttled_evidence(verdicts: Iterable[ThrottleVerdict]) -> str | None:
    """The evidence of the first throttling verdict among `verdicts`; None when none throttles."""
    return next((v.text for v in verdicts if v.throttling), None)


# --- a job's work as `agent run` states it, and the Mac's verdict from every signal -----------

WORK_UNITS = ("tok/s",)
"""The units a job's work rate is stated in (mlx_lm's reports, a step gate's tokens)."""
MAX_EVIDENCE = 200
"""Characters of one signal's evidence kept from a job's state: its figures, never more."""


def job_work(value: object) -> dict[str, object] | None:
    """A job's `work` map as `agent run` writes it in its state file (docs/protocol.md §12):
    {"rate": tok/s or nil, "unit", "time": when it was read or nil, "throttling": bool or nil,
    "evidence": text or nil}; None for anything else (a file being replaced, another
    version's), never a guess."""
    if not isinstance(value, dict) or value.get("unit") not in WORK_UNITS:
        return None
    rate, at, throttling = value.get("rate"), value.get("time"), value.get("throttling")
    evidence = value.get("evidence")
    if rate is not None and _positive(rate) is None:
        return None
    if at is not None and (_positive(at) is None):
        return None
    if throttling is not None and not isinstance(throttling, bool):
        return None
    if evidence is not None and not (
        isinstance(evidence, str) and len(evidence) <= MAX_EVIDENCE and evidence.isprintable()
    ):
        return None
    return {
        "rate": rate,
        "unit": value["unit"],
        "time": at,
        "throttling": throttling,
        "evidence": evidence,
    }


def work_verdict(work: dict[str, object] | None) -> ThrottleVerdict:
    """The verdict a job's work map states (no verdict without one)."""
    if work is None or work.get("throttling") is None:
        return ThrottleVerdict(None)
    evidence = work.get("evidence")
    return ThrottleVerdict(bool(work["throttling"]), (str(evidence),) if evidence else ())


def combined(verdicts: Iterable[tuple[str | None, ThrottleVerdict]]) -> ThrottleVerdict:
    """The Mac's verdict from its signals' (the clock's; each supervised job's work rate's,
    labelled `job ID`): throttling when any throttles, with their evidence; not throttling when
    any judged and none throttles; no verdict when none judged. Evidence reads `GPU 1.10 GHz of
    1.40 sustained; job 3f2a: 312 tok/s of 402`."""
    judged = [(label, v) for label, v in verdicts if v.throttling is not None]
    if not judged:
        return ThrottleVerdict(None)
    throttling = any(v.throttling for _, v in judged)
    shown = [(label, v) for label, v in judged if v.throttling or not throttling]
    evidence = tuple(
        f"{label}: {text}" if label else text for label, v in shown for text in v.evidence
    )
    return ThrottleVerdict(throttling, evidence, any(v.low for _, v in judged))
