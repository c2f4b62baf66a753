"""Per-job accounting for `agent run` (DCGM's job statistics, for a Mac): wall time, time paused
and why, time at each thermal pressure level, the hottest reading and where it came from,
energy when a meter measured it, and, from mlx_lm's training reports, tokens/s over time and
the throttle ratio.

Pure, so it is tested without a process or a clock: the supervisor feeds it readings, actions
and report lines, each with its time (epoch s), and asks for the summary at the end.

mlx_lm's reports, as mlx_lm/tuner/trainer.py prints them (read from the source: ml-explore/
mlx-lm's trainer.py at 00e8dc24 and the 0.31.0 wheel for the first, the installed 0.32.2's
trainer.py and cli_ui.py for the second; tests/fixtures/mlx_lm holds real output of each):
- up to 0.31 (print(..., flush=True) on rank 0), and its forks (mlx-lm-lora, ...):
  `Iter {it}: Train loss {train_loss:.3f}, Learning Rate {learning_rate:.3e}, It/sec
  {it_sec:.3f}, Tokens/sec {tokens_sec:.3f}, Trained Tokens {trained_tokens}, Peak mem
  {peak_mem:.3f} GB` and `Iter {it}: Val loss {val_loss:.3f}, Val took {val_time:.3f}s`
  (forks add fields, colour the loss, or write `Iter {it} (Opt {n}):`);
- 0.32 (mlx_lm/cli_ui.py's TrainUI.report_train/report_val, a rich console on stdout): the
  row `  {it:>4}    {train_loss:>5.3f} {▼|▲}    {tokens_sec:>5,.0f}    {trained_tokens /
  1000:>5.1f}k` under the header `iter   train_loss     tok/s     tokens`, and
  `  {it:>4}    val {val_loss:>5.3f}    {val_time:.2f}s`.
Tokens/sec is mlx_lm's own: the report's tokens over the time its steps took (perf_counter,
so a pause in the middle of a report's steps shows as a slower report).
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

THROTTLE_WINDOW_S = 120.0
"""The throttle ratio compares the reports of the last this-many seconds with the first's."""
MAX_SERIES_POINTS = 60
"""Points of the tokens/s series a summary keeps (buckets merged two by two beyond)."""
MAX_PAUSES_LISTED = 20
"""Pauses a summary lists one by one (the first ones); the count and the total are of all."""
MAX_REASON = 200
"""Characters of one pause's reason kept in a summary."""
DETAIL_LIMIT = 16_384
"""An event's detail at most (docs/protocol.md §12): the summary's JSON is made to fit."""
MAX_LINE = 68
"""Characters of a summary line, so that with `agent run`'s prefix it reads at 80 columns."""
NO_METER = "no agent serve with a power meter: agent run opens none"

PRESSURE_LEVELS = (
    "nominal",
    "fair",
    "moderate",
    "serious",
    "heavy",
    "trapping",
    "critical",
    "sleeping",
)
"""The levels a pressure source names (powermetrics': nominal ... sleeping; NSProcessInfo's:
nominal, fair, serious, critical), mildest first; any other value, or none, is `unknown`."""
UNKNOWN = "unknown"
PAUSE_ENDS = frozenset({"resume", "stop", "forward", "kill", "exit"})
"""What ends a pause: a resume, or the SIGCONT that comes with every way of stopping."""


# --- mlx_lm's report lines ----------------------------------------------------------------


@dataclass(frozen=True)
class TrainReport:
    """One report of mlx_lm's trainer: `kind` is `train` (tokens_per_s always set) or `val`
    (val_loss always set); a field the line did not give, or gave as no finite number, is None."""

    kind: str
    iteration: int
    tokens_per_s: float | None = None
    train_loss: float | None = None
    learning_rate: float | None = None
    it_per_s: float | None = None
    trained_tokens: int | None = None
    peak_mem_gb: float | None = None
    val_loss: float | None = None
    val_s: float | None = None


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-_]")
_ITER = re.compile(r"^\s*Iter (\d+)(?: \([^)]*\))?:\s*(.*)$")
_FIELD = re.compile(r"^([A-Za-z][A-Za-z /]*?)\s+(\S+?)\s*(GB|s)?$")
_ROW = re.compile(r"^\s*(\d+)\s+(\S+)\s+[▼▲]\s+([\d,]+(?:\.\d+)?)\s+([\d.]+)k\s*$")
_VAL_ROW = re.compile(r"^\s*(\d+)\s+val\s+(\S+)\s+([\d.]+)s\s*$")
_CLASSIC = {
    "train loss": "train_loss",
    "learning rate": "learning_rate",
    "it/sec": "it_per_s",
    "tokens/sec": "tokens_per_s",
    "trained tokens": "trained_tokens",
    "peak mem": "peak_mem_gb",
    "val loss": "val_loss",
    "val took": "val_s",
}


