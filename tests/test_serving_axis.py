"""The serving axis of the matrix (shared.benchmark.serving): its cells and names, its wire form,
its bad input (one line, exit 2, before any cell runs), the open loop's arrivals, the saturation
rule, a serving record's shape and its rows and table (issue 46)."""

from __future__ import annotations

import io
import json
import statistics
from dataclasses import fields
from pathlib import Path

import pytest
import typer
import typer.testing
from rich.console import Console

from agent.cli import app as agent_app
from coordinator.cli import app as coordinator_app
from coordinator.reports.compare import as_fleet_report, compare_reports
from coordinator.reports.compare_serving import serving_comparison
from shared import shapes
from shared.benchmark.matrix import MatrixError, MatrixSpec, expand, named_label
from shared.benchmark.serving import (
    ServingSpec,
    arrival_offsets,
    parse_prompt_file,
    per_output_token,
    saturated,
)
from shared.benchmark.serving_figures import RequestTiming
from shared.benchmark.verdict import SATURATED, judge
from shared.io.cli import usage_error
from shared.io.options import MatrixOptions, ServingOptions, with_options
from shared.reports.benchmark import render_text
from shared.reports.serving import rich_serving
from shared.wire.agent_shapes import record as check_record
from tests.conftest import refusal, run_cli
from tests.test_cli_kit import command, options_of


def serving_spec(**serving: object) -> MatrixSpec:
    return MatrixSpec(
        n_prompt=(32,), n_gen=(16,), models=("small",), serving=ServingSpec(**serving)
    )


def test_each_load_point_is_a_cell_named_serve_c_or_r() -> None:
    cells = expand(serving_spec(concurrency=(1, 4), request_rates=(2.0,)))
    assert [c.name for c in cells] == [
        "small/f16 serve c1",
        "small/f16 serve c4",
        "small/f16 serve r2.0",
    ]
    record = cells[1].to_dict()
    assert (record["mode"], record["concurrency"], record["n_prompt"]) == ("serve", 4, 32)
    assert named_label(record) == "small/f16"
    plain = expand(MatrixSpec(models=("small",)))[0].to_dict()
    assert "concurrency" not in plain and "request_rate" not in plain


def test_lengths_that_vary_name_their_tests() -> None:
    spec = MatrixSpec(
        n_prompt=(32, 64), n_gen=(16,), models=("small",), serving=ServingSpec(concurrency=(2,))
    )
    assert [c.test for c in expand(spec)] == ["serve c2 pp32+tg16", "serve c2 pp64+tg16"]


def test_the_spec_travels_and_a_peers_bad_one_is_refused_by_field() -> None:
    spec = serving_spec(concurrency=(1,), request_rates=(0.5,), requests=8, seed=3)
    assert MatrixSpec.from_dict(spec.to_dict()) == spec
    assert "serving" not in MatrixSpec(models=("small",)).to_dict()
    data = spec.to_dict()
    data["serving"]["concurrency"] = [0]
    with pytest.raises(MatrixError, match=r"serving.concurrency\[0\]: 0 is not a whole number"):
        MatrixSpec.from_dict(data)
    data["serving"] = {"concurrency": [1], "flavour": 1}
    with pytest.raises(MatrixError, match="unknown field"):
        MatrixSpec.from_dict(data)


