"""Render benchmark reports as a Rich table, Markdown, CSV, JSON or JSON lines.

A report is plain data (`{"machine": ..., "models": [...], "cells": [records]}`) from one agent,
or the same per host from the coordinator (records carry a `host`); unknowns are "N/A", never 0.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rich.console import Console, Group
from rich.text import Text

from shared.benchmark.aggregate import ordered
from shared.benchmark.energy import not_a_meter
from shared.benchmark.matrix import hf_model_id, model_label, named_label
from shared.benchmark.reboots import reboot_panics, rebooted_hosts
from shared.benchmark.results import NOT_RUN, OK, cooling_line
from shared.benchmark.settings import EXPORTED, exported_settings
from shared.benchmark.verdict import judge, verdict_text
from shared.distributed.group import group_label
from shared.distributed.stragglers import mark as straggler_mark
from shared.reports.llama_bench import (
    LLAMA_BENCH_FIELDS,
    LLAMA_BENCH_TABLE,
    default_label,
    llama_fields,
    llama_json_row,
)
from shared.reports.rows import (
    SqlExpression,
    create_sql,
    exported,
    insert_sql,
    nanoseconds,
    rows_csv,
    strict_json,
)
from shared.reports.serving import SERVING_FIELDS, markdown_serving, rich_serving, serving_row
from shared.reports.sustain import markdown_sustain, rich_sustain
from shared.safe_text import DETAIL_CAP, shown
from shared.tables import NATURAL, TEXT, WHOLE, WORDS, FitTable

FORMATS = ("table", "md", "csv", "json", "jsonl", "sql", "llama-json")
ROW_FORMATS = ("csv", "jsonl", "sql", "llama-json")
"""The formats that hold llama-bench's rows (shared.reports.llama_bench), which --label names."""
NA = "N/A"

Record = dict[str, Any]


