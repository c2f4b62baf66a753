"""`coordinator history --plot`: temperature per host over time, the policy's thresholds as
lines (one set when every host shares one policy, else each host's, labelled with it), the
stretches with a job paused shaded, and a mark where the policy stopped a job. Host lines take
colours that no threshold uses. Needs matplotlib, the optional `plot` extra, which is why nothing
else imports this module at import time.

Drawn on a bare Figure with the Agg canvas, never pyplot: no display, no global state.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure

from coordinator.telemetry_stats import THRESHOLDS, HostHistory, paused_intervals

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


def _when(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch)


def _line(history: HostHistory) -> tuple[list[datetime], list[float]]:
    """The host's readings, with a NaN after each sample followed by a silence so the line
    breaks where nothing was heard instead of bridging it."""
    xs: list[datetime] = []
    ys: list[float] = []
    samples = history.samples
    for index, (sample, span) in enumerate(zip(samples, history.spans, strict=True)):
        xs.append(_when(sample["time"]))
        ys.append(math.nan if sample["celsius"] is None else sample["celsius"])
        following = samples[index + 1]["time"] if index + 1 < len(samples) else None
        if following is not None and following - sample["time"] > span:
            xs.append(_when(sample["time"] + span))
            ys.append(math.nan)
    return xs, ys


def _policy_periods(history: HostHistory) -> list[tuple[float, float, dict[str, float]]]:
    """(start, end, policy) over the host's samples: each policy from when it was learned (the
    first one from the first sample, as telemetry_stats.policy_at assumes) to the next."""
    if not history.samples or not history.policies:
        return []
    first, last = history.samples[0]["time"], history.samples[-1]["time"]
    periods = []
    for index, (learned, policy) in enumerate(history.policies):
        start = first if index == 0 else max(learned, first)
        end = history.policies[index + 1][0] if index + 1 < len(history.policies) else last
        if min(end, last) > start:
            periods.append((start, min(end, last), policy))
    return periods


def _stops(history: HostHistory) -> list[tuple[float, float | None]]:
    """(time, °C or None) of every job the policy stopped on the host."""
    return [(e["time"], e["celsius"]) for e in history.events if e["action"] == "stop"]


Period = tuple[float, float, dict[str, float]]


def _threshold_sets(histories: list[HostHistory]) -> list[tuple[str | None, list[Period]]]:
    """(host, its policy periods) per host with samples; a single (None, whole window) set
    when every host ran under one and the same policy all along."""
    sets = [(h.host, _policy_periods(h)) for h in histories if h.samples]
    policies = {tuple(sorted(p.items())) for _, periods in sets for _, _, p in periods}
    if len(policies) == 1 and all(periods for _, periods in sets):
        start = min(periods[0][0] for _, periods in sets)
        end = max(periods[-1][1] for _, periods in sets)
        return [(None, [(start, end, sets[0][1][0][2])])]
    return [(host, periods) for host, periods in sets if periods]


def plot_history(histories: list[HostHistory], title: str) -> Figure:
    """The figure; hosts without samples are left out."""
    figure = Figure(figsize=(10, 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    drawn = [history for history in histories if history.samples]
    for index, history in enumerate(drawn):
        colour = HOST_COLOURS[index % len(HOST_COLOURS)]
        xs, ys = _line(history)
        axes.plot(xs, ys, linewidth=1.4, color=colour, label=history.host)
        for number, (start, end) in enumerate(paused_intervals(history.samples, history.spans)):
            axes.axvspan(
                _when(start),
                _when(end),
                color=colour,
                alpha=0.18,
                linewidth=0,
                label=f"{history.host} paused" if number == 0 else None,
            )
        for number, (at, celsius) in enumerate(_stops(history)):
            label = f"{history.host}: job stopped" if number == 0 else None
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
                label = f"{label} (every host)" if host is None else f"{host}: {label}"
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
    if any(sample["simulated"] for history in histories for sample in history.samples):
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