def _number(text: str) -> float | None:
    """A finite number, else None (nan, inf, a typo)."""
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def strip_ansi(text: str) -> str:
    """Without terminal escapes (colours, cursor moves): a trainer on a tty sends them."""
    return _ANSI.sub("", text)


def parse_report(line: str) -> TrainReport | None:
    """The report a line of CMD's output is, or None: any other line, or a report whose
    tokens/s (train) or loss (val) is missing, malformed, negative or not finite. Other
    malformed fields are dropped, not guessed."""
    text = strip_ansi(line).strip()
    if not text or len(text) > 1000:
        return None
    if (match := _ITER.match(text)) is not None:
        return _classic(int(match.group(1)), match.group(2))
    if (match := _ROW.match(text)) is not None:
        tokens = _number(match.group(3))
        if tokens is None or tokens < 0:
            return None
        return TrainReport("train", int(match.group(1)), tokens, _number(match.group(2)))
    if (match := _VAL_ROW.match(text)) is not None:
        loss = _number(match.group(2))
        if loss is None:
            return None
        return TrainReport("val", int(match.group(1)), val_loss=loss, val_s=_number(match.group(3)))
    return None


def _classic(iteration: int, rest: str) -> TrainReport | None:
    values: dict[str, Any] = {}
    for item in re.split(r",\s+", rest):
        match = _FIELD.match(item.strip())
        if match is None or (key := _CLASSIC.get(match.group(1).lower())) is None:
            continue
        value = _number(match.group(2))
        if value is None:
            continue
        if key == "trained_tokens":
            if value != int(value) or value < 0:
                continue
            value = int(value)
        values[key] = value
    tokens = values.get("tokens_per_s")
    if tokens is not None:
        if tokens < 0:
            return None
        train = {key: value for key, value in values.items() if key not in ("val_loss", "val_s")}
        return TrainReport("train", iteration, **train)
    if "val_loss" in values:
        return TrainReport("val", iteration, val_loss=values["val_loss"], val_s=values.get("val_s"))
    return None


# --- the accumulator ----------------------------------------------------------------------


@dataclass(frozen=True)
class Pause:
    """One pause: when (s since the job's start), the reading that caused it, why in words,
    and how long it lasted (None while it goes on)."""

    at_s: float
    celsius: float | None
    reason: str
    seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "at_s": round(self.at_s, 3),
            "celsius": self.celsius,
            "reason": self.reason[:MAX_REASON],
            "s": None if self.seconds is None else round(self.seconds, 3),
        }


@dataclass
class _Window:
    sum: float = 0.0
    count: int = 0

    def add(self, value: float) -> None:
        self.sum += value
        self.count += 1

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None


