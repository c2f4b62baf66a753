"""`coordinator canary`: the speed delta across a rollout (macOS, MLX or mlx-lm), with its
95 % interval, over stored runs (shared.benchmark.canary)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.text import Text

from coordinator.commands.hosts import (
    ConnectTimeout,
    Hostfile,
    Insecure,
    settings_for,
    targets_from,
)
from coordinator.commands.runs import load_reports
from coordinator.runs.fleet import run_fleet
from coordinator.runs.store import RunStore
from shared.benchmark.canary import SPLITS, CanaryError, canary
from shared.benchmark.matrix import MatrixSpec
from shared.io.cli import data_home, emit, usage_error
from shared.io.options import TableFormat
from shared.safe_text import DETAIL_CAP, shown
from shared.tables import WHOLE, FitTable

CanaryRuns = Annotated[
    str | None,
    typer.Option(
        "--runs",
        help="Comma list of stored benchmark runs (ids or unique prefixes) whose cells are "
        "split: one run with hosts on both sides of the rollout, or one run per side.",
    ),
]
Split = Annotated[
    str,
    typer.Option(
        "--split",
        metavar="|".join(SPLITS).upper(),
        help="The setting that splits the hosts: macos (os_build), mlx (mlx_version), "
        "mlx-lm (mlx_lm_version).",
    ),
]
CanaryHosts = Annotated[
    str | None,
    typer.Option(
        "--hosts",
        help="Comma list of HOST[:PORT] (agents that trust this coordinator) to run the pinned "
        "cell on first.",
    ),
]
Before = Annotated[
    str | None,
    typer.Option("--before", help="The old side's value (default: the lower version)."),
]


PINNED = MatrixSpec(
    n_prompt=(), n_gen=(128,), models=("small",), warmup=1, iterations=20, precision=0.05
)
"""The cell a canary pins on every host with --hosts: tg128 of the built-in small model, -r auto
at 5 %, at most 20 iterations."""


def canary_command(
    split: Split,
    runs: CanaryRuns = None,
    hosts: CanaryHosts = None,
    hostfile: Hostfile = None,
    before: Before = None,
    fmt: TableFormat = "table",
    connect_timeout: ConnectTimeout = 5.0,
    insecure: Insecure = False,
) -> None:
    """The speed delta after a rollout (after / before - 1) with a 95 % interval, over the
    valid cells both sides ran.

    Pin one cell (`coordinator benchmark -p 512 -n 128 -r auto` on every host) and split the
    run by what differs: `~` marks a delta whose interval contains 0 (no change beyond the
    noise). A side with one host has no interval (shown N/A). With --hosts (or --hostfile)
    the pinned cell (tg128 of the built-in small model, -r auto) first runs on every host at
    once, stored as a benchmark run, and joins --runs."""
    if split not in SPLITS:
        raise usage_error(f"--split {shown(split, 40)!r}: choose from {', '.join(SPLITS)}")
    names = [name.strip() for name in (runs or "").split(",") if name.strip()]
    if runs is not None and not names:
        raise usage_error("--runs is empty: name at least one stored run")
    targets = targets_from(hosts, hostfile) if hosts or hostfile else []
    if not names and not targets:
        raise usage_error("name --runs, or --hosts/--hostfile to run the pinned cell on")
    if targets:
        data_home()
        settings = settings_for(insecure, connect_timeout)
        with RunStore() as store:
            names.append(run_fleet(targets, PINNED.to_dict(), store, settings).run_id)
    records = [cell for report in load_reports(*names) for cell in report.get("cells") or []]
    try:
        found = canary(records, split, before)
    except CanaryError as exc:  # it may quote the sides' values: an agent's words
        raise usage_error(shown(str(exc), DETAIL_CAP)) from None
    emit(found.as_dict(), fmt, canary_table)


def percent(value: float | None) -> str:
    return "N/A" if value is None else f"{value * 100:+.1f} %"


def canary_table(found: dict[str, Any]) -> FitTable:
    title = f"mlx-fleet canary: {found['split']} {found['before']} → {found['after']}"
    table = FitTable(title=Text(shown(title)))
    for name in ("cells", "hosts before", "hosts after", "delta", "95 % interval"):
        table.add_column(name, justify="right", wrap=WHOLE)
    interval = found["ci95"]
    delta = percent(found["delta"])
    if interval is not None and interval[0] <= 0 <= interval[1]:
        delta = "~" + delta
    table.add_row(
        str(len(found["cells"])),
        str(found["hosts"]["before"]),
        str(found["hosts"]["after"]),
        delta,
        "N/A" if interval is None else f"{percent(interval[0])} to {percent(interval[1])}",
    )
    return table