def human_count(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(int(n))


def mean_std(record: Record, mean_key: str, std_key: str, digits: int = 2) -> str:
    if record.get(mean_key) is None:
        return NA
    if record.get(std_key) is None:  # one sample: the spread is unknown, not zero
        return f"{record[mean_key]:.{digits}f} (n=1)"
    return f"{record[mean_key]:.{digits}f} ± {record[std_key]:.{digits}f}"


def gigabytes(value: float | None) -> str:
    return NA if value is None else f"{value:.3f}"


def celsius(value: float | None) -> str:
    return NA if value is None else f"{value:.1f}"


def soc_temperature(record: Record) -> str:
    """'start → end' in °C (or the pressure level a source gives instead), labelled when the
    source is not a sensor."""
    start, end = record.get("soc_temp_start_c"), record.get("soc_temp_end_c")
    pressure = record.get("pressure_end") or record.get("pressure_start")
    if start is None and end is None:
        if not pressure:
            return NA
        text = f"N/A, pressure {pressure}"
    else:
        text = celsius(end) if start is None else f"{celsius(start)} → {celsius(end)}"
    source = record.get("thermal_source")
    if "simulated" in record.get("flags", []) and source:
        text += f" ({source})"
    return text


def watts(record: Record) -> str:
    """Mean watts over the cell's timed iterations, labelled when the source is not a meter."""
    value = record.get("power_w")
    return NA if value is None else not_a_meter(f"{value:.1f}", record)


def per_joule(record: Record) -> str:
    """Tokens per joule (gross), labelled as watts are."""
    value = record.get("tokens_per_joule")
    return NA if value is None else not_a_meter(f"{value:.3g}", record)


def flags(record: Record) -> str:
    marks = list(record.get("flags") or [])
    if record.get("fastest"):
        marks.insert(0, "fastest")
    if record.get("tokens_check"):
        marks.append(f"tokens {record['tokens_check']}")
    if (record.get("roofline") or {}).get("fraction") is not None:  # shared.benchmark.roofline
        marks.append(f"roofline {record['roofline']['fraction']:.0%}")
    marks += [found for found in (straggler_mark(record),) if found]  # a group cell's
    if record.get("status") == NOT_RUN:
        marks.append(f"not run: {record.get('error')}")
    elif record.get("invalid"):
        marks.append(f"INVALID: {'; '.join(record['invalid'])}")
    elif record.get("status") != OK:
        marks.append(f"FAILED: {record.get('error')}")
    return ", ".join(marks)


def judged(record: Record) -> Record:
    """The record with its verdict: as it came, or (a record stored before verdicts) judged
    from its fields on a copy."""
    return record if "verdict" in record else judge(dict(record))


def verdict(record: Record) -> str:
    """`valid` or `invalid: cold, noisy` (shared.benchmark.verdict.verdict_text)."""
    return verdict_text(judged(record))


def record_model_label(record: Record, label: str | None = None) -> str:
    """The cell's model as labelled (`label`, else the one in the record's name, which is unique
    within its matrix: shared.benchmark.matrix.model_names; else
    shared.benchmark.matrix.model_label), a Hugging Face id given without a revision followed by the
    commit the agent resolved it to. A record stored before labels were made unique shows the label
    it was named with."""
    label = label or named_label(record) or model_label(record["model"], record.get("bits"))
    revision = record.get("model_revision")
    model_id = hf_model_id(record["model"])
    if revision and model_id is not None and model_id.revision is None:
        name, _, bits = label.rpartition("/")
        label = f"{name}@{revision[:7]}/{bits}"
    return label


def progress_line(record: Record) -> str:
    """One log line for a finished cell (used where no live progress bar can be drawn)."""
    where = f"{record['host']} " if record.get("host") else ""
    if record.get("status") != "ok":
        return shown(f"{where}{record['name']}: FAILED: {record.get('error')}", DETAIL_CAP)
    return shown(
        f"{where}{record['name']}: {mean_std(record, 'tokens_per_sec', 'std_tokens_per_sec')}"
        f" tok/s, {mean_std(record, 'latency_ms', 'std_latency_ms')} ms",
        DETAIL_CAP,
    )


Column = tuple[str, Callable[[Record], str]]

COLUMNS: list[Column] = [
    ("model", lambda r: record_model_label(r)),
    ("test", lambda r: r["test"]),
    ("batch", lambda r: NA if r.get("batch_size") is None else str(r["batch_size"])),
    ("tok/s", lambda r: mean_std(r, "tokens_per_sec", "std_tokens_per_sec")),
    ("latency ms", lambda r: mean_std(r, "latency_ms", "std_latency_ms")),
    ("peak GB", lambda r: gigabytes(r.get("peak_memory_gb"))),
    ("active GB", lambda r: gigabytes(r.get("active_memory_gb"))),
    ("SoC °C", soc_temperature),
    ("verdict", verdict),
    ("flags", flags),
]


def host_label(record: Record) -> str:
    """The host, or a group as `mac1+mac2 (2 ranks, tensor, ring)`."""
    group = record.get("group")
    if not group:
        return str(record.get("host", ""))
    return group_label(group["members"], group["sharding"], group["backend"])


def speedup(record: Record) -> str:
    """A group's tok/s over its fastest member's alone on the same cell, `~` where their
    intervals overlap (a ratio inside the noise, as `coordinator compare` marks one)."""
    if record.get("speedup") is None:
        return "" if not record.get("group") else NA
    within = "" if record.get("speedup_separated") else "~"
    return f"{within}{record['speedup']:.2f}× {record['speedup_over']}"


HOST_COLUMN: Column = ("host", host_label)
SPEEDUP_COLUMN: Column = ("speed-up", speedup)
"""Shown when the run has a group (shared.reports.group_cells.mark_groups)."""
REPS_COLUMN: Column = ("reps", lambda r: str(len(r["samples_ms"])) if r.get("samples_ms") else NA)
"""Under -r auto (a cell with a `precision_target`): the timed repetitions each cell took."""
ENERGY_COLUMNS: list[Column] = [("W", watts), ("tok/J", per_joule)]
"""Shown when some cell had a power meter; without any, the header's energy line says N/A."""


def columns_for(records: list[Record]) -> list[Column]:
    columns = list(COLUMNS)
    if any(r.get("energy_source") for r in records):
        at = next(i for i, (name, _) in enumerate(columns) if name == "SoC °C")
        columns[at:at] = ENERGY_COLUMNS
    if any(r.get("group") for r in records):
        at = next(i for i, (name, _) in enumerate(columns) if name == "tok/s") + 1
        columns.insert(at, SPEEDUP_COLUMN)
    if any(r.get("precision_target") is not None for r in records):
        at = next(i for i, (name, _) in enumerate(columns) if name == "latency ms") + 1
        columns.insert(at, REPS_COLUMN)
    return [HOST_COLUMN, *columns] if any("host" in r for r in records) else columns


def model_line(info: dict[str, Any]) -> str:
    params, weights = info.get("param_count"), info.get("weight_memory_gb")
    if info.get("ranks"):  # a group's: each rank holds its share, and no rank the model
        shares = ", ".join(f"{share.get('host')} {_count(share)}" for share in info["ranks"])
        kind = info.get("model_type") or "?"
        return f"model {info.get('label')} ({kind}) split, params per rank: {shares}"
    return (
        f"model {info.get('label')} ({info.get('model_type') or '?'}): "
        f"{NA if params is None else human_count(params)} params, "
        f"{NA if weights is None else f'{weights:.3f}'} GB weights"
    )


def _count(share: dict[str, Any]) -> str:
    return NA if share.get("param_count") is None else human_count(share["param_count"])


def cpu_split(levels: dict[str, int] | None) -> str | None:
    """`8P+4E`, or the level names macOS gives (an M5 Max: `6 Super+12 Performance`)."""
    if not levels:
        return None
    if set(levels) <= {"Performance", "Efficiency"}:
        return "+".join(f"{count}{name[0]}" for name, count in levels.items())
    return "+".join(f"{count} {name}" for name, count in levels.items())


def hardware_details(machine: dict[str, Any]) -> list[str]:
    """What tells two Macs of one name apart: model, GPU cores, CPU split, Metal's working
    set, and a Python translated by Rosetta (its numbers are not the Mac's)."""
    details = [machine.get("hw_model")]
    if machine.get("gpu_cores"):
        details.append(f"{machine['gpu_cores']}-core GPU")
    details.append(cpu_split(machine.get("cpu_levels")))
    if machine.get("metal_working_set_bytes"):
        details.append(f"Metal working set {machine['metal_working_set_bytes'] / 2**30:.1f} GiB")
    if machine.get("rosetta"):
        details.append("PYTHON UNDER ROSETTA (x86_64)")
    return [detail for detail in details if detail]


def memory_text(machine: dict[str, Any]) -> str:
    """GiB as macOS shows it (a 16 GB Mac: 16); reports stored before show decimal GB."""
    if machine.get("memory_gib") is not None:
        return f"{machine['memory_gib']:g} GiB RAM"
    if machine.get("memory_gb") is not None:
        return f"{machine['memory_gb']:.1f} GB RAM"
    return "RAM unknown"


def machine_line(machine: dict[str, Any], address: str | None = None) -> str:
    """`hostname: device ...`, or `address (hostname): ...` for a host of a fleet."""
    hostname = machine.get("hostname", "?")
    where = f"{address} ({hostname})" if address and address != hostname else hostname
    os_name = machine.get("os", "?")
    if machine.get("macos_version"):
        os_name = f"macOS {machine['macos_version']}"
    line = (
        f"{where}: {machine.get('device', '?')} "
        f"({machine.get('backend', '?')}), {memory_text(machine)}, "
        f"{os_name}, MLX {machine.get('mlx_version', '?')}, "
        f"mlx-fleet {machine.get('mlx_fleet_version') or 'version unknown'}"
    )
    details = hardware_details(machine)
    return f"{line}; {', '.join(details)}" if details else line


def energy_line(energy: dict[str, Any] | None, records: list[Record]) -> str | None:
    """Where a host's energy came from: the report's `energy` (agent bench) or else what its
    cells say; None when nothing was metered or asked for."""
    measured = next((r for r in records if r.get("energy_source")), None)
    if energy is None and measured is None:
        return None
    if energy is not None and not energy.get("present", True):
        return f"energy: N/A ({energy.get('note') or 'no power meter'})"
    source = (energy or {}).get("source") or (measured or {}).get("energy_source")
    simulated = (energy or {}).get("simulated") or (measured or {}).get("energy_simulated")
    rails = (energy or {}).get("rails") or (measured or {}).get("energy_rails") or []
    text = f"energy: {source} ({', '.join(rails) or 'no rail yet'})"
    text += ", SIMULATED: not a meter" if simulated else ", the vendor's estimates, machine-wide"
    idle = (energy or {}).get("idle_w")
    if idle is None and measured is not None:
        idle = measured.get("idle_power_w")
    text += f"; idle {idle:.2f} W" if idle is not None else "; no idle baseline"
    return text


NO_PANIC_REPORT = (
    "no new panic report in /Library/Logs/DiagnosticReports "
    "(a power cut, a forced or an ordinary restart leaves none)"
)
NO_PANIC_STRING = "no panic string read"


def reboot_lines(host: str, records: list[Record]) -> list[str]:
    """That `host` rebooted during the run, with the panic reports its cells carried after the
    reboot (shared.benchmark.reboots), each name and panic string shown() as the peer's words they
    are; nothing more where its cells did not look (not a Mac, an older agent)."""
    line = f"{host + ': ' if host else ''}the machine rebooted during it"
    panics = reboot_panics(records, host)
    if panics is None:
        return [line]
    if not panics:
        return [f"{line}; {NO_PANIC_REPORT}"]
    told = [
        f"panic report {shown(p.get('file'))}: {shown(p.get('panic_string') or NO_PANIC_STRING)}"
        for p in panics
    ]
    return [f"{line}; {told[0]}", *(f"  {more}" for more in told[1:])]


def header_lines(report: dict[str, Any]) -> list[str]:
    """Device, model and energy lines: one set per host for a fleet report."""
    hosts = report.get("hosts") or [report]
    lines: list[str] = []
    for host in hosts:
        if host.get("machine"):
            lines.append(machine_line(host["machine"], host.get("host")))
        elif host.get("host"):
            lines.append(f"{host['host']}: no machine information")
        lines.extend(f"  {model_line(info)}" for info in host.get("models", []))
        every = report.get("cells", [])
        cells = [r for r in every if host is report or r.get("host") == host.get("host")]
        energy = energy_line(host.get("energy"), cells)
        lines += [f"  {line}" for line in (energy, cooling_line(cells)) if line]
        if host.get("error"):
            lines.append(f"  FAILED: {host['error']}")
    for name in rebooted_hosts(report.get("cells", [])):  # boot times differ between cells
        lines.extend(reboot_lines(name, report.get("cells", [])))
    if report.get("interrupted"):
        lines.append("interrupted: only the cells finished before the interrupt are shown")
    return lines


def rich_report(report: dict[str, Any]) -> Group:
    """The header lines (device, versions, models) above the table."""
    lines = [shown(line, DETAIL_CAP) for line in header_lines(report)]
    header = Text("\n".join(lines), style="dim")
    cells = report["cells"]
    return Group(header, rich_table(report), *rich_sustain(cells), *rich_serving(cells))


BENCH_FOLDS = (
    "active GB",
    "reps",
    "peak GB",
    "tok/J",
    "W",
    "latency ms",
    "batch",
    "SoC °C",
    "verdict",
)
"""The columns a narrow terminal drops, the first first (shared.tables); host, model, test,
tok/s, a group's speed-up and flags (where a failure says why) always stay."""


def rich_table(report: dict[str, Any]) -> FitTable:
    records = report["cells"]
    title = Text(shown(report.get("title", "mlx-fleet benchmark")))
    table = FitTable(title=title, folds=BENCH_FOLDS)
    cols = columns_for(records)
    for name, _ in cols:
        left = name in ("host", "model", "test", "verdict", "flags")
        wrap = TEXT if name == "flags" else WORDS if name in ("verdict", "host") else WHOLE
        table.add_column(name, justify="left" if left else "right", wrap=wrap)
    for record in ordered(records):
        style = None if record.get("status") == "ok" else "red"
        table.add_row(*(Text(shown(render(record), DETAIL_CAP)) for _, render in cols), style=style)
    return table


def to_markdown(report: dict[str, Any]) -> str:
    records = report["cells"]
    cols = columns_for(records)
    lines = [
        f"<!-- {exported(line.strip()).replace('--', '- -')} -->" for line in header_lines(report)
    ]
    lines += markdown_table(
        [name for name, _ in cols], ([render(r) for _, render in cols] for r in ordered(records))
    )
    lines += markdown_sustain(records) + markdown_serving(records)
    return "\n".join(lines) + "\n"


def markdown_table(names: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A Markdown table's lines: each cell exported() and its `|` escaped."""
    lines = ["| " + " | ".join(names) + " |", "| " + " | ".join("---" for _ in names) + " |"]
    for row in rows:
        lines.append("| " + " | ".join(exported(c).replace("|", "\\|") for c in row) + " |")
    return lines


SUSTAIN_SUMMARY = (
    "duration_s",
    "window_s",
    "first_tokens_per_sec",
    "steady_tokens_per_sec",
    "throttle_ratio",
    "time_to_throttle_s",
    "temp_rise_c",
    "mean_power_w",
    "pause_s",
)
"""A sustained cell's figures as row columns (sustain_*); its windows are in the JSON."""
ENERGY_FIELDS = (
    "energy_source",
    "energy_simulated",
    "energy_j",
    "energy_net_j",
    "energy_window_s",
    "power_w",
    "idle_power_w",
    "tokens_per_joule",
    "joules_per_token",
    "energy_note",
)
"""A cell's energy (docs/energy.md) as row columns, as the record names them."""

ROW_FIELDS: list[tuple[str, str]] = [
    ("host", "TEXT"),
    ("hostname", "TEXT"),
    ("cpu_info", "TEXT"),
    ("gpu_info", "TEXT"),
    ("backends", "TEXT"),
    ("mlx_version", "TEXT"),
    ("mlx_fleet_version", "TEXT"),
    ("model_filename", "TEXT"),
    ("model_type", "TEXT"),
    ("model_size", "INTEGER"),
    ("model_n_params", "INTEGER"),
    ("bits", "INTEGER"),
    ("n_batch", "INTEGER"),
    ("batch_size", "INTEGER"),
    ("n_prompt", "INTEGER"),
    ("n_gen", "INTEGER"),
    ("n_depth", "INTEGER"),
    ("test", "TEXT"),
    ("test_time", "TEXT"),
    ("avg_ns", "INTEGER"),
    ("stddev_ns", "INTEGER"),
    ("avg_ts", "REAL"),
    ("stddev_ts", "REAL"),
    ("min_ns", "INTEGER"),
    ("median_ns", "INTEGER"),
    ("peak_memory_gb", "REAL"),
    ("active_memory_gb", "REAL"),
    ("soc_temp_start_c", "REAL"),
    ("soc_temp_end_c", "REAL"),
    ("pressure_start", "TEXT"),
    ("pressure_end", "TEXT"),
    ("pause_s", "REAL"),
    ("thermal_source", "TEXT"),
    ("energy_source", "TEXT"),
    ("energy_simulated", "INTEGER"),
    ("energy_rails", "TEXT"),
    ("energy_j", "REAL"),
    ("energy_net_j", "REAL"),
    ("energy_window_s", "REAL"),
    ("power_w", "REAL"),
    ("idle_power_w", "REAL"),
    ("tokens_per_joule", "REAL"),
    ("joules_per_token", "REAL"),
    ("energy_note", "TEXT"),
    *((f"sustain_{key}", "REAL") for key in SUSTAIN_SUMMARY),
    ("ranks", "INTEGER"),
    ("distributed_backend", "TEXT"),
    ("sharding", "TEXT"),
    ("speedup", "REAL"),
    ("speedup_over", "TEXT"),
    ("speedup_separated", "INTEGER"),
    ("tokens_check", "TEXT"),
    *SERVING_FIELDS,
    *((key, "TEXT") for key in EXPORTED),
    ("status", "TEXT"),
    ("verdict", "TEXT"),
    ("verdict_reasons", "TEXT"),
    ("flags", "TEXT"),
    ("error", "TEXT"),
    ("samples_ns", "TEXT"),
]
"""One cell as a flat row (csv, jsonl, and sql's table mlx_fleet_bench), after llama-bench's
columns (shared.reports.llama_bench) in csv and jsonl, and named as llama-bench names a column
that means the same (llama.cpp tools/llama-bench/llama-bench.cpp, test::get_fields): model_filename
(what --model named), model_type (the model's label, with its batch where it is not 1),
model_size (weight bytes), model_n_params,
n_batch (prompt tokens per forward pass: our --prefill-step-size), n_prompt, n_gen, n_depth,
test_time (RFC 3339, UTC, when the cell began), avg_ns / stddev_ns (time of one timed
iteration), avg_ts / stddev_ts (tokens/s: mean and sample deviation of the per-iteration rates),
cpu_info, gpu_info, backends. The rest are ours: batch_size counts sequences, which llama-bench
has no column for; energy_* a cell's energy and sustain_* a sustained cell's summary
(docs/energy.md; energy_simulated says the figures come from a model, not a meter); ranks,
distributed_backend and sharding a distributed group's (empty for one host), speedup its tok/s
over speedup_over's alone (speedup_separated: beyond the noise) and tokens_check its greedy
tokens against a member's (shared.reports.group_cells); verdict `valid` or `invalid` and
verdict_reasons why (shared.benchmark.verdict; comma-joined in csv and sql).
Then its settings (EXPORTED). An unknown is empty (csv) or NULL (sql), never a number, but in
llama-bench's key columns, which hold what llama-bench writes for "none"."""
SQL_TABLE = "mlx_fleet_bench"
SQL_FIELDS = [("llama_bench_rowid", "INTEGER"), ("build_commit", "TEXT"), *ROW_FIELDS]
"""The table of everything of ours, keyed to llama_bench's row by its rowid (NULL for a cell
with no figure: it failed or did not run, and llama-bench writes no row for such a test)."""
LINE_FIELDS = [
    *(name for name, _ in LLAMA_BENCH_FIELDS),
    *(name for name, _ in ROW_FIELDS if name not in dict(LLAMA_BENCH_FIELDS)),
]
"""A csv or jsonl line's columns: llama-bench's, then ours."""


def _machines(report: dict[str, Any]) -> dict[Any, dict[str, Any]]:
    """Each host's machine facts by its name in the report (an agent's report: its own)."""
    if "hosts" in report:
        return {host.get("host"): host.get("machine") or {} for host in report["hosts"]}
    return {None: report.get("machine") or {}}


def _models(report: dict[str, Any]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Each model built, by (host, model, bits)."""
    hosts = report.get("hosts") or [report]
    return {
        (host.get("host"), info.get("model"), info.get("bits")): info
        for host in hosts
        for info in host.get("models") or []
    }


def bench_rows(report: dict[str, Any], label: str | None = None) -> list[dict[str, Any]]:
    """Every cell of the report as a row of llama-bench's columns and ROW_FIELDS, with its
    host's machine and its model; build_commit is `label`, else the host's MLX version."""
    machines, models = _machines(report), _models(report)
    rows = []
    for record in ordered(report["cells"]):
        host = record.get("host")
        verdict_of = judged(record)
        machine = machines.get(host) or machines.get(None) or {}
        key = (host if "hosts" in report else None, record["model"], record.get("bits"))
        info = models.get(key) or {}
        sustain = record.get("sustain") or {}
        group = record.get("group") or {}
        figures = {
            "test_time": record.get("test_time") or "",
            "avg_ns": nanoseconds(record.get("latency_ms")),
            "stddev_ns": nanoseconds(record.get("std_latency_ms")),
            "avg_ts": record.get("tokens_per_sec"),
            "stddev_ts": record.get("std_tokens_per_sec"),
        }
        row = {
            "host": host or machine.get("hostname"),
            "hostname": machine.get("hostname"),
            "mlx_version": machine.get("mlx_version"),
            "mlx_fleet_version": machine.get("mlx_fleet_version"),
            "bits": record.get("bits"),
            "batch_size": record["batch_size"],
            "test": record["test"],
            "min_ns": nanoseconds(record.get("min_latency_ms")),
            "median_ns": nanoseconds(record.get("median_latency_ms")),
            "peak_memory_gb": record.get("peak_memory_gb"),
            "active_memory_gb": record.get("active_memory_gb"),
            "soc_temp_start_c": record.get("soc_temp_start_c"),
            "soc_temp_end_c": record.get("soc_temp_end_c"),
            "pressure_start": record.get("pressure_start"),
            "pressure_end": record.get("pressure_end"),
            "pause_s": record.get("pause_s"),
            "thermal_source": record.get("thermal_source"),
            "status": record.get("status"),
            "verdict": verdict_of.get("verdict"),
            "verdict_reasons": list(verdict_of.get("verdict_reasons") or []),
            "flags": ";".join(
                ["fastest"] * bool(record.get("fastest")) + (record.get("flags") or [])
            ),
            "error": record.get("error"),
            "samples_ns": [nanoseconds(s) for s in record.get("samples_ms") or []],
            **{key: record.get(key) for key in ENERGY_FIELDS},
            "energy_rails": ";".join(record.get("energy_rails") or []) or None,
            **{f"sustain_{key}": sustain.get(key) for key in SUSTAIN_SUMMARY},
            "ranks": group.get("ranks"),
            "distributed_backend": group.get("backend"),
            "sharding": group.get("sharding"),
            "speedup": record.get("speedup"),
            "speedup_over": record.get("speedup_over"),
            "speedup_separated": record.get("speedup_separated"),
            "tokens_check": record.get("tokens_check"),
            **serving_row(record),
            **exported_settings(record),
        }
        row |= llama_fields(
            record,
            machine,
            info,
            label=label or default_label(machine),
            model_label=info.get("label") or record_model_label(record),
            figures=figures,
        )
        rows.append(row)
    return rows


def measured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with a figure, as llama-bench writes them: a failed or unrun cell has none."""
    return [row for row in rows if row["avg_ts"] is not None]


def flat_rows(report: dict[str, Any], label: str | None = None) -> list[dict[str, Any]]:
    """bench_rows with their lists joined, as csv and sql hold them."""
    rows = bench_rows(report, label)
    for row in rows:
        row["samples_ns"] = ";".join(map(str, row["samples_ns"]))
        row["verdict_reasons"] = ",".join(row["verdict_reasons"])
    return rows


def to_csv(report: dict[str, Any], label: str | None = None) -> str:
    """llama-bench's csv (the cells with a figure), with our columns after its own."""
    return rows_csv(LINE_FIELDS, measured(flat_rows(report, label)))


def to_sql(report: dict[str, Any], label: str | None = None) -> str:
    """llama-bench's `-o sql` (CREATE TABLE IF NOT EXISTS llama_bench, one INSERT per llama-bench
    test with a figure: not a serving cell), each followed by its row of ours in mlx_fleet_bench,
    every cell there: `agent bench -o sql | sqlite3 llama-bench.sqlite` adds runs to one database
    that compare-llama-bench.py reads as it is."""
    lines = [create_sql(LLAMA_BENCH_TABLE, LLAMA_BENCH_FIELDS), create_sql(SQL_TABLE, SQL_FIELDS)]
    for row in flat_rows(report, label):
        row["llama_bench_rowid"] = None
        if row["avg_ts"] is not None and row["serve_loop"] is None:
            lines.append(insert_sql(LLAMA_BENCH_TABLE, LLAMA_BENCH_FIELDS, row))
            row["llama_bench_rowid"] = SqlExpression("last_insert_rowid()")
        lines.append(insert_sql(SQL_TABLE, SQL_FIELDS, row))
    return "\n".join(lines) + "\n"


def to_json(report: dict[str, Any], label: str | None = None) -> str:
    return strict_json(report, indent=2) + "\n"


def _with_rates(report: dict[str, Any], label: str | None) -> list[dict[str, Any]]:
    """bench_rows (with a figure) with llama-bench's samples_ts: each iteration's tokens/s."""
    rows = bench_rows(report, label)
    for row, record in zip(rows, ordered(report["cells"]), strict=True):
        row["samples_ts"] = record.get("samples_tokens_per_sec") or []
    return measured(rows)


def to_jsonl(report: dict[str, Any], label: str | None = None) -> str:
    """llama-bench's jsonl (one line per cell with a figure), with our keys after its own."""
    lines = [
        strict_json({name: row[name] for name in [*LINE_FIELDS, "samples_ts"]})
        for row in _with_rates(report, label)
    ]
    return "\n".join(lines) + ("\n" if lines else "")


def llama_json_rows(report: dict[str, Any], label: str | None = None) -> list[dict[str, Any]]:
    """The cells with a figure as llama-bench's `-o json` writes them, its keys only."""
    return [llama_json_row(row) for row in _with_rates(report, label) if row["serve_loop"] is None]


def to_llama_json(report: dict[str, Any], label: str | None = None) -> str:
    """llama-bench's `-o json`: one array of its rows."""
    return strict_json(llama_json_rows(report, label), indent=2) + "\n"


def drawn_text(renderable: Any, width: int) -> str:
    """`renderable` as Rich draws it at `width`, or at its natural width when wider: a file has
    no terminal to fold columns for."""
    console = Console(width=NATURAL, record=True, file=io.StringIO())
    console.width = max(width, console.measure(renderable).maximum)
    console.print(renderable)
    return console.export_text()


def render_text(
    report: dict[str, Any], fmt: str, width: int = 160, label: str | None = None
) -> str:
    """The report in any of FORMATS as text (the table: drawn_text); `label` is build_commit in
    the ROW_FORMATS (default: each host's MLX version)."""
    if fmt == "table":
        return drawn_text(rich_report(report), width)
    if fmt == "md":
        return to_markdown(report)
    renderers = {"csv": to_csv, "json": to_json, "jsonl": to_jsonl, "sql": to_sql}
    return {**renderers, "llama-json": to_llama_json}[fmt](report, label)
