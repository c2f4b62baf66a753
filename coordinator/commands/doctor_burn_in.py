"""`coordinator doctor --level 3`, the burn-in: level 2 (coordinator.commands.doctor_levels),
then on every host at once the level-2 cell sustained to steady state (`coordinator benchmark
--sustain`'s machinery, for --duration), then netbench over every link among the hosts, one
pair at a time (coordinator.runs.netbench). Each is judged by shared.reports.burn_in; one
table, a verdict per host; a failing host gets the condition `doctor`, a passing one has its
conditions lifted. Ctrl-C (or SIGTERM) stops the step running, keeps what was measured, skips
the rest and leaves every condition as it was: the table says what was not run."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

from rich.text import Text

from coordinator.commands.benchmark import drive
from coordinator.commands.doctor_levels import (
    FAIL,
    LEVEL_2_SPEC,
    PASS,
    decode_run,
    judged,
    level_two_table,
    not_run,
)
from coordinator.commands.netbench import progress_lines
from coordinator.hosts.link import Settings, Target
from coordinator.runs.fleet import FleetResult, run_fleet
from coordinator.runs.health import with_health
from coordinator.runs.netbench import (
    NetbenchFailed,
    NetbenchPlan,
    NetbenchRun,
    RankWatch,
    run_netbench,
    save_run,
)
from coordinator.runs.probes import STEADY, add_probe, figure_history
from coordinator.runs.store import RunStore
from shared.benchmark.health import family_of
from shared.benchmark.sustain import SustainPlan
from shared.benchmark.verdict import VALID
from shared.distributed.netbench import link_bandwidths
from shared.distributed.rank_env import AUTO
from shared.io.cli import err
from shared.io.signals import sigterm_as_interrupt
from shared.reports.burn_in import (
    LINK_REPETITIONS,
    LINK_SIZES,
    LINK_WARMUP,
    Link,
    every_link,
    judge_links,
    judge_sustained,
)
from shared.safe_text import shown
from shared.tables import WHOLE, WORDS, FitTable

INTERRUPTED = "interrupted: not run"


def level_three(
    rows: list[dict[str, Any]],
    targets: list[Target],
    settings: Settings,
    store: RunStore,
    plan: SustainPlan,
    port: int,
) -> tuple[list[dict[str, Any]], bool, str | None]:
    """The level-1 `rows` judged at level 3; whether it was interrupted; the sustained run's
    id (None: it did not run), the run a failing host's condition names."""
    reachable = [t for t, row in zip(targets, rows, strict=True) if row["reachable"]]
    names = [target.name for target in reachable]
    say(f"level 2 on {len(rows)} hosts: the memory probe, then a decode cell on each")
    level2, stopped = interruptible(
        lambda: (
            drive(names, lambda watch: decode_run(reachable, settings, store, watch))
            if reachable
            else None
        )
    )
    rows = judged(rows, level2, store)
    sustained: FleetResult | None = None
    if reachable and not stopped:
        say(f"sustained run of {plan.duration_s:g} s on {len(reachable)} hosts at once")
        spec = replace(LEVEL_2_SPEC, precision=None).to_dict()
        sustained, stopped = interruptible(
            lambda: drive(
                names,
                lambda watch: run_fleet(reachable, spec, store, settings, watch, plan.to_dict()),
            )
        )
    report = with_health(store, store.load_report(sustained.run_id)) if sustained else {"cells": []}
    links: list[Link] = []
    if not stopped:
        interrupted, stopped = interruptible(
            lambda: measure_links(reachable, settings, store, port, links)
        )
        stopped = stopped or bool(interrupted)
    for row in rows:
        judge_burn_in(row, report, links, store, stopped)
    return rows, stopped, sustained.run_id if sustained else None


def interruptible(step: Any) -> tuple[Any, bool]:
    """`step()`'s result and whether Ctrl-C (or SIGTERM) cut it short: a fleet run says so
    itself (`interrupted`); one caught before its run began or after it ended raises here."""
    try:
        with sigterm_as_interrupt():
            found = step()
    except KeyboardInterrupt:
        return None, True
    return found, bool(getattr(found, "interrupted", False))


