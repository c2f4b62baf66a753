"""What `coordinator monitor` knows about each host, and how it is shown: a pure model.

Fed with plain message bodies (telemetry.sample / telemetry.event, info.ok) and the coordinator's
clock, never a socket, so every alert and every cell of the dashboard is testable without an agent.
Silence is judged on the coordinator's clock (when a sample *arrived*), never on the agents': a
Mac's clock may be off, and a silent Mac cannot say it is silent.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from coordinator.telemetry.gang_rows import GangRow, gang_rows
from shared import safe_text
from shared.cooling.calibration import origin_told
from shared.cooling.clocks import clock_label, ghz
from shared.cooling.display import STATE_STYLES, sparkline, trend_arrow
from shared.cooling.pace import pace_text
from shared.cooling.policy import CoolingState
from shared.cooling.sources import read_from
from shared.tables import TEXT, WHOLE, WORDS, FitTable
from shared.wire.telemetry import CLOCK_COLUMNS

CONNECTING, UP, UNREACHABLE, INVALID = "connecting", "up", "unreachable", "invalid"
"""A host's status; INVALID: it answered with a message that is not valid (a broken or hostile
agent, docs/security.md), which a reconnect retries but is not the network's fault."""
DOWN = (UNREACHABLE, INVALID)
SPARK_WINDOW_S = 300.0
SPARK_WIDTH = 30
"""The sparkline spans the last five minutes in ten-second buckets, whatever the poll rate;
a narrow terminal gets fewer, wider buckets, down to MIN_SPARK_WIDTH."""
MIN_SPARK_WIDTH = len("last 5 min")
SILENT_INTERVALS = 5
MIN_SILENCE_S = 3.0
"""A host is silent after this many poll intervals without a sample, and never sooner than
MIN_SILENCE_S: a 0.1 s poll would otherwise flap on a busy laptop."""
ALERTS_KEPT, ALERTS_SHOWN = 100, 6
TABLE_FRAME_LINES = 5
"""The dashboard table's lines besides its rows: title, top rule, header, its rule, bottom."""
INFO, WARNING, CRITICAL = "info", "warning", "critical"
ALERT_STYLES = {INFO: "cyan", WARNING: "bold dark_orange", CRITICAL: "bold red"}
JOB_STYLES = {
    "running": "green",
    "paused": "bold dark_orange",
    "stopped": "bold red",
    "exited": "dim",
}
EVENT_ALERTS = {
    "pause": (WARNING, "paused"),
    "resume": (INFO, "resumed"),
    "stop": (CRITICAL, "stopped"),
    "kill": (CRITICAL, "killed"),
    "throttling": (WARNING, "throttling:"),
    "throttle_end": (INFO, "throttling ended:"),
}
"""Job events worth a line: the rest (start, exit, reduce_batch, ...) are in the store."""
NA = "—"
THROTTLING_STYLE = "bold dark_orange"


def silent_after(poll_interval: float | None) -> float:
    """Seconds without a sample after which a host counts as silent."""
    return max(SILENT_INTERVALS * (poll_interval or 1.0), MIN_SILENCE_S)


@dataclass(frozen=True)
class Alert:
    time: float
    host: str
    level: str
    text: str


@dataclass
class HostView:
    """One host as last seen. `heard` is the coordinator's time of the last live sample (or of
    the connection, so a host that never publishes still goes silent)."""

    name: str
    status: str = CONNECTING
    error: str | None = None
    hostname: str | None = None
    policy: dict[str, Any] | None = None
    policy_origin: str | None = None
    """Where the policy's numbers came from, as the agent said (None: it did not)."""
    poll_interval: float | None = None
    sample: dict[str, Any] | None = None
    info_jobs: list[dict[str, Any]] = field(default_factory=list)
    series: deque[tuple[float, float | None]] = field(default_factory=deque)
    """(agent time, °C) of the sparkline's window, oldest first."""
    heard: float | None = None
    read_from: str | None = None
    """Where the latest reading came from (`smc · TCMz`): a change is said, never mixed unsaid."""
    silent: bool = False
    live: bool = False
    """A sample arrived live (not backfilled) since the host last connected."""
    invalid_messages: int = 0
    """Messages from it refused as invalid (dropped, never shown as readings) since the
    monitor started."""

    @property
    def jobs(self) -> list[dict[str, Any]]:
        return self.sample["jobs"] if self.sample is not None else self.info_jobs

    def spark(self, width: int = SPARK_WIDTH) -> list[float | None]:
        """The last SPARK_WINDOW_S of readings (agent time) as `width` bucket means."""
        if self.sample is None:
            return []
        return bucket_means(self.series, self.sample["time"], SPARK_WINDOW_S, width)


