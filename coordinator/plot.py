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

from coordinator.telemetry_stats import THRESHOLDS, HostHistory, paused_intervals

THRESHOLD_STYLES = {
    "max_speed_temp": ("reduce batch", "tab:olive"),
    "pause_temp": ("pause", "darkorange"),
    "stop_temp": ("stop", "red"),
}


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


def plot_history(histories: list[HostHistory], title: str) -> Figure:
    """The figure; hosts without samples are left out."""
    metered = any(s.get("power_w") is not None for h in histories for s in h.samples)
    figure = Figure(figsize=(10, 7.2 if metered else 4.8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    if metered:
        axes, power_axes = figure.subplots(2, 1, sharex=True, height_ratios=(2, 1))
        _power_panel(power_axes, histories)
    else:
        axes = figure.add_subplot()
    labelled: set[str] = set()
    for history in histories:
        if not history.samples:
            continue
        xs, ys = _line(history)
        (line,) = axes.plot(xs, ys, linewidth=1.4, label=history.host)
        for index, (start, end) in enumerate(paused_intervals(history.samples, history.spans)):
            axes.axvspan(
                _when(start),
                _when(end),
                color=line.get_color(),
                alpha=0.18,
                linewidth=0,
                label=f"{history.host} paused" if index == 0 else None,
            )
        for start, end, policy in _policy_periods(history):
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


def _power_panel(axes: Axes, histories: list[HostHistory]) -> None:
    """Watts per host (the machine's, as its power source gave them), breaking at silences."""
    simulated = False
    for history in histories:
        xs = [_when(sample["time"]) for sample in history.samples]
        ys = [math.nan if s.get("power_w") is None else s["power_w"] for s in history.samples]
        axes.plot(xs, ys, linewidth=1.2, label=history.host)
        simulated = simulated or any(
            (s.get("power") or {}).get("simulated") for s in history.samples
        )
    axes.set_ylabel("W" + (" (simulated)" if simulated else ""))
    axes.grid(alpha=0.3)


def write_plot(figure: Figure, path: Path) -> None:
    figure.savefig(path, format="png")
