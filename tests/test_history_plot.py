"""The history plot draws what was recorded: each host's readings (broken at silences), the
thresholds of the policy in force (one set when every host shares it, else each host's, named),
the paused stretches, a mark where a job was stopped, host colours no threshold uses; and it
writes a real PNG."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from matplotlib.axes import Axes  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.dates import date2num  # noqa: E402

from coordinator.commands.history import read_history  # noqa: E402
from coordinator.reports.plot import HOST_COLOURS, THRESHOLD_STYLES, plot_history, write_plot  # noqa: E402
from coordinator.telemetry.stats import HostSeries  # noqa: E402
from coordinator.telemetry.store import TelemetryStore  # noqa: E402
from tests.test_history_stats import POLICY, event, job, sample  # noqa: E402

T0 = 1_800_000_000.0


@pytest.fixture
def series(tmp_path: Path) -> list[HostSeries]:
    """Two hosts as recorded and read back at plot resolution (a host without samples in the
    window, idle:5555, is not read at all)."""
    hot = [
        sample(T0 + t, c, jobs=[job("paused" if c >= 85 else "running")], host="mac1:5555")
        for t, c in enumerate([70, 80, 86, 88, 84, 78])
    ]
    cool = [sample(T0 + t, 50.0 + t, host="mac2:5555") for t in (0, 1, 2, 30, 31, 32)]
    idle = [sample(T0 - 3600, 40.0, host="idle:5555")]
    hotter = {**POLICY, "stop_temp": 99.0}
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        store.add([(row["host"], row) for row in hot + cool + idle])
        store.record_policy("mac1:5555", POLICY, T0 - 60)
        store.record_policy("mac1:5555", hotter, T0 + 3)
        return read_history(store, T0 - 1, None, plot=True)[1]


def plotted(series: list[HostSeries]) -> Axes:
    figure = plot_history(series, "SoC temperature")
    (axes,) = figure.axes
    return axes


def test_each_host_with_samples_is_a_line_broken_at_silences(series: list[HostSeries]) -> None:
    lines = {line.get_label(): line for line in plotted(series).get_lines()}
    assert set(lines) == {"mac1:5555", "mac2:5555"}  # a host without samples is left out
    assert list(lines["mac1:5555"].get_ydata()) == [70, 80, 86, 88, 84, 78]
    cool = list(lines["mac2:5555"].get_ydata())
    assert cool[:3] == [50, 51, 52] and math.isnan(cool[3]) and cool[4:] == [80, 81, 82]


def test_thresholds_follow_the_policy_in_force(series: list[HostSeries]) -> None:
    axes = plotted(series)
    # thresholds: 75/85/95 until the new policy at T0+3, then 75/85/99, each a dashed segment
    segments = sorted(
        (round(float(segment[0][1]), 1), segment[0][0], segment[1][0])
        for collection in axes.collections
        for segment in collection.get_segments()
    )
    when = [date2num(datetime.fromtimestamp(T0 + t)) for t in (0, 3, 5)]
    assert [s[0] for s in segments] == [75, 75, 85, 85, 95, 99]
    assert {(s[1], s[2]) for s in segments} == {(when[0], when[1]), (when[1], when[2])}
    labels = axes.get_legend_handles_labels()[1]
    assert {
        "mac1:5555: stop ≥ 95 °C",
        "mac1:5555: stop ≥ 99 °C",
        "mac1:5555: pause ≥ 85 °C",
    } <= set(labels)


def test_paused_stretches_are_shaded(series: list[HostSeries]) -> None:
    axes = plotted(series)
    assert "mac1:5555 paused" in axes.get_legend_handles_labels()[1]
    # one shaded stretch: the samples at 86 and 88 (1 s each)
    (span,) = [patch for patch in axes.patches if patch.get_alpha() == pytest.approx(0.18)]
    left, width = span.get_x(), span.get_width()
    assert (left, left + width) == pytest.approx(
        [date2num(datetime.fromtimestamp(T0 + t)) for t in (2, 4)]
    )


def test_the_title_says_the_data_is_simulated(series: list[HostSeries]) -> None:
    assert "simulated or replayed" in plotted(series).get_title()


def test_write_plot_makes_a_png(series: list[HostSeries], tmp_path: Path) -> None:
    out = tmp_path / "out.png"
    write_plot(plot_history(series, "SoC temperature"), out)
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.fixture
def shared_policy(tmp_path: Path) -> list[HostSeries]:
    """Two hosts under one policy, as recorded and read back; mac1 stopped a job at 96 °C,
    mac2 one with no reading."""
    mac1 = [sample(T0 + t, c, host="mac1:5555") for t, c in enumerate([80, 90, 96, 70])]
    mac2 = [sample(T0 + t, 60.0, host="mac2:5555") for t in range(4)]
    stops = [event(T0 + 2, "stop", 96.0) | {"host": "mac1:5555"}]
    stops.append(event(T0 + 3, "stop") | {"host": "mac2:5555"})
    with TelemetryStore(tmp_path / "t.sqlite") as store:
        store.add([(row["host"], row) for row in mac1 + mac2], [(e["host"], e) for e in stops])
        for host in ("mac1:5555", "mac2:5555"):
            store.record_policy(host, POLICY, T0 - 60)
        return read_history(store, T0 - 1, None, plot=True)[1]


def test_one_set_of_thresholds_when_every_host_shares_the_policy(
    shared_policy: list[HostSeries],
) -> None:
    axes = plotted(shared_policy)
    labels = axes.get_legend_handles_labels()[1]
    thresholds = [label for label in labels if "≥" in label]
    assert thresholds == [
        "reduce batch ≥ 75 °C (every host)",
        "pause ≥ 85 °C (every host)",
        "stop ≥ 95 °C (every host)",
    ]
    assert sum(len(c.get_segments()) for c in axes.collections) == 3


def test_a_stop_is_marked_where_it_happened(shared_policy: list[HostSeries]) -> None:
    lines = {line.get_label(): line for line in plotted(shared_policy).get_lines()}
    marker = lines["mac1:5555: job stopped"]
    assert marker.get_marker() == "X" and list(marker.get_ydata()) == [96.0]
    unknown = lines["mac2:5555: job stopped"]  # no reading: a vertical line at its time
    assert list(unknown.get_xdata()) == [datetime.fromtimestamp(T0 + 3)] * 2


def test_host_colours_never_collide_with_threshold_colours() -> None:
    assert not set(HOST_COLOURS) & {colour for _, colour in THRESHOLD_STYLES.values()}
    many = [HostSeries(f"mac{i}:5555", [(T0, 60.0)], [], [], 3.0, False) for i in range(25)]
    used = {to_hex(line.get_color()) for line in plotted(many).get_lines()}
    assert not used & {to_hex(colour) for _, colour in THRESHOLD_STYLES.values()}
