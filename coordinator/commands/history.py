"""`coordinator history`: what the telemetry `coordinator monitor` recorded says about the
last hours, per host, as a table, JSON or a plot."""

from __future__ import annotations

import difflib
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Group, RenderableType
from rich.text import Text

from coordinator.hosts.hostfile import HostfileError, parse_hosts
from coordinator.telemetry.dashboard import NA, duration
from coordinator.telemetry.job_history import job_summaries
from coordinator.telemetry.stats import (
    THRESHOLDS,
    HostSeries,
    host_series,
    host_stats,
    hosts_recorded,
    parse_since,
)
from coordinator.telemetry.store import TelemetryStore, recorded_hosts
from shared.cooling.clocks import REPLAYED_SOURCE, clock_label, ghz
from shared.cooling.sources import read_from as read_from_name
from shared.exit_codes import EXIT_PARTIAL
from shared.io.cli import check_output, data_home, emit, err, fail, usage_error
from shared.io.given import path_given
from shared.io.options import PLOT_EXTRA, TableFormat
from shared.io.sqlite import StoreError
from shared.safe_text import DETAIL_CAP, shown
from shared.tables import TEXT, WHOLE, WORDS, FitTable


def _stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).isoformat(sep=" ", timespec="seconds")


def read_history(
    store: TelemetryStore, since: float, hosts: list[str] | None, plot: bool
) -> tuple[list[dict[str, Any]], list[HostSeries]]:
    """Every host with samples in the window, in the order asked for (else by name): its
    statistics, and with `plot` its series at plot resolution. Host by host, in SQL: nothing
    holds the window's samples (coordinator.telemetry.stats)."""
    names = hosts_recorded(store.conn, since, hosts)
    policies = store.policies(names)
    rows, series = [], []
    for name in names:
        stats = host_stats(store.conn, name, since, policies.get(name, []))
        rows.append(stats)
        if plot:
            series.append(host_series(store.conn, stats, since, policies.get(name, [])))
    return rows, series


STATS_FOLDS = (
    "samples",
    "GPU GHz",
    "energy Wh",
    "min °C",
    "≥ reduce",
    "≥ stop",
    "stops",
    "mean °C",
    "from",
    "mean W",
    "policy",
    "pauses",
    "throttled",
    "paced",
    "to",
)
"""The columns of the hosts' table a narrow terminal drops, the first first (shared.tables);
host, max °C, time at or above pause and time paused always stay."""
JOBS_FOLDS = ("energy J", "ended", "wall", "throttle", "max °C")
"""The same for the jobs' table; host, job, paused, tok/s and the last pause always stay."""


def stats_table(rows: list[dict[str, Any]], since: float) -> FitTable:
    """The hosts' table; its GPU GHz column only while some host's samples read a GPU clock, its
    throttled column while some host's samples judged throttling."""
    clocked = any(row.get("gpu_max_hz") is not None for row in rows)
    judged = any(row.get("seconds_throttled") is not None for row in rows)
    paced = any(row.get("seconds_paced") for row in rows)
    table = FitTable(
        title=f"mlx-fleet telemetry since {_stamp(since)}", title_justify="left", folds=STATS_FOLDS
    )
    for name in (
        "host",
        "samples",
        "from",
        "to",
        "min °C",
        "mean °C",
        "max °C",
        "policy",
        "≥ reduce",
        "≥ pause",
        "≥ stop",
        "paused",
        *(["paced"] if paced else []),
        *(["throttled"] if judged else []),
        "pauses",
        "stops",
        "energy Wh",
        "mean W",
        *(["GPU GHz"] if clocked else []),
    ):
        table.add_column(
            name,
            justify="left" if name in ("host", "from", "to", "policy") else "right",
            wrap=WORDS if name in ("host", "policy") else WHOLE,  # a host's (simulated) may wrap
        )
    mixed = [mixed_note(row) for row in rows if len(row["read_from"]) > 1]
    if mixed:
        table.caption = Text("\n".join(shown(note, DETAIL_CAP) for note in mixed))
        table.caption_justify = "left"
    for row in rows:
        policy = row["policy"]
        table.add_row(
            _host_cell(row),
            str(row["samples"]),
            _stamp(row["first"]),
            _stamp(row["last"]),
            *(
                NA if row[key] is None else f"{row[key]:.1f}"
                for key in ("min_c", "mean_c", "max_c")
            ),
            NA if policy is None else policy_cell(policy),
            *(
                NA if row["seconds_above"][k] is None else duration(row["seconds_above"][k])
                for k in THRESHOLDS
            ),
            duration(row["seconds_paused"]),
            *([_paced(row)] if paced else []),
            *([_throttled(row)] if judged else []),
            str(row["pauses"]),
            str(row["stops"]),
            _power_figure(row, "energy_j", 1 / 3600, ".2f"),
            _power_figure(row, "mean_power_w", 1, ".1f"),
            *([gpu_range(row)] if clocked else []),
        )
    return table


