"""Crash-isolated cells: a cell that kills its job process fails alone and a new process runs the
cells after it; a cell the machine cannot hold is refused with its estimate before it runs; and
a job process does not outlive its agent (real agents, real MLX, real signals)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from pathlib import Path

import psutil
import pytest
import zmq

from agent.daemon.benchmark.jobs import crashed_cells
from agent.daemon.benchmark.process import output_said
from agent.model import ModelArgs, build_model
from agent.profiling.footprint import cell_footprint, model_shape, refusal
from agent.profiling.runner import machine_memory, run_matrix
from shared.benchmark.matrix import Cell, MatrixSpec, expand
from tests.fleet_support import AgentPool, connect, trusted_agent
from tests.test_gpu_errors import middle_cell_fails_alone

pytestmark = pytest.mark.timeout(300)

DATA_LIMIT = 768 * 2**20
"""RLIMIT_DATA for the agent and its job processes: far above what small cells take (the agent
uses about 60 MB, a job process some 200 MB), far below what the crashing cell asks for."""
CRASHING = Cell("small", 16, 8192, 0, 0, 4)
CRASHING_STEP = 8192
"""pp8192 b4 in one step: about 4.6 GB estimated (attention scores on MLX's CPU backend):
allowed on this machine, an allocation past the limit: MLX dies of SIGSEGV when an allocation
fails."""


def small_shape_footprint(cell: Cell) -> int:
    model = build_model(ModelArgs.small())
    shape = model_shape(model)
    assert shape is not None
    return cell_footprint(shape, 8_000_000, cell, CRASHING_STEP, scores_materialized=True).total


@pytest.mark.slow
def test_a_cell_that_kills_its_job_process_fails_alone(ctx: zmq.Context, agents: AgentPool) -> None:
    if shutil.which("prlimit") is None:
        pytest.skip("needs prlimit(1) (util-linux) to give the agent a memory limit")
    if small_shape_footprint(CRASHING) > machine_memory():
        pytest.skip("this machine is too small: the agent would refuse the crashing cell")
    client, stream, cells = middle_cell_fails_alone(
        ctx, agents, ["prlimit", f"--data={DATA_LIMIT}"], [16, CRASHING.n_prompt, 32],
        batch_sizes=[CRASHING.batch_size], prefill_step_size=CRASHING_STEP,
    )  # fmt: skip
    assert cells[1]["test"] == "pp8192"
    crashed = cells[1]
    job = stream[0].body["job"]
    form = (
        r"the job process died \(killed by SIG[A-Z]+\) while measuring this cell: "
        rf".+ \(log: (.+/job-logs/{job}\.log)\)"
    )
    found = re.fullmatch(form, crashed["error"])
    assert found, crashed["error"]
    assert Path(found[1]).is_file()
    models = [m for m in stream if m.type == "bench.progress" and m.body["model"]]
    assert len(models) == 1  # built again in the new process, announced once
    assert client.request("ping")["job"] is None
    client.close()


def test_a_cell_above_the_machines_memory_is_refused_with_its_estimate() -> None:
    """Refused before anything is allocated; the cells before and after it are measured."""
    spec = MatrixSpec(
        n_prompt=(16, 1_048_576, 32), models=("small",), n_gen=(0,), warmup=0, iterations=1
    )
    records = list(run_matrix(spec))
    assert [r["status"] for r in records] == ["ok", "failed", "ok"]
    error = records[1]["error"]
    assert error.startswith("not run: it would need about ")
    assert "(weights 0.0 + KV cache 2.1 + activations " in error
    assert f"this machine has {machine_memory() / 1e9:.1f} GB" in error


def test_the_estimate_counts_what_a_cell_holds() -> None:
    shape = model_shape(build_model(ModelArgs.small()))
    assert shape is not None and shape.vocab == 4096 and shape.kv_heads == 2
    prefill = cell_footprint(shape, 1000, Cell("small", 16, 1024, 0, 0, 2), 2048, True)
    assert prefill.kv_cache == 4 * 2 * 2 * 2 * 64 * 1024 * 2  # a prompt fills a cache too
    assert prefill.logits == 2 * 4096 * 2  # the last position alone
    decode = cell_footprint(shape, 1000, Cell("small", 16, 0, 24, 1000, 2), 2048, True)
    # 1000 + 24 positions, one 256-step rounding; and the filled 1000 (1024) kept beside them
    assert decode.kv_cache == 2 * prefill.kv_cache
    fused = cell_footprint(shape, 1000, Cell("small", 16, 1024, 0, 0, 2), 2048, False)
    assert fused.activations < prefill.activations
    long = Cell("small", 16, 8192, 0, 0, 1)
    stepped = cell_footprint(shape, 1000, long, 512, True)
    assert stepped.activations < cell_footprint(shape, 1000, long, 8192, True).activations
    assert refusal(prefill, prefill.total) is None
    assert "this machine has 0.1 GB" in (refusal(prefill, prefill.total - 1) or "")


def test_a_model_without_a_config_is_not_estimated() -> None:
    assert model_shape(object()) is None


@pytest.mark.slow
def test_a_job_process_dies_with_its_agent(ctx: zmq.Context, agents: AgentPool) -> None:
    agent = trusted_agent(agents)
    client = connect(ctx, agent)
    matrix = {
        "models": ["small"],
        "n_prompt": [16, 32, 48, 64],
        "n_gen": [8],
        "warmup": 0,
        "iterations": 50,
    }
    client.request("bench.start", {"matrix": matrix})
    deadline = time.monotonic() + 60
    while not (children := psutil.Process(agent.process.pid).children()):
        assert time.monotonic() < deadline, "no job process"
        time.sleep(0.05)
    (child,) = children
    os.kill(agent.process.pid, signal.SIGKILL)  # the agent alone, not its process group
    agent.process.wait(timeout=10)
    gone, _ = psutil.wait_procs([child], timeout=30)
    assert gone, "the job process outlived its agent"
    client.close()


def test_a_process_that_died_building_a_model_fails_that_models_cells() -> None:
    spec = MatrixSpec(n_prompt=(8, 16), models=("small", "full"), n_gen=(0,))
    left = expand(spec)[1:]  # small pp8 was measured; small pp16, full pp8, full pp16 are left
    died = "the job process died (killed by SIGKILL)"
    said = "it wrote nothing (log: /d/job-logs/j-1.log)"
    measuring = crashed_cells(left, begun=True, built={("small", 16)}, died=died, said=said)
    assert [(r["name"], r["error"]) for r in measuring] == [
        ("small/f16 pp16 b1", f"{died} while measuring this cell: {said}")
    ]
    building = crashed_cells(left[1:], begun=False, built=set(), died=died, said="oom")
    assert [r["name"] for r in building] == ["full/q4 pp8 b1", "full/q4 pp16 b1"]
    assert all(r["error"] == f"{died} while building its model: oom" for r in building)


def test_what_a_dead_process_wrote_has_one_form(tmp_path: Path) -> None:
    """`WHAT (log: PATH)`, WHAT its own last lines, or that it wrote nothing: a job's processes
    share one log, and a new process that dies silent does not quote the one before it."""
    log = tmp_path / "j-1.log"
    assert output_said(log) == f"its log could not be read: No such file or directory (log: {log})"
    log.write_text("")
    assert output_said(log) == f"it wrote nothing (log: {log})"
    log.write_text("loading\n\nFatal Python error: Segmentation fault\n")
    assert output_said(log) == f"Fatal Python error: Segmentation fault (log: {log})"
    second = log.stat().st_size  # where the process started after the crash begins
    assert output_said(log, second) == f"it wrote nothing (log: {log})"
    with log.open("a") as handle:
        handle.write("".join(f"line {n}\n" for n in range(9)))
    assert output_said(log, second) == (f"line 4 | line 5 | line 6 | line 7 | line 8 (log: {log})")
    assert output_said(None) == (
        "its output was not kept (no log: the agent could not create job-logs)"
    )