def measure_links(
    reachable: list[Target], settings: Settings, store: RunStore, port: int, links: list[Link]
) -> bool:
    """A two-rank netbench over each pair of `reachable`, one after another, each stored as a
    netbench run and added to `links` as it ends; True when interrupted (the pair running is
    stored, the rest are left)."""
    pairs = every_link([target.name for target in reachable])
    by_name = {target.name: target for target in reachable}
    for number, (first, second) in enumerate(pairs, 1):
        say(f"link {number} of {len(pairs)}: netbench {first}↔{second}")
        plan = NetbenchPlan(LINK_SIZES, LINK_REPETITIONS, LINK_WARMUP, port, AUTO)
        run = NetbenchRun(plan, [RankWatch(by_name[first]), RankWatch(by_name[second])])
        link = Link((first, second))
        links.append(link)
        stop = threading.Event()
        try:
            run_netbench(run, settings, stop, progress_lines(plan))
            best = link_bandwidths(run.found)
            link.busbw_gbps = max(best.values()) if best else None
            link.error = None if best else "no send/recv figure came back"
        except NetbenchFailed as exc:
            link.error = str(exc)
        except KeyboardInterrupt:
            stop.set()
            link.error = "interrupted"
            link.run_id = save_run(store, run)
            return True
        link.run_id = save_run(store, run)
    return False


def judge_burn_in(
    row: dict[str, Any],
    report: dict[str, Any],
    links: list[Link],
    store: RunStore,
    stopped: bool,
) -> None:
    """The row's level-2 verdict extended with its sustained run and its links; a valid
    cell's steady figure is kept under the run for later bands (one below its band too, as
    the decode band keeps every valid cell: the band's robust spread is not widened by it)."""
    host = row["host"]
    cell = next((c for c in report["cells"] if c.get("host") == host), None)
    machine = next((h["machine"] for h in report.get("hosts") or [] if h["host"] == host), None)
    family = family_of(machine, (cell or {}).get("settings"))
    run_id = report.get("run_id")
    history = figure_history(store, STEADY, family, run_id)
    missing = INTERRUPTED if stopped else not_run(report, host, "the sustained run")
    row["sustained"], why = judge_sustained(cell, history, missing)
    if not row["reachable"]:
        why = []  # its level 2 says it is unreachable
    row["links"], link_why = judge_links(host, links)
    if stopped and row["reachable"] and not any(link["error"] is None for link in row["links"]):
        link_why.append(f"links {INTERRUPTED}")
    row["why"] += why + link_why
    row["verdict"] = FAIL if row["why"] else PASS
    steady = row["sustained"]["steady_tokens_per_sec"]
    if run_id is not None and steady is not None and (cell or {}).get("verdict") == VALID:
        add_probe(store, run_id, host, STEADY, family, steady, row["sustained"])


def say(line: str) -> None:
    err.print(line, highlight=False, markup=False)


def level_three_table(rows: list[dict[str, Any]]) -> FitTable:
    """Level 2's figures and verdicts (its table, less its verdict column) with the sustained
    run's and the links'."""
    table = FitTable(
        title="mlx-fleet doctor, level 3 (burn-in)",
        folds=("sensor", "decode GB/s", "band", "level 1", "decode tok/s", "memory"),
    )
    two = level_two_table(rows)
    kept = [column for column in two.columns if column.header != "verdict"]
    for column in kept:
        table.add_column(str(column.header), wrap=WHOLE)
    table.add_column("sustained", wrap=WORDS)
    table.add_column("links", wrap=WORDS)
    table.add_column("verdict", wrap=WORDS)
    cells = [list(column.cells) for column in kept]
    for index, row in enumerate(rows):
        table.add_row(
            *(column[index] for column in cells),
            sustained_cell(row["sustained"]),
            links_cell(row["links"]),
            Text(row["verdict"] + (f": {shown('; '.join(row['why']))}" if row["why"] else "")),
            style="red" if row["verdict"] == FAIL else None,
        )
    return table


def sustained_cell(found: dict[str, Any]) -> Text:
    """`41.2 → 38.0 tok/s (0.92)`, with when it throttled, or N/A."""
    first, steady = found["first_tokens_per_sec"], found["steady_tokens_per_sec"]
    if steady is None:
        return Text("N/A" if first is None else f"{first:.1f} → N/A tok/s")
    ratio = found["throttle_ratio"]
    said = f"{first or 0:.1f} → {steady:.1f} tok/s" + ("" if ratio is None else f" ({ratio:.2f})")
    if found["time_to_throttle_s"] is not None:
        said += f"\nthrottled at {found['time_to_throttle_s']:.0f} s"
    return Text(said)


def links_cell(links: list[dict[str, Any]]) -> Text:
    """One line per link, by the host at its other end: `to b: 9.81 GB/s`, `slow`, or
    `failed`."""
    lines = []
    for link in links:
        if link["error"] is not None:
            figure = "failed" if link["error"] != "interrupted" else "interrupted"
        else:
            figure = f"{link['busbw_gbps']:.3g} GB/s" + (" slow" if link["slow"] else "")
        lines.append(f"to {link['peer']}: {figure}")
    return Text(shown("\n".join(lines) or "none"))