class Throughput:
    """mlx_lm's training reports over one job: counts, the last loss and iteration, the mean
    Tokens/sec, the throttle ratio and the series. A concern of its own (JobAccount's other
    half is time: pauses, levels, readings), fed only by JobAccount.report().

    The throttle ratio is the mean Tokens/sec of the train reports that arrived in the last
    `window_s` seconds (after the latest report's time − window_s) over the mean of those in
    the first `window_s` seconds (up to the first report's time + window_s); None unless the
    reports span at least 2 × window_s, so that the two windows cannot overlap. Reports are
    timed by their arrival (mlx_lm prints no time). Memory stays bounded: the first window
    and the series are sums, only the last window's reports are kept.
    """

    def __init__(self, started_at: float, window_s: float) -> None:
        self.started_at = started_at
        self.window_s = window_s
        self.bucket_s = window_s / 2
        self._train = 0
        self._val = 0
        self._val_s = 0.0
        self._all = _Window()
        self._first_at: float | None = None
        self._first = _Window()
        self.recent: deque[tuple[float, float]] = deque()
        self._buckets: dict[int, _Window] = {}
        self._last: TrainReport | None = None
        self._last_val: TrainReport | None = None
        self._peak_mem_gb: float | None = None
        self._trained_tokens: int | None = None
        self._report_at = started_at

    def report(self, report: TrainReport, at: float) -> None:
        at = self._report_at = max(at, self._report_at)  # arrival order is time order
        if report.kind == "val":
            self._val += 1
            self._val_s += report.val_s or 0.0
            self._last_val = report
            return
        tokens = report.tokens_per_s
        if tokens is None:
            return
        self._train += 1
        self._last = report
        if report.peak_mem_gb is not None:
            self._peak_mem_gb = max(self._peak_mem_gb or 0.0, report.peak_mem_gb)
        if report.trained_tokens is not None:
            self._trained_tokens = report.trained_tokens
        self._all.add(tokens)
        if self._first_at is None:
            self._first_at = at
        if at <= self._first_at + self.window_s:
            self._first.add(tokens)
        self.recent.append((at, tokens))
        while self.recent and self.recent[0][0] <= at - self.window_s:
            self.recent.popleft()
        index = max(0, int((at - self.started_at) // self.bucket_s))
        self._buckets.setdefault(index, _Window()).add(tokens)

    def summary(self) -> dict[str, Any]:
        """The reports' part of JobAccount.summary()."""
        first, last = self._throttle_windows()
        return {
            "train_reports": self._train,
            "val_reports": self._val,
            "val_s": round(self._val_s, 3) if self._val else None,
            "last_iteration": self._last.iteration if self._last else None,
            "trained_tokens": self._trained_tokens,
            "peak_mem_gb": self._peak_mem_gb,
            "train_loss_last": self._last.train_loss if self._last else None,
            "val_loss_last": self._last_val.val_loss if self._last_val else None,
            "tok_s_mean": _rounded(self._all.mean),
            "tok_s_first": _rounded(first),
            "tok_s_last": _rounded(last),
            "throttle": None
            if first is None or last is None or first <= 0
            else round(last / first, 4),
            "throttle_window_s": self.window_s,
            "tok_s_bucket_s": None,
            "tok_s_series": [],
        } | self._series()

    def _throttle_windows(self) -> tuple[float | None, float | None]:
        if self._first_at is None or not self.recent:
            return self._first.mean, None
        latest = self.recent[-1][0]
        if latest - self._first_at < 2 * self.window_s:
            return self._first.mean, None
        recent = [tokens for _, tokens in self.recent]
        return self._first.mean, sum(recent) / len(recent)

    def _series(self) -> dict[str, Any]:
        """[[seconds since the job's start, mean tokens/s], ...], one point per bucket that
        had reports; buckets are merged two by two until at most MAX_SERIES_POINTS remain."""
        if not self._buckets:
            return {}
        buckets = {index: (w.sum, w.count) for index, w in self._buckets.items()}
        width = 1
        while max(buckets) // width >= MAX_SERIES_POINTS:
            width *= 2
        merged: dict[int, tuple[float, int]] = {}
        for index, (total, count) in buckets.items():
            key = index // width
            old = merged.get(key, (0.0, 0))
            merged[key] = (old[0] + total, old[1] + count)
        step = self.bucket_s * width
        return {
            "tok_s_bucket_s": step,
            "tok_s_series": [
                [round(key * step, 3), round(total / count, 3)]
                for key, (total, count) in sorted(merged.items())
            ],
        }


class EnergyTally:
    """A meter's cumulative joules over one job: the last counter less the first, or why there
    is none. Its own concept because a meter may be absent, restart or be simulated, none of
    which touches the job's time."""

    def __init__(self) -> None:
        self._energy: tuple[float, float] | None = None  # (first counter, last counter)
        self._note: str | None = NO_METER
        self._source: str | None = None

    def meter(
        self, joules: float | None, note: str | None = None, source: str | None = None
    ) -> None:
        """See JobAccount.meter(): a counter that goes back (a restarted meter) is refused."""
        if source is not None:
            self._source = source
        if joules is None or not math.isfinite(joules):
            if self._energy is None:
                self._note = note or self._note
            return
        if self._energy is None:
            self._energy, self._note = (joules, joules), None
        elif joules >= self._energy[1]:
            self._energy = (self._energy[0], joules)

    def summary(self) -> dict[str, Any]:
        """The energy part of JobAccount.summary()."""
        return {
            "energy_j": None if self._energy is None else self._energy[1] - self._energy[0],
            "energy_note": self._note,
            "energy_source": self._source,
        }


class _Stretches:
    """Stretches of time something held (the job's own speed throttling, by `agent run`'s
    throttling / throttle_end events): how many, and their seconds up to a moment."""

    def __init__(self) -> None:
        self.count = 0
        self._seconds = 0.0
        self._since: float | None = None

    def begin(self, at: float) -> None:
        if self._since is None:
            self._since, self.count = at, self.count + 1

    def end(self, at: float) -> None:
        if self._since is not None:
            self._seconds += max(0.0, at - self._since)
            self._since = None

    def seconds(self, at: float) -> float:
        return self._seconds + (max(0.0, at - self._since) if self._since is not None else 0.0)


class JobAccount:
    """What one job did, fed as it happens (each call with its epoch time, in time order; a
    time earlier than the last one counts as no time at all). The time is kept here (wall,
    pauses, batch reductions, pressure levels, the hottest reading); the training reports go
    to a Throughput and the meter's counter to an EnergyTally.

    - reading(): each poll's reading (celsius, source, sensor, pressure; all None: no
      reading). Its pressure level holds until the next poll (the last one until the end);
      before the first poll and after a poll without a reading the level is `unknown`.
    - action(): the supervisor's pause/resume/stop/reduce_batch/restore_batch (and forward,
      kill, exit, which end a pause as their SIGCONT does), with the reading's celsius and the
      supervisor's reason. A pause lasts until what ends it, or the end of the job.
    - report_line(): a line of CMD's output; mlx_lm's reports (parse_report) are kept, and
      give the throttle ratio over `window_s` (Throughput).
    - meter(): a cumulative energy counter (joules since the meter opened), when one exists.
    """

    def __init__(self, job: str, started_at: float, window_s: float = THROTTLE_WINDOW_S) -> None:
        if not (math.isfinite(window_s) and window_s > 0):
            raise ValueError(f"the throttle window must be > 0 seconds, got {window_s}")
        self.job = job
        self.started_at = started_at
        self.window_s = window_s
        self.ended_at: float | None = None
        self.throughput = Throughput(started_at, window_s)
        self.energy = EnergyTally()
        self._now = started_at
        self._level = UNKNOWN
        self._pressure_s: dict[str, float] = {}
        self._max: tuple[float, str | None, str | None, float] | None = None
        self._last_reading: tuple[float | None, str | None, str | None, str | None] | None = None
        self._pauses: list[Pause] = []
        self._pause_count = 0
        self._paused_s = 0.0
        self._paused_since: float | None = None
        self._reduced_since: float | None = None
        self._reduced_s = 0.0
        self._reductions = 0
        self._throttled = _Stretches()

    @property
    def _recent(self) -> deque[tuple[float, float]]:
        """The last window's train reports (the throughput's): all that is kept of them."""
        return self.throughput.recent

    # --- feeding ------------------------------------------------------------------------

    def reading(
        self,
        at: float,
        celsius: float | None,
        source: str | None = None,
        sensor: str | None = None,
        pressure: str | None = None,
    ) -> None:
        if self.ended_at is not None:
            return
        self._advance(at)
        if celsius is not None and not math.isfinite(celsius):
            celsius = None
        level = (pressure or "").strip().lower()
        self._level = level if level in PRESSURE_LEVELS else UNKNOWN
        if celsius is None and self._level == UNKNOWN:
            self._last_reading = None
            return
        self._last_reading = (celsius, source, sensor, pressure)
        if celsius is not None and (self._max is None or celsius > self._max[0]):
            self._max = (celsius, source, sensor, self._now)

    def action(
        self, action: str, at: float, celsius: float | None = None, reason: str | None = None
    ) -> None:
        if self.ended_at is not None:
            return
        self._advance(at)
        if action == "pause" and self._paused_since is None:
            self._paused_since = self._now
            self._pause_count += 1
            if len(self._pauses) < MAX_PAUSES_LISTED:
                why = reason or self._reading_text(celsius)
                self._pauses.append(Pause(self._now - self.started_at, celsius, why))
        elif action in PAUSE_ENDS:
            self._end_pause()
        if action == "reduce_batch" and self._reduced_since is None:
            self._reduced_since = self._now
            self._reductions += 1
        elif action in ("restore_batch", "exit") and self._reduced_since is not None:
            self._reduced_s += self._now - self._reduced_since
            self._reduced_since = None
        if action == "throttling":
            self._throttled.begin(self._now)
        elif action in ("throttle_end", "exit"):
            self._throttled.end(self._now)

    def report_line(self, line: str, at: float) -> TrainReport | None:
        """Keep `line` if it is a report; returns what it was."""
        report = parse_report(line)
        if report is not None:
            self.report(report, at)
        return report

    def report(self, report: TrainReport, at: float) -> None:
        if self.ended_at is None:
            self.throughput.report(report, at)

    def meter(
        self, at: float, joules: float | None, note: str | None = None, source: str | None = None
    ) -> None:
        """A meter's cumulative joules (None: no reading now, `note` says why), from `source`
        (the whole Mac's meter, labelled simulated when it is). Energy is the last counter less
        the first; a counter that goes back (a restarted meter) is refused."""
        if self.ended_at is None:
            self.energy.meter(joules, note, source)

    def finish(self, at: float) -> None:
        """The job is over (its group gone): open pauses and levels end here, and nothing fed
        afterwards counts."""
        if self.ended_at is None:
            self.action("exit", at)
            self.ended_at = self._now

    # --- reading it back ----------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """A plain, JSON-able dict (None for what is not known), up to now or to finish()."""
        end = self.ended_at if self.ended_at is not None else self._now
        pressure = dict(self._pressure_s)
        pressure[self._level] = pressure.get(self._level, 0.0) + max(0.0, end - self._now)
        paused = self._paused_s + (end - self._paused_since if self._paused_since else 0.0)
        pauses = [p.to_dict() for p in self._pauses]
        if self._paused_since is not None and pauses:
            pauses[-1]["s"] = round(end - self._paused_since, 3)
        reduced = self._reduced_s + (end - self._reduced_since if self._reduced_since else 0.0)
        hottest = self._max
        return {
            "job": self.job,
            "wall_s": round(max(0.0, end - self.started_at), 3),
            "paused_s": round(paused, 3),
            "pauses": self._pause_count,
            "pause_list": pauses,
            "reduced_s": round(reduced, 3),
            "reductions": self._reductions,
            "throttled_s": round(self._throttled.seconds(end), 3),
            "throttlings": self._throttled.count,
            "pressure_s": {
                level: round(seconds, 3)
                for level in (*PRESSURE_LEVELS, UNKNOWN)
                if (seconds := pressure.get(level, 0.0)) > 0
            },
            "max_celsius": hottest[0] if hottest else None,
            "max_source": hottest[1] if hottest else None,
            "max_sensor": hottest[2] if hottest else None,
            "max_at_s": round(hottest[3] - self.started_at, 3) if hottest else None,
            **self.energy.summary(),
            **self.throughput.summary(),
        }

    def summary_lines(self) -> list[str]:
        return render(self.summary())

    def detail(self, limit: int = DETAIL_LIMIT) -> str:
        return detail_json(self.summary(), limit)

    # --- inside -------------------------------------------------------------------------

    def _advance(self, at: float) -> None:
        """Time passes at the current level (and pause): `at` earlier than now adds nothing."""
        if at > self._now:
            self._pressure_s[self._level] = self._pressure_s.get(self._level, 0.0) + (
                at - self._now
            )
            self._now = at

    def _end_pause(self) -> None:
        if self._paused_since is None:
            return
        seconds = self._now - self._paused_since
        self._paused_s += seconds
        self._paused_since = None
        index = self._pause_count - 1
        if index < len(self._pauses):
            pause = self._pauses[index]
            self._pauses[index] = Pause(pause.at_s, pause.celsius, pause.reason, seconds)

    def _reading_text(self, celsius: float | None) -> str:
        """`85.3 °C smc · TCMz`, `pressure heavy (pressure)`: the latest reading, which is
        the one the supervisor just judged."""
        last = self._last_reading
        if last is None:
            return "no reading" if celsius is None else f"{celsius:.1f} °C"
        degrees, source, sensor, pressure = last
        where = " · ".join(part for part in (source, sensor) if part)
        if celsius is None and degrees is None:
            return f"pressure {pressure}" + (f" ({where})" if where else "")
        value = celsius if celsius is not None else degrees
        return f"{value:.1f} °C" + (f" {where}" if where else "")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# --- rendering ----------------------------------------------------------------------------


def duration(seconds: float) -> str:
    """`4.2s`, `12m 04s`, `3h 07m`."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(round(seconds))
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def _fit(text: str, width: int = MAX_LINE) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _where(source: str | None, sensor: str | None) -> str:
    return " · ".join(part for part in (source, sensor) if part) or "unknown sensor"


def render(summary: Mapping[str, Any]) -> list[str]:
    """The summary as one sentence (`job 1a2b3c4d: 12m 04s wall, paused 1m 10s (2 pauses:
    85.3 °C smc · TCMz), pressure nominal 10m 54s · heavy 1m 10s, max 86.1 °C (smc · TCMz),
    energy unavailable (...), 271 tok/s (first 2 min) → 198 tok/s (last 2 min): throttle
    0.73`) wrapped into lines of at most MAX_LINE characters; the caller adds its prefix."""
    parts = [f"{duration(summary['wall_s'])} wall"]
    pauses = summary["pauses"]
    if pauses:
        reasons = list(dict.fromkeys(p["reason"] for p in summary["pause_list"]))
        more = len(reasons) > 2 or pauses > len(summary["pause_list"])
        why = "; ".join(reasons[:2]) + ("; …" if more else "")
        plural = "s" * (pauses > 1)
        parts.append(f"paused {duration(summary['paused_s'])} ({pauses} pause{plural}: {why})")
    else:
        parts.append("never paused")
    if summary["reductions"]:
        parts.append(f"batch reduced {duration(summary['reduced_s'])}")
    if summary.get("throttlings"):
        parts.append(f"throttling {duration(summary['throttled_s'])}")
    levels = " · ".join(f"{lvl} {duration(s)}" for lvl, s in summary["pressure_s"].items())
    parts.append(f"pressure {levels or 'unknown'}")
    hottest = summary["max_celsius"]
    if hottest is None:
        parts.append("max °C unknown (no reading)")
    else:
        parts.append(
            f"max {hottest:.1f} °C ({_where(summary['max_source'], summary['max_sensor'])})"
        )
    if summary["energy_j"] is None:
        parts.append(f"energy unavailable ({summary['energy_note'] or 'no meter'})")
    else:
        source = summary.get("energy_source") or "a meter"
        parts.append(f"energy {summary['energy_j']:.0f} J (the whole Mac's, {source})")
    parts.append(_throughput(summary))
    return _pack(f"job {summary['job']}: ", parts)


def _pack(head: str, parts: list[str], indent: str = "  ") -> list[str]:
    """`parts` joined by commas into lines of at most MAX_LINE characters (a part too long
    for a line is cut)."""
    lines: list[str] = []
    line = head
    for index, part in enumerate(parts):
        text = part + ("," if index < len(parts) - 1 else "")
        if line.strip() and len(line) + 1 + len(text) > MAX_LINE:
            lines.append(line)
            line = indent
        line += ("" if line in (head, indent) else " ") + text
        line = _fit(line)
    lines.append(line)
    return lines


def _throughput(summary: Mapping[str, Any]) -> str:
    if not summary["train_reports"]:
        return "tok/s unknown (no mlx_lm training reports seen)"
    window = duration(summary["throttle_window_s"]).replace("m 00s", " min")
    if summary["throttle"] is None:
        return (
            f"{summary['tok_s_mean']:.0f} tok/s mean of {summary['train_reports']} reports, "
            f"throttle unknown (reports span < 2 × {window})"
        )
    return (
        f"{summary['tok_s_first']:.0f} tok/s (first {window}) → {summary['tok_s_last']:.0f} "
        f"tok/s (last {window}): throttle {summary['throttle']:.2f}"
    )


def detail_json(summary: Mapping[str, Any], limit: int = DETAIL_LIMIT) -> str:
    """The summary as compact JSON within `limit` characters: the series, then the pause list,
    are thinned out (and `truncated` set) when it would not fit."""
    data = dict(summary)
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    while len(text) > limit:
        if len(data["tok_s_series"]) > 1:
            data["tok_s_series"] = data["tok_s_series"][::2]
        elif data["tok_s_series"]:
            data["tok_s_series"] = []
        elif data["pause_list"]:
            data["pause_list"] = data["pause_list"][: len(data["pause_list"]) // 2]
        else:
            raise ValueError(f"a summary cannot fit {limit} characters")
        data["truncated"] = True
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text
