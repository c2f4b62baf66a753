"""The roofline on generation cells (shared/benchmark/roofline.py): mlx-lm's published M4 Max
Qwen3-4B 4-bit figure, a fabricated one, and the chips it cannot judge."""

from __future__ import annotations

import pytest

from shared.benchmark import roofline
from shared.benchmark.roofline import SUSPECT, is_suspect, mark_roofline

M4_MAX = {"chip": "Apple M4 Max", "gpu_cores": 40, "backend": "gpu"}
QWEN3_4B_4BIT = {
    "model": "mlx-community/Qwen3-4B-4bit",
    "bits": None,
    "weight_memory_bytes": round(4.022e9 * 4.5 / 8),
    "kv_bytes_per_position": 36 * 2 * 8 * 128 * 2,
}
"""Qwen3-4B: 4.02 B parameters at 4 bits with a 16-bit scale and bias per 64 (4.5 bits each,
as mlx-lm quantizes), 36 layers, 8 KV heads of 128 (its config.json)."""


def decode(speed: float, **more: object) -> dict:
    return {"mode": "decode", "status": "ok", "tokens_per_sec": speed, "batch_size": 1,
            "n_depth": 0, "n_gen": 128, **more}  # fmt: skip


def test_mlx_lms_published_m4_max_qwen3_4b_figure_is_56_percent_of_its_roofline() -> None:
    """mlx-lm's BENCHMARKS.md: M4 Max, Qwen3-4B 4-bit, 134.5 tok/s generation."""
    found = roofline.roofline(decode(134.5), M4_MAX, QWEN3_4B_4BIT)
    assert found is not None
    assert found["fraction"] == pytest.approx(0.56, abs=0.01)
    assert found["ceiling_tokens_per_sec"] == pytest.approx(241, abs=2)
    assert found["bandwidth_gbs"] == 546.0 and found["kv"] == "included"
    assert not is_suspect(found) and found["why"] is None


def test_a_fabricated_2x_result_is_suspect_and_so_is_a_far_too_slow_one() -> None:
    doubled = roofline.roofline(decode(2 * 134.5), M4_MAX, QWEN3_4B_4BIT)
    assert is_suspect(doubled) and "measurement bug" in doubled["why"]
    crawling = roofline.roofline(decode(40.0), M4_MAX, QWEN3_4B_4BIT)
    assert is_suspect(crawling) and "swap, unwired memory" in crawling["why"]


def test_the_kv_cache_at_depth_counts_and_a_batch_shares_the_weights() -> None:
    shallow = roofline.roofline(decode(100.0), M4_MAX, QWEN3_4B_4BIT)
    deep = roofline.roofline(decode(100.0, n_depth=32768), M4_MAX, QWEN3_4B_4BIT)
    assert deep["bytes_per_token"] - shallow["bytes_per_token"] == 32768 * 147456
    batched = roofline.roofline(decode(400.0, batch_size=4), M4_MAX, QWEN3_4B_4BIT)
    assert batched["fraction"] < 4 * shallow["fraction"]  # four tokens a step, weights read once


def test_chips_it_cannot_judge_say_why_and_are_never_suspect() -> None:
    epyc = roofline.roofline(decode(50.0), {"chip": "AMD EPYC", "backend": "cpu"}, QWEN3_4B_4BIT)
    assert epyc["fraction"] is None and "AMD EPYC" in epyc["why"] and not is_suspect(epyc)
    unsure = roofline.roofline(decode(50.0), {"chip": "Apple M4 Max"}, QWEN3_4B_4BIT)
    assert unsure["fraction"] is None and "32-core GPU: 410 GB/s" in unsure["why"]
    assert roofline.roofline(decode(50.0), M4_MAX, {})["why"] == (
        "the model's weight bytes are unknown"
    )
    assert roofline.roofline({**decode(50.0), "mode": "prefill"}, M4_MAX, QWEN3_4B_4BIT) is None


def test_a_reports_decode_cells_carry_their_roofline_and_the_suspect_flag() -> None:
    host = {"host": "mac1", "machine": M4_MAX, "models": [QWEN3_4B_4BIT]}
    cells = [
        {**decode(269.0), "host": "mac1", "model": QWEN3_4B_4BIT["model"], "bits": None,
         "flags": []},
        {**decode(130.0), "host": "mac1", "model": QWEN3_4B_4BIT["model"], "bits": None,
         "flags": [SUSPECT]},
        {"mode": "prefill", "status": "ok", "tokens_per_sec": 900.0, "host": "mac1"},
    ]  # fmt: skip
    marked = mark_roofline({"hosts": [host], "cells": cells})
    assert marked[0]["flags"] == [SUSPECT] and marked[0]["roofline"]["fraction"] > 1
    assert marked[1]["flags"] == [] and 0.25 < marked[1]["roofline"]["fraction"] < 1
    assert "roofline" not in marked[2]


def test_one_macs_report_marks_its_cells_from_its_own_machine_and_models() -> None:
    """`agent bench`'s report: `machine` and `models` at the top, cells named by hostname."""
    cell = {**decode(269.0), "host": "mbp", "model": QWEN3_4B_4BIT["model"], "bits": None}
    report = {"machine": M4_MAX, "models": [QWEN3_4B_4BIT], "cells": [cell]}
    (marked,) = mark_roofline(report)
    assert marked["flags"] == [SUSPECT] and marked["roofline"]["bandwidth_gbs"] == 546.0


def test_the_table_and_markdown_show_the_fraction_beside_the_flags() -> None:
    from shared.reports.benchmark import flags

    record = {"status": "ok", "flags": [SUSPECT], "roofline": {"fraction": 1.12}}
    assert flags(record) == "suspect, roofline 112%"
    assert flags({"status": "ok", "flags": [], "roofline": {"fraction": None}}) == ""
