"""Serving cells through mlx-lm's BatchGenerator in the job's own process (agent.profiling.serving),
on the built-in tiny model with real MLX: the engine decodes what our model decodes, `agent bench`
gives every figure in every format, and an injected late share shows in goodput (issue 46)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import mlx.core as mx
import pytest

from agent.model import ModelArgs, build_model
from agent.profiling.greedy import check_prompt, greedy_tokens
from agent.profiling.runner import run_matrix
from agent.profiling.serving import llama_twin, prompt_tokenizer
from shared.benchmark import faults
from shared.benchmark.matrix import MatrixSpec
from shared.benchmark.serving import Prompt, ServingSpec
from shared.reports.benchmark import render_text
from tests.conftest import run_cli
from tests.fleet_support import AgentPool, cli, exchange_keys
from tests.test_model_dir import TINY_LLAMA, write_model, write_tokenizer

pytestmark = pytest.mark.slow


def test_the_engine_decodes_what_our_model_decodes() -> None:
    """BatchGenerator cannot take our KVCache (it merges mlx-lm's into a batch cache), so it
    drives mlx-lm's llama holding our arrays: the same greedy tokens, two requests at once."""
    from mlx_lm.generate import BatchGenerator

    model = build_model(ModelArgs.small(), bits=16)
    twin = llama_twin(model)
    assert twin.model.embed_tokens.weight is model.model.embed_tokens.weight  # no copy
    prompt = check_prompt(model.args.vocab_size)
    generator = BatchGenerator(twin, completion_batch_size=2)
    generator.insert([prompt, prompt[:5]], max_tokens=[8, 8])
    decoded: dict[int, list[int]] = {0: [], 1: []}
    while sum(map(len, decoded.values())) < 16:
        for response in generator.next()[1]:
            decoded[response.uid].append(response.token)
    generator.close()
    assert decoded[0] == greedy_tokens(model, 8)[-8:]  # after its predictions over the prompt
    quantized = build_model(ModelArgs.small(), bits=4)
    tokens = mx.array([prompt[:6]])
    assert mx.array_equal(llama_twin(quantized)(tokens), quantized(tokens))  # quantized alike


def test_agent_bench_gives_every_serving_figure_in_every_format(tmp_path: Path) -> None:
    result = run_cli(
        "agent", "bench", "--config-small", "--concurrency", "1,4", "--request-rate", "2",
        "-p", "32", "-n", "16", "--requests", "4", "-w", "1", "-r", "2",
        "--thermal-source", "sim", "--power-source", "sim", "--idle-baseline", "0.5",
        "-o", "json", timeout=300,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    cells = report["cells"]
    assert [c["test"] for c in cells] == ["serve c1", "serve c4", "serve r2.0"]
    for cell in cells:
        assert cell["status"] == "ok", cell["error"]
        figures = cell["serving"]["figures"]
        assert figures["completed"] == 8 and figures["output_tokens"] == 8 * 16
        for key in ("ttft", "itl", "tpot", "e2e"):
            assert 0 < figures[f"{key}_p50_ms"] <= figures[f"{key}_p99_ms"]
        assert figures["goodput"] <= figures["request_rate"]
        assert cell["tokens_per_sec"] > 0 and cell["energy_simulated"]
        assert cell["joules_per_output_token_net"] is not None
        assert cell["serving"]["engine"] == "mlx-lm BatchGenerator"
    assert cells[2]["serving"]["saturated"] is not None
    assert cells[0]["serving"]["saturated"] is None  # a closed loop cannot outrun its engine
    table = render_text(report, "table", width=200)
    assert "serving" in table and "serve r2.0" in table and "TTFT ms" in table
    header = render_text(report, "csv").splitlines()[0]
    assert all(f"serve_{k}_p99_ms" in header for k in ("ttft", "itl", "tpot", "e2e"))
    assert "INSERT INTO mlx_fleet_bench" in render_text(report, "sql")


def test_late_requests_cost_their_share_of_goodput(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLX_FLEET_INJECT=late=0.3 holds 30 % of the requests past the TTFT SLO: goodput is 0.7
    of the request rate within the binomial sampling error of the share drawn."""
    monkeypatch.setenv(faults.ENV, "late=0.3")
    requests, share = 40, 0.3
    serving = ServingSpec(  # SLOs a 4M-parameter model meets on a crowded CPU; held: 2.25 s
        request_rates=(10.0,), requests=requests, slo_ttft_ms=1500.0, slo_tpot_ms=1000.0
    )
    spec = MatrixSpec(
        n_prompt=(8,), n_gen=(4,), models=("small",), warmup=1, iterations=1, serving=serving
    )
    (record,) = run_matrix(spec)
    assert record["status"] == "ok", record["error"]
    assert "late" in record["injected"]
    figures = record["serving"]["figures"]
    late = record["serving"]["late_injected"]
    assert figures["completed"] == requests and figures["good"] <= requests - late
    error = 3 * math.sqrt(share * (1 - share) / requests)
    assert figures["goodput"] / figures["request_rate"] == pytest.approx(1 - share, abs=error)
    assert figures["request_rate"] == pytest.approx(10.0, rel=0.5)  # Poisson: 40 arrivals


@pytest.mark.timeout(180)
def test_two_agents_serve_in_one_table_with_verdicts(agents: AgentPool) -> None:
    """`coordinator benchmark --concurrency 1,4` over two real agents on loopback: both hosts'
    serving cells in one table and one report, each record checked and judged again by the
    coordinator, kept in its store and shown again by `coordinator show`."""
    first, second = agents.start("mac1"), agents.start("mac2")
    exchange_keys(first)
    exchange_keys(second)
    hosts = f"{first.address},{second.address}"
    quick = ("--config-small", "-p", "16", "-n", "4", "--requests", "4", "-w", "1", "-r", "2")
    result = cli(
        "coordinator", "benchmark", "--hosts", hosts, "--concurrency", "1,4", *quick, "-o", "json",
        timeout=170,
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert sorted(c["test"] for c in report["cells"]) == ["serve c1"] * 2 + ["serve c4"] * 2
    for cell in report["cells"]:
        assert cell["status"] == "ok" and cell["serving"]["figures"]["completed"] == 8
        assert cell["verdict"] in ("valid", "invalid")
    table = cli("coordinator", "show", report["run_id"]).stdout
    assert "serving" in table and "TTFT ms" in table and "goodput" in table
    for agent in (first, second):
        rows = [line for line in table.splitlines() if agent.address in line and "serve c" in line]
        assert sum("serve c1" in row for row in rows) == 2  # the main table's and the serving's
        assert sum("serve c4" in row for row in rows) == 2
        assert all("valid" in row for row in rows), table  # each row with its verdict


def test_a_prompt_file_serves_a_model_directory_through_its_tokenizer(tmp_path: Path) -> None:
    """An mlx-lm directory's prompts become tokens by its own tokenizer (the built-in model's by
    their UTF-8 bytes), and the engine serves it as loaded."""
    write_model(tmp_path, TINY_LLAMA)
    write_tokenizer(tmp_path, TINY_LLAMA["vocab_size"])
    tokenize, said = prompt_tokenizer(str(tmp_path))
    prompt = Prompt((("user", "w5 w6 w7"),))
    assert (tokenize(prompt), said) == ([5, 6, 7], "the model's tokenizer")
    assert prompt_tokenizer("small")[0](prompt) == list(b"w5 w6 w7")
    serving = ServingSpec(concurrency=(2,), requests=4, prompts=(prompt,))
    spec = MatrixSpec(n_gen=(4,), models=(str(tmp_path),), warmup=1, iterations=1, serving=serving)
    (record,) = run_matrix(spec)
    assert record["status"] == "ok", record["error"]
    assert record["test"] == "serve c2"
    assert record["serving"]["tokens_from"] == "the model's tokenizer"
    assert record["serving"]["model_impl"] == "as loaded"
    assert record["serving"]["figures"]["output_tokens"] == 4 * 4


def test_a_duration_ends_the_sending_not_the_requests_in_flight() -> None:
    """--serve-duration: a closed loop of 2 clients sends for 0.4 s of a 1,000-request budget;
    what was sent by then finishes, and no more is sent."""
    serving = ServingSpec(concurrency=(2,), requests=1000, duration_s=0.4)
    spec = MatrixSpec(
        n_prompt=(8,), n_gen=(4,), models=("small",), warmup=0, iterations=1, serving=serving
    )
    (record,) = run_matrix(spec)
    figures = record["serving"]["figures"]
    assert record["status"] == "ok" and 2 <= figures["completed"] < 1000
    assert figures["completed"] == figures["requests"]
    assert figures["window_s"] >= 0.4 and record["serving"]["duration_s"] == 0.4
