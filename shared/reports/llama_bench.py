"""A benchmark cell as llama-bench writes one, so llama.cpp's scripts/compare-llama-bench.py reads
our runs unchanged (README, Comparing with llama.cpp's script).

The columns, their order and their types are llama-bench's own (llama.cpp
tools/llama-bench/llama-bench.cpp, test::get_fields and test::get_field_type, as vendored in the
llama-cpp-python 0.3.36 source package). compare-llama-bench.py joins a baseline row to a compare
row by SQL equality on its key columns (LLAMA_BENCH_KEYS) and NULL = NULL is false in SQL, so a key
is never NULL: where MLX has no such setting the value is what llama-bench writes for "none"
(0, empty text, `none`). It compares builds by `build_commit`, which holds a label here: the MLX
version unless the operator names another (--label: a macOS build, a host, an mlx-fleet version).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

LLAMA_BENCH_FIELDS: list[tuple[str, str]] = [
    ("build_commit", "TEXT"),
    ("build_number", "INTEGER"),
    ("cpu_info", "TEXT"),
    ("gpu_info", "TEXT"),
    ("backends", "TEXT"),
    ("model_filename", "TEXT"),
    ("model_type", "TEXT"),
    ("model_size", "INTEGER"),
    ("model_n_params", "INTEGER"),
    ("n_batch", "INTEGER"),
    ("n_ubatch", "INTEGER"),
    ("n_threads", "INTEGER"),
    ("cpu_mask", "TEXT"),
    ("cpu_strict", "INTEGER"),
    ("poll", "INTEGER"),
    ("type_k", "TEXT"),
    ("type_v", "TEXT"),
    ("n_gpu_layers", "INTEGER"),
    ("n_cpu_moe", "INTEGER"),
    ("split_mode", "TEXT"),
    ("main_gpu", "INTEGER"),
    ("no_kv_offload", "INTEGER"),
    ("flash_attn", "INTEGER"),
    ("devices", "TEXT"),
    ("tensor_split", "TEXT"),
    ("tensor_buft_overrides", "TEXT"),
    ("load_mode", "TEXT"),
    ("lazy_mode", "TEXT"),
    ("embeddings", "INTEGER"),
    ("no_op_offload", "INTEGER"),
    ("no_host", "INTEGER"),
    ("repack", "INTEGER"),
    ("fit_target", "INTEGER"),
    ("fit_min_ctx", "INTEGER"),
    ("n_prompt", "INTEGER"),
    ("n_gen", "INTEGER"),
    ("n_depth", "INTEGER"),
    ("test_time", "TEXT"),
    ("avg_ns", "INTEGER"),
    ("stddev_ns", "INTEGER"),
    ("avg_ts", "REAL"),
    ("stddev_ts", "REAL"),
]
"""llama-bench's table `llama_bench`, column by column (older llama-bench builds wrote 35 of these;
the compare script selects its columns by name, so a newer set serves it too)."""
LLAMA_BENCH_TABLE = "llama_bench"
LLAMA_BENCH_BOOLS = frozenset({"cpu_strict", "no_kv_offload", "embeddings", "no_host", "repack"})
"""The columns llama-bench's JSON writes as true/false (test::get_field_type's BOOL)."""
LLAMA_BENCH_KEYS = (
    "cpu_info", "gpu_info", "backends", "n_gpu_layers", "n_cpu_moe", "tensor_buft_overrides",
    "model_filename", "model_type", "n_batch", "n_ubatch", "embeddings", "cpu_mask", "cpu_strict",
    "poll", "n_threads", "type_k", "type_v", "load_mode", "no_kv_offload", "split_mode",
    "main_gpu", "tensor_split", "flash_attn", "n_prompt", "n_gen", "n_depth", "fit_target",
    "fit_min_ctx",
)  # fmt: skip
"""compare-llama-bench.py's LLAMA_BENCH_KEY_PROPERTIES: what a baseline and a compare row must
share, by SQL equality, to be compared."""
NO_SETTING: dict[str, Any] = {
    "build_number": 0,
    "n_ubatch": 0,
    "n_threads": 0,
    "cpu_mask": "",
    "cpu_strict": 0,
    "poll": 0,
    "type_k": "",
    "type_v": "",
    "n_cpu_moe": 0,
    "main_gpu": 0,
    "no_kv_offload": 0,
    "flash_attn": 0,
    "devices": "",
    "tensor_split": "",
    "tensor_buft_overrides": "none",
    "load_mode": "",
    "lazy_mode": "",
    "embeddings": 0,
    "no_op_offload": 0,
    "no_host": 0,
    "repack": 0,
    "fit_target": 0,
    "fit_min_ctx": 0,
}
"""llama.cpp's settings MLX has no counterpart of, each as llama-bench writes it unset or off: MLX
picks its threads, KV cache type and kernels itself, and loads safetensors its own way."""
LABEL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+:@/-]{0,63}")
"""A label compare-llama-bench.py can take: its -b/-c name it and it quotes it into SQL as is, so
no space and no quote; at most 64 characters."""


class LabelError(ValueError):
    """A --label the compare script could not use (the message says why)."""


def check_label(label: str) -> str:
    """The label, or LabelError naming what is wrong with it."""
    if not LABEL_PATTERN.fullmatch(label):
        raise LabelError(
            f"--label {label!r}: a label is 1 to 64 characters of letters, digits and ._+:@/- "
            "(compare-llama-bench.py's -b/-c name it, and it quotes it into SQL)"
        )
    return label


def label_lengths_problem(labels: Iterable[str]) -> str | None:
    """Why labels of different lengths cannot be compared, or None when all have one length:
    compare-llama-bench.py cuts every build_commit to the shortest, after which its -b/-c no
    longer name the longer ones (and two labels may become one)."""
    distinct = sorted(set(labels), key=lambda label: (len(label), label))
    if len(distinct) < 2 or len(distinct[0]) == len(distinct[-1]):
        return None
    short, long = distinct[0], distinct[-1]
    return (
        f"labels {short!r} ({len(short)} characters) and {long!r} ({len(long)}) differ in "
        f"length: compare-llama-bench.py cuts every build_commit to the shortest "
        f"({long[: len(short)]!r}), so -b/-c could not name {long!r}; choose labels of one length"
    )


def default_label(machine: dict[str, Any]) -> str:
    """The MLX version the host ran, as build_commit names a build; `unknown` for a report
    stored without one."""
    return str(machine.get("mlx_version") or "unknown")


def gpu_info(machine: dict[str, Any]) -> str:
    """The chip and its GPU cores (`Apple M3 Pro 18-core GPU`; no comma: the compare script
    reads `, ` as between two GPUs); the GPU device where cores are not known; empty with no GPU,
    as llama-bench writes it."""
    if machine.get("gpu_cores"):
        return f"{machine.get('chip') or 'Apple GPU'} {machine['gpu_cores']}-core GPU"
    return str(machine.get("device") or "") if machine.get("backend") == "gpu" else ""


def backends(machine: dict[str, Any]) -> str:
    """`MLX` on the GPU (Metal), `MLX CPU` on MLX's CPU backend, so a GPU run never joins a CPU
    one."""
    return "MLX" if machine.get("backend") == "gpu" else "MLX CPU"


def model_type(label: str, batch_size: int | None) -> str:
    """The model's label, with its batch where it is not 1: llama-bench has no column for
    sequences, and cells of two batch sizes must not be joined as one test."""
    return label if batch_size in (None, 1) else f"{label} b{batch_size}"


def llama_fields(
    record: dict[str, Any],
    machine: dict[str, Any],
    info: dict[str, Any],
    *,
    label: str,
    model_label: str,
    figures: dict[str, Any],
) -> dict[str, Any]:
    """One cell as llama-bench's row: `figures` holds test_time, avg_ns, stddev_ns, avg_ts and
    stddev_ts as the caller computed them; every key column is set (LLAMA_BENCH_KEYS)."""
    group = record.get("group") or {}
    on_gpu = machine.get("backend") == "gpu"
    return {
        **NO_SETTING,
        "build_commit": label,
        "cpu_info": str(machine.get("chip") or ""),
        "gpu_info": gpu_info(machine),
        "backends": backends(machine),
        "model_filename": str(record["model"]),
        "model_type": model_type(model_label, record.get("batch_size")),
        "model_size": info.get("weight_memory_bytes") or 0,
        "model_n_params": info.get("param_count") or 0,
        "n_batch": record.get("prefill_step_size") or 0,
        "n_gpu_layers": 99 if on_gpu else 0,
        "split_mode": group.get("sharding") or "none",
        "n_prompt": record.get("n_prompt") or 0,
        "n_gen": record.get("n_gen") or 0,
        "n_depth": record.get("n_depth") or 0,
        **figures,
    }


def llama_json_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row as llama-bench's `-o json` writes one: its fields, booleans as JSON's, then
    samples_ns and samples_ts."""
    out = {
        name: bool(row[name]) if name in LLAMA_BENCH_BOOLS else row[name]
        for name, _ in LLAMA_BENCH_FIELDS
    }
    return {**out, "samples_ns": row["samples_ns"], "samples_ts": row["samples_ts"]}


def left_out_note(report: dict[str, Any], fmt: str) -> str | None:
    """That cells with no figure are not in a llama-bench format (`fmt`), and where they are."""
    missing = sum(1 for r in report.get("cells") or [] if r.get("tokens_per_sec") is None)
    if fmt not in ("csv", "jsonl", "llama-json") or not missing:
        return None
    return (
        f"{missing} cell{'s' * (missing > 1)} with no figure (failed or not run) left out of "
        f"the {fmt}, as llama-bench leaves them: -o json, or -o sql's mlx_fleet_bench, keeps them"
    )