def _paced(row: dict[str, Any]) -> str:
    """Time the pace tier held the host duty-cycled, with the mean duty: `4m 10s at 46 %`."""
    seconds, duty = row.get("seconds_paced") or 0.0, row.get("mean_duty")
    return duration(seconds) + ("" if duty is None else f" at {duty * 100:.0f} %")


def _throttled(row: dict[str, Any]) -> str:
    """Time the host's samples said it throttled; n/a when none judged (an older agent's)."""
    seconds = row.get("seconds_throttled")
    return NA if seconds is None else duration(seconds)


def gpu_range(row: dict[str, Any]) -> str:
    """The GPU clock's min–max over the window's polls that read one, labelled `sim` (a
    model's) or `rep` (a capture's); n/a when none did."""
    low, high = row.get("gpu_min_hz"), row.get("gpu_max_hz")
    if low is None or high is None:
        return NA
    text = ghz(low) if ghz(low) == ghz(high) else f"{ghz(low)}–{ghz(high)}"
    label = clock_label(REPLAYED_SOURCE if REPLAYED_SOURCE in row["clock_sources"] else None,
                        row["clock_simulated"])  # fmt: skip
    return text + {"simulated": " sim", "replayed": " rep"}.get(label, "")


def _host_cell(row: dict[str, Any]) -> Text:
    """The host, then a line (indented) for each source and sensor its readings came from."""
    cell = Text(shown(row["host"]) + (" (simulated)" if row["simulated"] else ""))
    for line in _read_from_text(row["read_from"]):
        cell.append(f"\n  {line}", style="dim")
    return cell


def _read_from_text(read_from: list[dict[str, Any]]) -> list[str]:
    """`smc · TCMz`, each with its count of readings when there are several."""
    names = [shown(read_from_name(entry["source"], entry["sensor"])) for entry in read_from]
    if len(read_from) < 2:
        return names
    return [f"{name} ({entry['readings']})" for name, entry in zip(names, read_from, strict=True)]


def mixed_note(row: dict[str, Any]) -> str:
    """The line under the table for a host whose readings came from several sources or
    sensors: its °C figures combine them."""
    return (
        f"{row['host']}: min/mean/max and the times above thresholds combine readings of "
        f"{len(row['read_from'])} sources/sensors ({', '.join(_read_from_text(row['read_from']))})"
        ", which may differ by tens of °C"
    )


def _power_figure(row: dict[str, Any], key: str, scale: float, spec: str) -> str:
    """Energy or watts, `sim` after a figure whose source is not a meter."""
    if row[key] is None:
        return NA
    return f"{row[key] * scale:{spec}}" + (" sim" if row["power_simulated"] else "")


def history(
    hosts: Annotated[
        str | None,
        typer.Option(
            "--hosts",
            help="Comma list of HOST[:PORT] as monitored (port 5555 by default); "
            "default: every host recorded.",
        ),
    ] = None,
    since: Annotated[
        str,
        typer.Option(
            "--since",
            help="How far back: 30m, 2h, 1d, or an ISO time (local unless it names a zone).",
        ),
    ] = "2h",
    fmt: TableFormat = "table",
    plot: Annotated[
        Path | None,
        typer.Option(
            "--plot",
            help="Also draw temperature per host over time, thresholds and pauses (and a "
            "power panel when the hosts metered power), "
            f"into this PNG (needs matplotlib: {PLOT_EXTRA}).",
            parser=path_given("--plot", ".png"),
        ),
    ] = None,
) -> None:
    """Per host from the recorded telemetry: min / mean / max °C, time at or above each
    threshold of the policy in force, time paused, pauses and stops, energy and mean power.

    Then each `agent run` job that ended in the window: its wall and paused time, hottest
    reading, energy, tokens/s and throttle, and why it last paused.

    `coordinator monitor` records what it hears; this reads only that record.
    """
    now = time.time()
    check_output(plot, "--plot")
    if hosts is not None and not hosts.strip(" ,"):
        raise usage_error("--hosts is empty: name at least one HOST[:PORT], or leave it out")
    try:
        start = parse_since(since, now)
        names = [entry.address for entry in parse_hosts(hosts)] if hosts is not None else None
    except (HostfileError, ValueError) as exc:
        raise usage_error(str(exc)) from None
    if plot is not None:
        try:
            from coordinator.reports.plot import plot_history, write_plot
        except ImportError as exc:
            if not (exc.name or "").startswith("matplotlib"):
                raise
            raise usage_error(f"--plot needs matplotlib, the `plot` extra: {PLOT_EXTRA}") from None
    data_home(write=False)  # a read-only data dir is still read
    try:
        with TelemetryStore() as store:
            if names is not None:
                check_recorded(store, names)
            rows, series = read_history(store, start, names, plot is not None)
            jobs = job_summaries(store.conn, start, names)
    except StoreError as exc:
        raise usage_error(str(exc)) from None
    if rows or fmt == "json":
        summary = {"since": start, "until": now, "hosts": rows, "jobs": jobs}
        emit(summary, fmt, lambda data: history_tables(data, start))
    else:
        err.print(
            f"no telemetry recorded since {_stamp(start)}: `coordinator monitor` records it",
            highlight=False,
        )
    if plot is not None:
        if not rows:
            raise fail(
                f"nothing to plot: no telemetry recorded since {_stamp(start)}", EXIT_PARTIAL
            )
        try:
            write_plot(plot_history(series, f"SoC temperature since {_stamp(start)}"), plot)
        except OSError as exc:
            raise fail(f"cannot write {plot}: {exc.strerror or exc}", EXIT_PARTIAL) from None
        err.print(f"wrote {plot}", highlight=False)


