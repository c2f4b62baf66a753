"""`coordinator history --plot`: temperature per host over time, the policy's thresholds as
lines, the stretches with a job paused shaded. Needs matplotlib, the optional `plot` extra,
which is why nothing else imports this module at import time.

Drawn on a bare Figure with the Agg canvas, never pyplot: no display, no global state.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

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


def _line(series: HostSeries) -> tuple[list[datetime], list[float]]:
    """The host's points, with a NaN between two further apart than a silence, so the line
    breaks where nothing was heard instead of bridging it."""
    xs: list[datetime] = []
    ys: list[float] = []
    previous: float | None = None
    for at, celsius in series.points:
        if previous is not None and at - previous > series.silence:
            xs.append(_when(previous + series.silence))
            ys.append(math.nan)
        xs.append(_when(at))
        ys.append(math.nan if celsius is None else celsius)
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
    figure = Figure(figsize=(10, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    labelled: set[str] = set()
    for series in hosts:
        if not series.points:
            continue
        xs, ys = _line(series)
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


def write_plot(figure: Figure, path: Path) -> None:
    figure.savefig(path, format="png")