def test_a_prompt_file_is_jsonl_in_mlx_lms_request_shape() -> None:
    text = (
        '{"prompt": "Explain quantum computing."}\n\n'
        '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}\n'
    )
    first, second = parse_prompt_file(text, "p.jsonl")
    assert first.messages == (("user", "Explain quantum computing."),)
    assert (second.text, second.max_tokens) == ("Hi", 4)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("Explain quantum computing.\n", "line 1 is not JSON"),
        ('{"max_tokens": 3}\n', "line 1: no prompt"),
        ('{"prompt": ""}\n', "has no text"),
        ("\n\n", "no prompt in it"),
        ('{"prompt": "a", "max_tokens": 0}\n', "max_tokens 0 is not 1 to 8192"),
    ],
)
def test_a_prompt_file_that_cannot_serve_is_refused(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_prompt_file(text, "p.jsonl")


def probe_app() -> typer.Typer:
    """A command taking the matrix and the serving axis as `agent bench` does, in process."""

    @with_options
    def probe(matrix: MatrixOptions, serving: ServingOptions) -> None:
        try:
            serving.apply(matrix.spec())
        except MatrixError as exc:
            raise usage_error(str(exc)) from None

    app = typer.Typer()
    app.command()(probe)
    return app


@pytest.mark.parametrize(
    ("options", "line"),
    [
        (["--concurrency", "0"], "--concurrency item 1: 0 is not a whole number of clients"),
        (["--concurrency", "2000"], "from 1 to 1024"),
        (["--request-rate", "0"], "--request-rate: 0 must be above 0"),
        (["--request-rate", "fast"], "--request-rate: 'fast' is not a number"),
        (["--request-rate", "nan"], "--request-rate: 'nan' is not a finite number"),
        (["--concurrency", "1", "--slo-ttft", "-5"], "--slo-ttft must be > 0 ms"),
        (["--concurrency", "1", "--slo-tpot", "0"], "--slo-tpot must be > 0 ms"),
        (["--concurrency", "1", "-b", "4"], "--batch-sizes: a serving cell's batch is its load"),
        (["--concurrency", "1", "-d", "64"], "--n-depth: a serving cell's requests start"),
        (["--requests", "4"], "--requests applies to serving tests"),
        (
            ["--concurrency", "1", "--requests", "10000", "-p", "1024"],
            "a pass would send 10240000 prompt tokens (10000 requests of up to 1024)",
        ),
        (
            ["--request-rate", "0.01"],
            "--request-rate item 1: 16 requests at 0.01/s would take 1600 s a pass, past 600 s",
        ),
    ],
)
def test_bad_serving_input_is_one_line_and_exit_2(options: list[str], line: str) -> None:
    result = typer.testing.CliRunner().invoke(probe_app(), ["--config-small", *options])
    assert result.exit_code == 2
    assert line in result.output and len(result.output.strip().splitlines()) == 1


def test_bench_and_benchmark_take_the_same_serving_axis() -> None:
    bench = options_of(command(agent_app, "bench"), ServingOptions)
    assert bench == options_of(command(coordinator_app, "benchmark"), ServingOptions)
    assert len(bench) == len(fields(ServingOptions))


@pytest.mark.slow
def test_agent_bench_refuses_bad_serving_input_before_any_cell() -> None:
    line = refusal("agent", "bench", "--config-small", "--request-rate", "-1")
    assert line == "error: --request-rate: -1 must be above 0 (requests per second)"


@pytest.mark.slow
def test_a_prompt_file_is_checked_on_the_coordinator_before_any_host(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text("one prompt per line, as mlx-lm's own file\n")
    result = run_cli(
        "coordinator", "benchmark", "--config-small", "--concurrency", "1", "--prompt-file",
        str(path), "--hosts", "127.0.0.1:1",
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: --prompt-file {path}: line 1 is not JSON"


def test_arrivals_are_poisson_at_the_rate_and_seeded() -> None:
    offsets = arrival_offsets(4.0, 4000, seed=7)
    assert offsets == arrival_offsets(4.0, 4000, seed=7) != arrival_offsets(4.0, 4000, seed=8)
    gaps = [b - a for a, b in zip([0.0, *offsets], offsets, strict=False)]
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.05)  # exponential: sd = mean


def test_an_engine_that_fell_behind_its_rate_is_saturated() -> None:
    kept_up = [RequestTiming(i * 1.0, i + 0.1, (i + 0.2,)) for i in range(10)]
    assert not saturated(kept_up)
    behind = [RequestTiming(i * 0.1, 0.5 * i + 0.1, (0.5 * i + 0.2,)) for i in range(10)]
    assert saturated(behind)  # served every 0.5 s, arriving every 0.1 s: a queue that grows
    assert not saturated(behind[:2])


PLAIN = {"cells": [{"model": "small", "test": "pp16", "batch_size": 1, "status": "ok"}]}


def served_record() -> dict:
    """A serving cell's record as an agent sends it, from two passes of two requests."""
    record = expand(serving_spec(request_rates=(2.0,)))[0].to_dict()
    figures = {
        "requests": 4, "completed": 4, "failed": 0, "good": 3, "output_tokens": 64,
        "slo_ttft_ms": 2000.0, "slo_tpot_ms": 100.0, "window_s": 2.0, "output_tok_s": 32.0,
        "request_rate": 2.0, "goodput": 1.5, "ttft_p50_ms": 40.0, "ttft_p99_ms": 90.0,
        "itl_p50_ms": 8.0, "itl_p99_ms": 12.0, "tpot_p50_ms": 8.5, "tpot_p99_ms": 11.0,
        "e2e_p50_ms": 170.0, "e2e_p99_ms": 260.0,
    }  # fmt: skip
    record.update(
        status="ok", error=None, test_time="2026-01-01T00:00:00+00:00", tokens_per_sec=30.0,
        std_tokens_per_sec=1.0, ci95_tokens_per_sec=0.5, latency_ms=1100.0,
        min_latency_ms=1050.0, median_latency_ms=1100.0, samples_ms=[1050.0, 1150.0],
        samples_tokens_per_sec=[30.5, 29.5], peak_memory_gb=0.1, active_memory_gb=0.1,
        warmup_iterations=1, slept_s=0.0, soc_temp_start_c=None, soc_temp_end_c=None,
        soc_temp_c=None, pressure_start=None, pressure_end=None, pause_s=0.0, flags=[],
        thermal_source=None, energy_j=64.0, energy_net_j=16.0,
        serving={"loop": "open", "passes": 2, "engine": "mlx-lm BatchGenerator",
                 "saturated": False, "figures": figures},
    )  # fmt: skip
    return judge(per_output_token(record))


def test_a_serving_record_passes_the_coordinators_checks_and_a_bad_one_does_not() -> None:
    record = served_record()
    assert record["joules_per_output_token_net"] == 0.25
    assert record["tokens_per_joule"] == 1.0
    check_record(record)
    record["serving"]["figures"]["ttft_p99_ms"] = "fast"
    with pytest.raises(shapes.Invalid, match="serving.figures.ttft_p99_ms"):
        check_record(record)
    faster = served_record()
    faster["tokens_per_sec"] = 40.0  # 32 output tokens a pass in 1.05 s at best: 30.5 tok/s
    with pytest.raises(shapes.Invalid, match="faster than its fastest iteration"):
        check_record(faster)


def test_a_saturated_cell_is_invalid_saturated() -> None:
    record = served_record()
    record["serving"]["saturated"] = True
    assert SATURATED in judge(record)["verdict_reasons"]


def test_every_figure_is_in_the_table_at_80_columns_csv_and_sql() -> None:
    record = served_record() | {"host": "mac1", "pause_s": 3.2}
    report = {"machine": {"hostname": "mac1"}, "models": [], "cells": [record]}
    console = Console(width=80, file=io.StringIO(), record=True)
    for table in rich_serving([record]):
        console.print(table)
    drawn = console.export_text()
    assert max(len(line) for line in drawn.splitlines()) <= 80
    for figure in ("serve r2.0", "40/90", "8/12", "1.50 75%", "valid"):
        assert figure in drawn, drawn
    assert "not shown at 80 columns: req/s, TPOT ms, e2e ms, J/tok" in drawn
    wide = render_text(report, "table", width=200)
    for figure in ("2.00", "8/11", "170/260", "0.25", "paused 3 s"):
        assert figure in wide, wide
    csv_text = render_text(report, "csv")
    header, row = csv_text.splitlines()[:2]
    assert "serve_ttft_p99_ms" in header and "serve_goodput" in header
    columns = dict(zip(header.split(","), row.split(","), strict=True))
    assert (columns["serve_ttft_p99_ms"], columns["serve_goodput"]) == ("90.0", "1.5")
    assert columns["serve_joules_per_output_token_net"] == "0.25"
    sql = render_text(report, "sql")
    assert "serve_e2e_p99_ms" in sql and "INSERT INTO llama_bench" not in sql  # no such test
    assert json.loads(render_text(report, "llama-json")) == []
    assert json.loads(render_text(report, "jsonl"))["serve_tpot_p99_ms"] == 11.0
    assert "| mac1 | small/f16 | serve r2.0 | 2.00 | 40/90 |" in render_text(report, "md")
    assert json.loads(render_text(report, "json"))["cells"][0]["serving"]["figures"]["good"] == 3


def test_compare_sets_two_runs_serving_tails_and_goodput_side_by_side() -> None:
    before, after = served_record(), served_record()
    after["serving"]["figures"] |= {"ttft_p99_ms": 45.0, "goodput": 1.75}
    reports = [
        as_fleet_report({"machine": {"hostname": "mac1"}, "cells": [cell]}, name)
        for cell, name in ((before, "a.json"), (after, "b.json"))
    ]
    (row,) = compare_reports(*reports)
    assert row["a"]["serving"]["ttft_p99_ms"] == 90.0 and row["b"]["serving"]["goodput"] == 1.75
    console = Console(width=120, file=io.StringIO(), record=True)
    for table in serving_comparison([row]):
        console.print(table)
    drawn = console.export_text()
    assert "serve r2.0" in drawn and "90" in drawn and "45" in drawn and "1.75" in drawn
    plain = compare_reports(*(as_fleet_report(r, n) for r, n in [(PLAIN, "a"), (PLAIN, "b")]))
    assert serving_comparison(plain) == []


@pytest.mark.slow
def test_a_group_is_refused_the_in_process_engine_before_any_job() -> None:
    result = run_cli(
        "coordinator", "benchmark", "--hosts", "127.0.0.1:1,127.0.0.1:1+127.0.0.1:2",
        "--config-small", "--concurrency", "2", "-p", "16", "-n", "4",
    )  # fmt: skip
    assert result.returncode == 2
    line = "a group serves through --serve mlx_lm only: the in-process engine does not run across"
    assert result.stderr.strip().endswith(f"{line} ranks")