def remember(
    series: deque[tuple[float, float | None]], at: float, celsius: float | None, window: float
) -> None:
    """Keep (at, celsius) in time order, once, and nothing older than `window` before the
    newest. Live samples append and prune from the left in O(1); only a backfill after a
    silence inserts, near the right end, where the gap was."""
    index = len(series)
    while index and series[index - 1][0] > at:
        index -= 1
    if index and series[index - 1][0] == at:
        return
    series.insert(index, (at, celsius))
    while series[0][0] < series[-1][0] - window:
        series.popleft()


def bucket_means(
    series: Iterable[tuple[float, float | None]], end: float, window: float, width: int
) -> list[float | None]:
    """Mean reading per bucket of the `window` seconds up to `end`; None where none fell."""
    step = window / width
    sums, counts = [0.0] * width, [0] * width
    for at, celsius in series:
        index = int((at - (end - window)) // step)
        if celsius is not None and 0 <= index <= width:
            index = min(index, width - 1)
            sums[index] += celsius
            counts[index] += 1
    return [s / n if n else None for s, n in zip(sums, counts, strict=True)]


class Dashboard:
    """Every host's view plus the alert lines; mutate with the methods, read the fields."""

    def __init__(self, names: list[str]) -> None:
        self.hosts = {name: HostView(name) for name in names}
        self.alerts: deque[Alert] = deque(maxlen=ALERTS_KEPT)

    def _alert(self, at: float, host: str, level: str, text: str) -> None:
        self.alerts.append(Alert(at, host, level, text))

    def connected(self, name: str, hostname: str | None, info: dict[str, Any], now: float) -> None:
        view = self.hosts[name]
        if view.status in DOWN:
            self._alert(now, name, INFO, "reachable again")
        view.status, view.error, view.hostname = UP, None, hostname
        view.policy, view.poll_interval = info.get("policy"), info.get("poll_interval")
        view.policy_origin = origin_told(info.get("policy_origin"))
        view.info_jobs = list(info.get("jobs") or [])
        view.heard, view.silent, view.live = now, False, False

    def seed(self, name: str, readings: list[tuple[float, float | None]]) -> None:
        """Recorded (time, °C) for the sparkline only: a restarted monitor shows the last
        minutes at once, but nothing recorded counts as the host's current reading."""
        for at, celsius in readings:
            remember(self.hosts[name].series, at, celsius, SPARK_WINDOW_S)

    def set_policy(self, name: str, policy: dict[str, Any], origin: str | None) -> None:
        self.hosts[name].policy, self.hosts[name].policy_origin = policy, origin

    def unreachable(self, name: str, error: str, now: float, status: str = UNREACHABLE) -> None:
        """The host's session ended: UNREACHABLE (no answer), or INVALID (it answered with a
        message that is not valid, counted as every invalid message is)."""
        view = self.hosts[name]
        if view.status != status:
            self._alert(now, name, CRITICAL, f"{status}: {error}")
        view.status, view.error = status, error
        view.invalid_messages += status == INVALID

    def invalid(self, name: str, problem: str, version: str, now: float, count: int = 1) -> None:
        """The host (its agent `version`) sent `count` messages that are not valid, the last
        with `problem` (dropped, never shown as readings): counted, and one alert."""
        self.hosts[name].invalid_messages += count
        what = f"{count} invalid messages, the last" if count > 1 else "an invalid message"
        self._alert(now, name, WARNING, f"sent {what}: {problem} (agent {version})")

    def sample(self, name: str, body: dict[str, Any], now: float, live: bool = True) -> None:
        """A sample, live (just published) or backfilled (history.get); older ones only fill
        the sparkline, and only a live one can raise a state alert or end a silence."""
        view = self.hosts[name]
        remember(view.series, body["time"], body["celsius"], SPARK_WINDOW_S)
        previous = view.sample
        if previous is None or body["time"] > previous["time"]:
            view.sample = body
            self._note_origin(view, body, now)
            if live and previous is not None and entered(previous["state"], body["state"]):
                level = CRITICAL if body["state"] == CoolingState.STOP.value else WARNING
                self._alert(
                    now, name, level, f"reached {body['state']} at {_celsius(body['celsius'])}"
                )
            if (
                live
                and previous is not None
                and body.get("throttling")
                and not previous.get("throttling")
            ):
                evidence = body.get("throttle_evidence") or "no evidence given"
                self._alert(now, name, WARNING, f"throttling: {evidence}")
        if live:
            if view.silent:
                self._alert(now, name, INFO, "publishing again")
            view.heard, view.silent, view.live = now, False, True

    def _note_origin(self, view: HostView, body: dict[str, Any], now: float) -> None:
        """Alert when a host's readings start coming from another source or sensor: the
        sparkline and the record then hold readings that may differ by tens of °C."""
        if body["celsius"] is None:
            return
        origin = read_from(body["source"], body["sensor"])
        if view.read_from is not None and origin != view.read_from:
            self._alert(
                now,
                view.name,
                WARNING,
                f"readings now from {origin} (were {view.read_from}): they may differ by "
                "tens of °C",
            )
        view.read_from = origin

    def event(self, name: str, body: dict[str, Any]) -> None:
        """An event never seen before: pauses, resumes, stops, kills and new policies get a
        line."""
        if body["action"] == "policy":
            self._alert(body["time"], name, INFO, f"new policy: {body['detail']}")
            return
        if body["action"] not in EVENT_ALERTS:
            return
        level, verb = EVENT_ALERTS[body["action"]]
        pid = f" (pid {body['pid']})" if body["pid"] is not None else ""
        at = f" at {_celsius(body['celsius'])}" if body["celsius"] is not None else ""
        detail = f": {body['detail']}" if body["detail"] else ""
        self._alert(body["time"], name, level, f"{verb} job {body['job']}{pid}{at}{detail}")

    def settled(self) -> bool:
        """Every host unreachable, silent, or heard live: what `monitor --once` waits for."""
        return all(view.status in DOWN or view.silent or view.live for view in self.hosts.values())

    def tick(self, now: float) -> None:
        """Declare silent every connected host whose samples stopped arriving."""
        for view in self.hosts.values():
            if (
                view.status == UP
                and not view.silent
                and view.heard is not None
                and now - view.heard > silent_after(view.poll_interval)
            ):
                view.silent = True
                self._alert(
                    now, view.name, WARNING, f"silent: no sample for {now - view.heard:.0f} s"
                )


def entered(before: str | None, after: str | None) -> bool:
    """A host rose into pause or stop: a state worth an alert when it is entered on the way up,
    never when a host cooling down from stop passes through pause."""
    if after == before or after not in (CoolingState.PAUSE.value, CoolingState.STOP.value):
        return False
    was = CoolingState(before).severity if before else -1
    return CoolingState(after).severity > was


def _celsius(value: float | None) -> str:
    return NA if value is None else f"{value:.1f} °C"


def duration(seconds: float) -> str:
    """42 s, 3m 05s, 1h 02m: short enough for a table cell."""
    whole = int(round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


def host_snapshot(view: HostView, now: float) -> dict[str, Any]:
    """One host for `--format json`: what scripts need, with the same meaning as the
    dashboard's row (`status` connecting, up or unreachable; silent; the current reading and
    whether it is simulated)."""
    sample = view.sample or {}
    return {
        "host": view.name,
        "hostname": view.hostname,
        "status": view.status,
        "reachable": view.status == UP,
        "error": view.error,
        "silent": view.silent,
        "time": sample.get("time"),
        "celsius": sample.get("celsius"),
        "pressure": sample.get("pressure"),
        "source": sample.get("source"),
        "sensor": sample.get("sensor"),
        "simulated": sample.get("simulated"),
        "state": sample.get("state"),
        "throttling": sample.get("throttling"),
        "throttle_evidence": sample.get("throttle_evidence"),
        "trend_c_per_min": sample.get("trend_c_per_min"),
        "power_w": sample.get("power_w"),
        "energy_j": sample.get("energy_j"),
        "power_source": (sample.get("power") or {}).get("source"),
        "power_simulated": (sample.get("power") or {}).get("simulated"),
        **{key: sample.get(key) for key in CLOCK_COLUMNS},
        "pause_s_total": sample.get("pause_s_total"),
        "invalid_messages": view.invalid_messages,
        "jobs": view.jobs,
        "policy": view.policy,
        "policy_origin": view.policy_origin,
        "poll_interval": view.poll_interval,
        "age_s": None if not sample else round(now - sample["time"], 3),
    }


def in_time_order(alerts: Iterable[Alert]) -> list[Alert]:
    """By time, not arrival: a backfill brings older events after newer live ones."""
    return sorted(alerts, key=lambda alert: alert.time)


def snapshot(dashboard: Dashboard, now: float) -> dict[str, Any]:
    return {
        "time": now,
        "hosts": [host_snapshot(view, now) for view in dashboard.hosts.values()],
        "alerts": [alert.__dict__ for alert in in_time_order(dashboard.alerts)],
        "gangs": [row.to_dict() for row in dashboard_gangs(dashboard)],
    }


def dashboard_gangs(dashboard: Dashboard) -> list[GangRow]:
    """The distributed jobs the reachable hosts list, one row each."""
    return gang_rows(
        (view.name, view.jobs, view.sample)
        for view in dashboard.hosts.values()
        if view.status == UP
    )


GANG_WRAPS = {"group": WHOLE, "ranks": WORDS, "hottest": WHOLE, "state": WHOLE, "because": TEXT}
"""How each gang column gives way (shared.tables): the group, the hottest reading and its host
never wrap; the ranks wrap between hosts, the cause anywhere."""
GANG_FOLDS = ("hottest",)
"""What a narrow terminal drops first (shared.tables): the cause names the Mac that matters."""


def gang_table(rows: list[GangRow]) -> FitTable:
    """One row per distributed job: its ranks and hosts, the hottest rank, the state every
    rank lives under and the Mac that causes it. Every agent string is shown safe."""
    table = FitTable(title="distributed jobs", title_justify="left", folds=GANG_FOLDS)
    for name, wrap in GANG_WRAPS.items():
        table.add_column(name, wrap=wrap)
    for row in rows:
        hottest = "" if row.hottest is None else f"{row.hottest[0]:.1f} °C {row.hottest[1]}"
        shown_state = pace_text(row.duty) if row.state == "pace" else row.state
        state = Text(shown_state, style=STATE_STYLES.get(CoolingState(row.state), ""))
        table.add_row(
            Text(safe_text.shown(f"{row.group} ({row.backend})")),
            Text(safe_text.shown(row.ranks_text())),
            Text(safe_text.shown(hottest)),
            state,
            Text(safe_text.shown(row.cause_text())),
        )
    return table


def _state_cell(view: HostView, now: float) -> Text:
    if view.status != UP:
        return Text(view.status, style="bold red" if view.status in DOWN else "dim")
    if view.silent and view.heard is not None:
        return Text(f"silent {now - view.heard:.0f} s", style="bold red")
    sample = view.sample or {}
    state = sample.get("state")
    shown_state = pace_text(sample.get("duty")) if state == "pace" else state  # `pace 46 %`
    cell = Text(NA) if state is None else Text(shown_state, style=STATE_STYLES[CoolingState(state)])
    if sample.get("throttling"):
        cell.append(" throttling", style=THROTTLING_STYLE)
    return cell


def _watts_cell(sample: dict[str, Any]) -> Text:
    """The machine's watts at the last poll, labelled when the power source is not a meter."""
    power = sample.get("power") or {}
    if sample.get("power_w") is None:
        return Text(NA)
    cell = Text(f"{sample['power_w']:.1f}")
    if power.get("simulated"):
        cell.append(" sim", style="bold magenta")
    return cell


def _clock_cell(sample: dict[str, Any]) -> Text:
    """The GPU's clock and active share at the last poll (the P cluster's where a host reads
    no GPU clock: cpufreq), labelled when simulated or replayed; n/a without a clock."""
    gpu_hz, active, p_hz = sample.get("gpu_hz"), sample.get("gpu_active"), sample.get("cpu_p_hz")
    if gpu_hz is not None:
        cell = Text(f"{ghz(gpu_hz)}" + ("" if active is None else f" {active * 100:.0f}%"))
    elif active is not None:
        cell = Text("idle")
    elif p_hz is not None:
        cell = Text(f"P {ghz(p_hz)}")
    else:
        return Text(NA)
    label = clock_label(sample.get("clock_source"), sample.get("clock_simulated"))
    if label:
        cell.append(" sim" if label == "simulated" else " rep", style="bold magenta")
    return cell


def _jobs_cell(jobs: list[dict[str, Any]]) -> Text:
    if not jobs:
        return Text(NA, style="dim")
    cell = Text()
    for index, job in enumerate(jobs):
        if index:
            cell.append("\n")
        cell.append(f"{job['kind']} {safe_text.shown(job['job'])} ")
        cell.append(job["state"], style=JOB_STYLES.get(job["state"], ""))
        if gang := job.get("gang"):
            cell.append(f" rank {gang['rank']}/{gang['world']}")
        if work := job.get("work"):
            _append_work(cell, work)
    return cell


def _append_work(cell: Text, work: dict[str, Any]) -> None:
    """A job's latest work rate, and `throttling` when its rate says so."""
    if work["rate"] is not None:
        cell.append(f" {work['rate']:.0f} {work['unit']}")
    if work["throttling"]:
        cell.append(" throttling", style=THROTTLING_STYLE)


def _fitting(views: list[HostView], lines: int) -> list[HostView]:
    """The first views whose rows fit in `lines` (a row is a line per job listed)."""
    shown: list[HostView] = []
    for view in views:
        lines -= max(1, len(view.jobs) if view.status == UP else 1)
        if lines < 0:
            break
        shown.append(view)
    return shown


WATTS = "W"
CLOCK = "GPU GHz"
COLUMNS = (
    "host",
    "SoC °C",
    WATTS,
    CLOCK,
    "last 5 min",
    "trend",
    "pressure",
    "state",
    "jobs",
    "paused",
    "source",
)
"""Every column; W only while some host's agent has a power source, GPU GHz only while some
host's samples carry a clock (render)."""
SPARK = "last 5 min"
KEPT_FIRST = (
    "host",
    "SoC °C",
    "state",
    SPARK,
    "jobs",
    CLOCK,
    "trend",
    WATTS,
    "paused",
    "pressure",
    "source",
)
"""Which columns a narrow terminal keeps: the first ones; the rest drop from the end."""
RIGHT = ("SoC °C", WATTS, CLOCK, "paused")


def _cells(view: HostView, now: float) -> dict[str, Text]:
    """The host's row, column by column, the sparkline aside (its width is the layout's)."""
    sample = view.sample
    if view.status != UP or sample is None:
        jobs = _jobs_cell(view.jobs if view.status == UP else [])
        cells = {"SoC °C": Text(NA), WATTS: Text(NA), "pressure": Text(NA), "paused": Text(NA)}
        cells[CLOCK] = Text(NA)
        cells |= {"source": Text(NA), "trend": Text(""), "jobs": jobs}
    else:
        temperature = Text(NA if sample["celsius"] is None else f"{sample['celsius']:.1f}")
        if sample["simulated"] and sample["celsius"] is not None:
            temperature.append(" sim", style="bold magenta")
        trend = sample["trend_c_per_min"]
        cells = {  # what an agent sends is Text, never read as markup
            "SoC °C": temperature,
            WATTS: _watts_cell(sample),
            CLOCK: _clock_cell(sample),
            "trend": Text("" if trend is None else f"{trend_arrow(trend)} {trend:+.1f}/min"),
            "pressure": Text(safe_text.shown(sample["pressure"] or NA)),
            "jobs": _jobs_cell(view.jobs),
            "paused": Text(duration(sample["pause_s_total"])),
            "source": Text(safe_text.shown(read_from(sample["source"], sample["sensor"]))),
        }
    return {"host": Text(safe_text.shown(view.name)), "state": _state_cell(view, now), **cells}


def _cell_width(text: Text) -> int:
    return max((Text(line).cell_len for line in text.plain.splitlines()), default=0)


def fit_columns(widths: dict[str, int], width: int | None) -> tuple[list[str], int]:
    """(the columns shown, the sparkline's width) for a table `width` cells wide, given each
    other column's widest cell (the columns in `widths`, with the sparkline): the sparkline
    narrows to MIN_SPARK_WIDTH first, then columns drop from the end of KEPT_FIRST, then the
    sparkline takes what room is left (up to SPARK_WIDTH). A row is one line: nothing wraps, a
    host name least of all."""
    shown = [name for name in COLUMNS if name in widths or name == SPARK]
    if width is None:
        return shown, SPARK_WIDTH

    def needed(columns: list[str], spark: int) -> int:
        cells = sum(spark if name == SPARK else widths[name] for name in columns)
        return cells + 3 * len(columns) + 1  # padding either side, a rule between, two edges

    for name in reversed(KEPT_FIRST[2:]):
        if needed(shown, MIN_SPARK_WIDTH) <= width:
            break
        if name in shown:
            shown.remove(name)
    spark = min(SPARK_WIDTH, MIN_SPARK_WIDTH + max(0, width - needed(shown, MIN_SPARK_WIDTH)))
    return shown, spark


def render(
    dashboard: Dashboard, now: float, width: int | None = None, height: int | None = None
) -> RenderableType:
    """The dashboard: one row per host, then the latest alert lines. Given the terminal's
    `width`, the table fits it (fit_columns) and each alert stays one line; given its
    `height`, only the rows that fit are drawn, and a line says how many are left out: a
    terminal would crop them anyway, and drawing them costs the most at lab size."""
    alerts = in_time_order(dashboard.alerts)[-ALERTS_SHOWN:]
    views = list(dashboard.hosts.values())
    if height is not None:
        views = _fitting(views, height - TABLE_FRAME_LINES - len(alerts) - 1)
    rows = [_cells(view, now) for view in views]
    metered = any((view.sample or {}).get("power") for view in views)
    clocked = any(_clock_cell(view.sample or {}).plain != NA for view in views)
    widths = {
        name: max([len(name), *(_cell_width(row[name]) for row in rows)])
        for name in COLUMNS
        if name != SPARK and (metered or name != WATTS) and (clocked or name != CLOCK)
    }
    shown, spark = fit_columns(widths, width)
    table = Table(title="mlx-fleet thermal monitor", title_justify="left")
    for name in shown:
        size = spark if name == SPARK else widths[name]
        table.add_column(
            name,
            justify="right" if name in RIGHT else "left",
            width=size if width is not None else None,
            no_wrap=name in ("host", SPARK),
            overflow="ellipsis" if name in ("host", SPARK) else "fold",
        )
    for view, row in zip(views, rows, strict=True):
        row[SPARK] = Text(sparkline(view.spark(spark)) if view.status == UP else "")
        table.add_row(*(row[name] for name in shown))
    lines: list[RenderableType] = [table]
    if gangs := dashboard_gangs(dashboard):
        lines.append(gang_table(gangs))
    left_out = len(dashboard.hosts) - len(views)
    if left_out:
        lines.append(
            Text(
                f"{left_out} more hosts below: a taller terminal shows them, "
                "`coordinator monitor --once` lists them all",
                style="dim",
                no_wrap=True,
                overflow="ellipsis",
            )
        )
    for alert in alerts:
        stamp = time.strftime("%H:%M:%S", time.localtime(alert.time))
        lines.append(
            Text(
                f"{stamp} {safe_text.shown(alert.host)}: {safe_text.shown(alert.text, 1000)}",
                style=ALERT_STYLES[alert.level],
                no_wrap=True,
                overflow="ellipsis",
            )
        )
    return Group(*lines)
