"""`coordinator history --plot`: temperature per host over time, the policy's thresholds as
lines (one set when every host shares one policy, else each host's, labelled with it), the
stretches with a job paused shaded, and a mark where the policy stopped a job; below, watts per
host when power was metered. Host lines take colours that no threshold uses. Needs matplotlib,
the optional `plot` extra, which is why nothing else imports this module at import time.

Drawn on a bare Figure with the Agg canvas, never pyplot: no display, no global state.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure

from coordinator.telemetry.stats import THRESHOLDS, HostSeries
from shared.safe_text import shown

THRESHOLD_STYLES = {
    "max_speed_temp": ("reduce batch", "goldenrod"),
    "pause_temp": ("pause", "darkorange"),
    "stop_temp": ("stop", "red"),
}
HOST_COLOURS = (
    "tab:blue",
    "tab:green",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:gray",
    "tab:cyan",
    "navy",
    "teal",
    "indigo",
)
"""Host lines, in turn: matplotlib's default cycle without its orange, red and olive, which
read as thresholds."""
STOP_COLOUR = THRESHOLD_STYLES["stop_temp"][1]
MIN_SPAN_C = 2.0
MIN_SPAN_W = 1.0
"""The least a °C or W axis spans: autoscaled to a near-flat line, a 0.01 W change would fill
the panel and read as a cliff."""
Period = tuple[float, float, dict[str, float]]


def _when(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch)


def _line(
    points: list[tuple[float, float | None]], silence: float
) -> tuple[list[datetime], list[float]]:
    """A host's points, with a NaN between two further apart than a silence, so the line
    breaks where nothing was heard instead of bridging it."""
    xs: list[datetime] = []
    ys: list[float] = []
    previous: float | None = None
    for at, value in points:
        if previous is not None and at - previous > silence:
            xs.append(_when(previous + silence))
            ys.append(math.nan)
        xs.append(_when(at))
        ys.append(math.nan if value is None else value)
        previous = at
    return xs, ys


def _policy_periods(series: HostSeries) -> list[Period]:
    """(start, end, policy) over the host's points: each policy from when it was learned (the
    first one from the first point, as telemetry_stats.policy_at assumes) to the next."""
    if not series.policies:
        return []
    first, last = series.first, series.last
    periods = []
    for index, (learned, policy) in enumerate(series.policies):
        start = first if index == 0 else max(learned, first)
        end = series.policies[index + 1][0] if index + 1 < len(series.policies) else last
        if min(end, last) > start:
            periods.append((start, min(end, last), policy))
    return periods


def _threshold_sets(drawn: list[HostSeries]) -> list[tuple[str | None, list[Period]]]:
    """(host, its policy periods) per host; a single (None, whole window) set when every host
    ran under one and the same policy all along."""
    sets = [(series.host, _policy_periods(series)) for series in drawn]
    policies = {tuple(sorted(p.items())) for _, periods in sets for _, _, p in periods}
    if len(policies) == 1 and all(periods for _, periods in sets):
        start = min(periods[0][0] for _, periods in sets)
        end = max(periods[-1][1] for _, periods in sets)
        return [(None, [(start, end, sets[0][1][0][2])])]
    return [(host, periods) for host, periods in sets if periods]


def widened(limits: tuple[float, float], span: float) -> tuple[float, float]:
    """Axis limits at least `span` apart, around the same middle (see MIN_SPAN_C)."""
    low, high = limits
    if high - low >= span:
        return low, high
    middle = (low + high) / 2
    return middle - span / 2, middle + span / 2


def keep_span(axes: Axes, span: float) -> None:
    """Widen `axes`' autoscaled y limits to at least `span`."""
    axes.set_ylim(widened(axes.get_ylim(), span))


def plot_text(value: str) -> str:
    """A label or title made of what agents named: escaped as a terminal shows it
    (shared.safe_text), with `$` literal (Matplotlib would parse it as mathtext, and raise on
    what it cannot)."""
    return shown(value).replace("$", r"\$")


def plot_history(hosts: list[HostSeries], title: str) -> Figure:
    """The figure; hosts without points are left out."""
    metered = any(watts is not None for series in hosts for _, watts in series.power)
    figure = Figure(figsize=(10, 7.2 if metered else 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    drawn = [series for series in hosts if series.points]
    if metered:
        axes, power_axes = figure.subplots(2, 1, sharex=True, height_ratios=(2, 1))
        _power_panel(power_axes, drawn)
    else:
        axes = figure.add_subplot()
    for index, series in enumerate(drawn):
        colour = HOST_COLOURS[index % len(HOST_COLOURS)]
        xs, ys = _line(series.points, series.silence)
        axes.plot(xs, ys, linewidth=1.4, color=colour, label=plot_text(series.host))
        for number, (start, end) in enumerate(series.paused):
            axes.axvspan(
                _when(start),
                _when(end),
                color=colour,
                alpha=0.18,
                linewidth=0,
                label=plot_text(f"{series.host} paused") if number == 0 else None,
            )
        for number, (at, celsius) in enumerate(series.stops):
            label = plot_text(f"{series.host}: job stopped") if number == 0 else None
            if celsius is None:
                axes.axvline(_when(at), color=STOP_COLOUR, linestyle=":", label=label)
            else:
                axes.plot([_when(at)], [celsius], "X", color=STOP_COLOUR, markersize=9, label=label)
    labelled: set[str] = set()
    for host, periods in _threshold_sets(drawn):
        for start, end, policy in periods:
            for name in THRESHOLDS:
                words, colour = THRESHOLD_STYLES[name]
                label = f"{words} ≥ {policy[name]:g} °C"
                label = f"{label} (every host)" if host is None else plot_text(f"{host}: {label}")
                axes.hlines(
                    policy[name],
                    _when(start),
                    _when(end),
                    colors=colour,
                    linestyles="--",
                    linewidth=1,
                    label=None if label in labelled else label,
                )
                labelled.add(label)
    if any(series.simulated for series in hosts):
        title += " (simulated or replayed: not a sensor)"
    axes.set_title(plot_text(title))
    axes.set_ylabel("SoC °C")
    keep_span(axes, MIN_SPAN_C)
    locator = AutoDateLocator()
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return figure


def _power_panel(axes: Axes, drawn: list[HostSeries]) -> None:
    """Watts per host (the machine's, as its power source gave them) in the host's colour,
    breaking at silences."""
    for index, series in enumerate(drawn):
        colour = HOST_COLOURS[index % len(HOST_COLOURS)]
        axes.plot(*_line(series.power, series.silence), linewidth=1.2, color=colour)
    simulated = any(series.power_simulated for series in drawn)
    axes.set_ylabel("W" + (" (simulated)" if simulated else ""))
    keep_span(axes, MIN_SPAN_W)
    axes.grid(alpha=0.3)


def write_plot(figure: Figure, path: Path) -> None:
    figure.savefig(path, format="png")
