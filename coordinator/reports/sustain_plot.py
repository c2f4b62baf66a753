"""`coordinator benchmark --sustain ... --plot FILE.png`: tok/s, °C and watts over the time of a
sustained run, one line per host (and cell, when a run has several), paused windows marked.
Needs matplotlib, the optional `plot` extra, which is why nothing imports this module at import
time; drawn on a bare Figure with the Agg canvas, never pyplot, as coordinator.reports.plot is.
"""

from __future__ import annotations

from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from coordinator.reports.plot import MIN_SPAN_C, MIN_SPAN_W, keep_span, plot_text
from shared.reports.sustain import sustained

PANELS = (("tokens_per_sec", "tok/s"), ("celsius", "SoC °C"), ("watts", "W"))
UNKNOWN = {
    "tokens_per_sec": "no window with a timed iteration",
    "celsius": "no temperature reading: no thermal source on these hosts",
    "watts": "no power reading: no power meter on these hosts",
}
"""What a panel says instead of an empty axis when no window has its value."""
MIN_SPAN_SHARE = 0.05
"""The least the tok/s axis spans, as a share of the mean drawn (°C and W:
coordinator.reports.plot)."""


def min_span(key: str, values: list[float]) -> float:
    """The least span of a panel's axis, so a tiny change does not look like a cliff."""
    if key == "tokens_per_sec":
        return MIN_SPAN_SHARE * abs(sum(values) / len(values))
    return MIN_SPAN_C if key == "celsius" else MIN_SPAN_W


def _label(record: dict[str, Any], several: bool) -> str:
    host = record.get("host") or "local"
    return plot_text(f"{host} {record['name']}" if several else host)


def _series(windows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(mid-window seconds, value) of the windows that have the value."""
    points = [((w["start_s"] + w["end_s"]) / 2, w[key]) for w in windows if w[key] is not None]
    return [x for x, _ in points], [y for _, y in points]


def plot_sustain(report: dict[str, Any]) -> Figure:
    """The figure of a fleet report's sustained cells (ValueError when it has none)."""
    runs = sustained(report["cells"])
    if not runs:
        raise ValueError("the run has no sustained cell with a window to draw")
    several = len({record["name"] for record in runs}) > 1
    figure = Figure(figsize=(10, 7.2), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(PANELS), 1, sharex=True)
    for record in runs:
        windows = record["sustain"]["windows"]
        colour = None
        for ax, (key, _) in zip(axes, PANELS, strict=True):
            xs, ys = _series(windows, key)
            (line,) = ax.plot(xs, ys, marker="o", markersize=3, color=colour,
                              label=_label(record, several))  # fmt: skip
            colour = line.get_color()
            for window in windows:
                if window["paused"]:
                    ax.axvspan(window["start_s"], window["end_s"], color=colour, alpha=0.12)
    for ax, (key, label) in zip(axes, PANELS, strict=True):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        drawn = [y for record in runs for y in _series(record["sustain"]["windows"], key)[1]]
        if drawn:
            keep_span(ax, min_span(key, drawn))
        else:
            ax.set_yticks([])
            ax.text(0.5, 0.5, UNKNOWN[key], transform=ax.transAxes, ha="center", va="center")
    axes[-1].set_xlabel("seconds since the first timed iteration (shaded: paused)")
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    lines = [f"{report.get('title', 'sustained run')}: tok/s, °C and W per window"]
    if any(record.get("energy_simulated") for record in runs):
        lines.append("watts simulated or replayed: not a meter")
    if any("simulated" in (record.get("flags") or []) for record in runs):
        lines.append("°C simulated or replayed: not a sensor")
    figure.suptitle("\n".join(lines), fontsize="medium")  # one caveat a line: all of it shows
    return figure


def write_sustain_plot(report: dict[str, Any], path: Any) -> None:
    plot_sustain(report).savefig(path, format="png")