SHOWN_HOSTS = 10
"""The most recorded hosts an unknown --hosts message lists."""


def unknown_host_message(name: str, known: list[str]) -> str:
    """`host typo:5555 is not in the telemetry store; did you mean mac1:5555? ...`: the close
    matches first, then the hosts recorded (the first SHOWN_HOSTS of them)."""
    said = f"--hosts: host {name} is not in the telemetry store"
    if not known:
        return f"{said}: no host is recorded yet (`coordinator monitor` records them)"
    bare = {host.removesuffix(":5555"): host for host in known}
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    close += [
        bare[match]
        for match in difflib.get_close_matches(name.removesuffix(":5555"), list(bare), 3, 0.6)
        if bare[match] not in close
    ]
    guess = f"; did you mean {', '.join(close[:3])}?" if close else ""
    listed = ", ".join(known[:SHOWN_HOSTS]) + (", ..." if len(known) > SHOWN_HOSTS else "")
    return f"{said}{guess} (recorded: {listed})"


def check_recorded(store: TelemetryStore, names: list[str]) -> None:
    """Exit 2 naming the first host of `names` that the store holds nothing of (no sample, no
    event, ever): a typo, not a host that was quiet in the window."""
    known = sorted(
        set(recorded_hosts(store.conn, "samples")) | set(recorded_hosts(store.conn, "events"))
    )
    for name in names:
        if name not in known:
            raise usage_error(unknown_host_message(name, known))


def history_tables(data: dict[str, Any], since: float) -> RenderableType:
    """The hosts' table, and under it the jobs that ended in the window, when any did."""
    if not data["jobs"]:
        return stats_table(data["hosts"], since)
    return Group(stats_table(data["hosts"], since), jobs_table(data["jobs"]))


def jobs_table(jobs: list[dict[str, Any]]) -> FitTable:
    """One row per `agent run` job that ended in the window: its summary (an agent's: every
    figure checked, every text shown safe) and why it last paused."""
    table = FitTable(title="agent run jobs", title_justify="left", folds=JOBS_FOLDS)
    for name in ("host", "job", "ended", "wall", "paused", "max °C", "energy J", "tok/s",
                 "throttle", "last pause"):  # fmt: skip
        wrap = TEXT if name == "last pause" else WHOLE
        table.add_column(name, wrap=wrap, justify="right" if name in RIGHT else "left")
    for job in jobs:
        if not job["readable"]:
            table.add_row(*_job_names(job), _stamp(job["ended"]), "summary unreadable", *[""] * 6)
            continue
        hottest = NA if job["max_celsius"] is None else f"{job['max_celsius']:.1f}"
        speed = (
            NA if job["tok_s_first"] is None or job["tok_s_last"] is None
            else f"{job['tok_s_first']:.0f} → {job['tok_s_last']:.0f}"
        )  # fmt: skip
        table.add_row(
            *_job_names(job),
            _stamp(job["ended"]),
            NA if job["wall_s"] is None else duration(job["wall_s"]),
            NA if job["paused_s"] is None else duration(job["paused_s"]),
            hottest,
            NA if job["energy_j"] is None else f"{job['energy_j']:.0f}",
            speed,
            NA if job["throttle"] is None else f"{job['throttle']:.2f}",
            Text(shown(job["last_pause"] or "", DETAIL_CAP)),
        )
    return table


def _job_names(job: dict[str, Any]) -> tuple[Text, Text]:
    """The host and the job id an agent named, as Text: an agent's words are never markup."""
    return Text(shown(job["host"])), Text(shown(job["job"] or NA))


RIGHT = ("wall", "paused", "max °C", "energy J", "tok/s", "throttle")


def policy_cell(policy: dict[str, Any]) -> Text:
    """`95/114/120 (defaults for smc)`: the thresholds in force, and where they came from when
    the agent said (Text: an agent's words are never markup)."""
    numbers = "/".join(f"{policy[key]:g}" for key in THRESHOLDS)
    origin = policy.get("origin")
    return Text(numbers if origin is None else f"{numbers} ({shown(origin)})")
