"""`coordinator history --plot`: temperature per host over time, the policy's thresholds as
lines, the stretches with a job paused shaded; below, watts per host when power was metered.
Needs matplotlib, the optional `plot` extra, which is why nothing else imports this module at
import time.

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

from coordinator.telemetry_stats import THRESHOLDS, HostSeries

THRESHOLD_STYLES = {
    "max_speed_temp": ("reduce batch", "tab:olive"),
    "pause_temp": ("pause", "darkorange"),
    "stop_temp": ("stop", "red"),
}


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


def _policy_periods(series: HostSeries) -> list[tuple[float, float, dict[str, float]]]:
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


def plot_history(hosts: list[HostSeries], title: str) -> Figure:
    """The figure; hosts without points are left out."""
    metered = any(watts is not None for series in hosts for _, watts in series.power)
    figure = Figure(figsize=(10, 7.2 if metered else 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    if metered:
        axes, power_axes = figure.subplots(2, 1, sharex=True, height_ratios=(2, 1))
        _power_panel(power_axes, hosts)
    else:
        axes = figure.add_subplot()
    labelled: set[str] = set()
    for series in hosts:
        if not series.points:
            continue
        xs, ys = _line(series.points, series.silence)
        (line,) = axes.plot(xs, ys, linewidth=1.4, label=series.host)
        for index, (start, end) in enumerate(series.paused):
            axes.axvspan(
                _when(start),
                _when(end),
                color=line.get_color(),
                alpha=0.18,
                linewidth=0,
                label=f"{series.host} paused" if index == 0 else None,
            )
        for start, end, policy in _policy_periods(series):
            for name in THRESHOLDS:
                words, colour = THRESHOLD_STYLES[name]
                label = f"{words} ≥ {policy[name]:g} °C"
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
    axes.set_title(title)
    axes.set_ylabel("SoC °C")
    locator = AutoDateLocator()
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    axes.grid(alpha=0.3)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return figure


def _power_panel(axes: Axes, hosts: list[HostSeries]) -> None:
    """Watts per host (the machine's, as its power source gave them), breaking at silences."""
    for series in hosts:
        if series.points:
            axes.plot(*_line(series.power, series.silence), linewidth=1.2, label=series.host)
    simulated = any(series.power_simulated for series in hosts)
    axes.set_ylabel("W" + (" (simulated)" if simulated else ""))
    axes.grid(alpha=0.3)


def write_plot(figure: Figure, path: Path) -> None:
    figure.savefig(path, format="png")
