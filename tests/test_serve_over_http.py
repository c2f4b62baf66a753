"""`agent bench`'s serving cells over HTTP, end to end: `--serve mlx_lm` on a real mlx_lm.server
with a tiny model directory (a server killed during a cell fails that cell with the reason, and
the next cell starts a fresh one), and `--serve-url` against the fake OpenAI server
(tests/fakes/openai_server.py): checked before any cell, a stream dying mid-cell failing only
its cell, and an injected late share of an open loop costing its share of goodput."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agent.profiling.runner import run_matrix
from shared.benchmark import faults
from shared.benchmark.matrix import MatrixSpec
from shared.benchmark.serving import SERVED_MODEL, ServingSpec
from tests.conftest import console_script, run_cli, subprocess_env
from tests.fakes.openai_server import FakeOpenAIServer
from tests.fleet_support import AgentPool, cli, exchange_keys

pytestmark = pytest.mark.slow
QUIET = ("--thermal-source", "sim", "--power-source", "none", "--idle-baseline", "0")
SMALL_LOAD = ("-p", "8", "-n", "8", "--requests", "3", "-w", "1", "-r", "2", "-o", "json")


@pytest.fixture(scope="module")
def served_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mlx_lm", reason="the `lm` extra (mlx-lm) is not installed")
    from tests.test_model_dir import write_served_model

    return write_served_model(tmp_path_factory.mktemp("served-llama"))


def cells(stdout: str) -> list[dict]:
    return json.loads(stdout)["cells"]


def server_children(parent: int) -> list[int]:
    """The mlx_lm.server processes (our lifeline module) below `parent`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if b"agent.profiling.mlx_lm_server" in command and int(stat[1]) == parent:
            found.append(int(entry.name))
    return found


def test_a_server_killed_during_a_cell_fails_it_and_the_next_cell_serves(
    served_model: Path,
) -> None:
    """The first cell's mlx_lm.server is killed as soon as it exists: that cell fails with the
    reason, and the second cell's own server gives every figure."""
    bench = subprocess.Popen(
        [
            console_script("agent"), "bench", "--serve", "mlx_lm", "--model", str(served_model),
            "--concurrency", "1,2", *SMALL_LOAD, *QUIET,
        ],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env(),
    )  # fmt: skip
    killed: list[int] = []

    def kill_the_first_server() -> None:
        deadline = time.monotonic() + 120
        while not killed and time.monotonic() < deadline and bench.poll() is None:
            for pid in server_children(bench.pid):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            time.sleep(0.02)

    killer = threading.Thread(target=kill_the_first_server)
    killer.start()
    stdout, stderr = bench.communicate(timeout=300)
    killer.join()
    assert killed, stderr
    assert bench.returncode == 1, stderr  # one cell failed, the other measured
    first, second = cells(stdout)
    assert [first["test"], second["test"]] == ["serve c1", "serve c2"]
    assert first["status"] == "failed"
    assert first["error"].startswith("ServerDied: mlx_lm.server exited with signal 9")
    assert second["status"] == "ok", second["error"]
    serving = second["serving"]
    assert serving["engine"] == "over HTTP: mlx_lm.server, started for this cell"
    figures = serving["figures"]
    assert figures["completed"] == 6 and figures["output_tokens"] == 6 * 8
    for key in ("ttft_p99_ms", "itl_p50_ms", "tpot_p95_ms", "e2e_mean_ms", "goodput"):
        assert isinstance(figures[key], float), key
    assert second["peak_memory_gb"] > 0  # the server's own MLX peak, reported as it stopped
    assert second["active_memory_gb"] is None


def test_serve_url_cells_stream_from_the_server_and_a_death_fails_only_its_cell() -> None:
    """Stream 1 is the check before any cell; stream 2, the first cell's warm-up, dies after
    three tokens, so that cell has no completed request; the second cell's all stream."""
    with FakeOpenAIServer(ttft_s=0.01, gap_s=0.002, dying=frozenset({2})) as fake:
        result = run_cli(
            "agent", "bench", "--serve-url", fake.url, "--concurrency", "1,2", *SMALL_LOAD,
            *QUIET, timeout=300,
        )  # fmt: skip
    assert result.returncode == 1, result.stderr
    first, second = cells(result.stdout)
    assert first["model"] == "served"
    assert first["error"] == (
        "RequestsFailed: every request failed, the first with: the stream ended before [DONE] "
        "after 3 token events"
    )
    assert second["status"] == "ok", second["error"]
    assert second["serving"]["model_impl"].startswith("the server's, 'fake-model' asked for")
    assert second["serving"]["figures"]["completed"] == 6
    assert second["serving"]["prompt_cache"] == (
        "the server's own: 12 of 42 prompt tokens of 6 requests found in it (its usage's "
        "cached_tokens)"
    )


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("not-found", "not OpenAI-compatible: GET /v1/models answered HTTP 404"),
        ("json", "not OpenAI-compatible: not an event stream (Content-Type application/json)"),
    ],
)
def test_a_serve_url_that_is_not_openai_compatible_is_refused_before_any_cell(
    mode: str, why: str
) -> None:
    with FakeOpenAIServer(mode=mode) as fake:
        result = run_cli("agent", "bench", "--serve-url", fake.url, "--concurrency", "1", *QUIET)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: --serve-url {fake.url}/v1/chat/completions: {why}"
    assert fake.requests == 0  # no stream: refused before any cell


def test_late_requests_over_http_cost_their_share_of_goodput(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MLX_FLEET_INJECT=late=0.3 holds 30 % of an open loop's requests at the client past the
    TTFT SLO (1.5 x 500 ms) before sending them, their latency counted from their arrival:
    goodput is 0.7 of the request rate within three binomial standard errors of the share."""
    monkeypatch.setenv(faults.ENV, "late=0.3")
    requests, share = 100, 0.3
    with FakeOpenAIServer(ttft_s=0.005, gap_s=0.001) as fake:
        serving = ServingSpec(
            request_rates=(50.0,), requests=requests, slo_ttft_ms=500.0, serve_url=fake.url
        )
        spec = MatrixSpec(
            n_prompt=(8,), n_gen=(4,), models=(SERVED_MODEL,), bits=(None,), warmup=1,
            iterations=1, serving=serving,
        )  # fmt: skip
        (record,) = run_matrix(spec)
    assert record["status"] == "ok", record["error"]
    figures = record["serving"]["figures"]
    late = record["serving"]["late_injected"]
    assert figures["completed"] == requests and figures["good"] == requests - late
    error = 3 * math.sqrt(share * (1 - share) / requests)
    assert figures["goodput"] / figures["request_rate"] == pytest.approx(1 - share, abs=error)


@pytest.mark.timeout(180)
def test_coordinator_benchmark_serves_through_an_agent_to_its_url(agents: AgentPool) -> None:
    """The serving spec's serve_url travels to a real agent on loopback, whose job sends the
    cell to the URL; the record, memory unknown, passes the coordinator's checks."""
    agent = agents.start("mac1")
    exchange_keys(agent)
    with FakeOpenAIServer(ttft_s=0.01, gap_s=0.002) as fake:
        result = cli(
            "coordinator", "benchmark", "--hosts", agent.address, "--serve-url", fake.url,
            "--concurrency", "2", *SMALL_LOAD, timeout=170,
        )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    (cell,) = json.loads(result.stdout)["cells"]
    assert cell["status"] == "ok", cell["error"]
    assert cell["serving"]["engine"] == f"over HTTP: {fake.url}/v1/chat/completions"
    assert cell["serving"]["figures"]["completed"] == 6
    assert cell["peak_memory_gb"] is None
