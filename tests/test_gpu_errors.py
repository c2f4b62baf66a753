"""Metal's command-buffer errors: recognised in a job process's output (lines quoted in
tests/fixtures/gpu_errors.txt with their origin), and a cell whose job process Metal aborted
fails with `gpu-error` while the cells after it run in a new process (a real agent, a real job
process, the abort injected with MLX_FLEET_INJECT)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import zmq

from shared.benchmark import gpu_errors
from shared.benchmark.faults import GPU_ERROR_KINDS
from shared.io.transport import AgentClient
from shared.wire import protocol as p
from tests.fleet_support import AgentPool, connect, trusted_agent

FIXTURE = Path(__file__).parent / "fixtures" / "gpu_errors.txt"


def fixture_lines() -> list[str]:
    text = FIXTURE.read_text(encoding="utf-8")
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_each_metal_error_line_names_its_kind() -> None:
    kinds = [gpu_errors.gpu_error(line) for line in fixture_lines()]
    assert kinds == ["Timeout", "PageFault", "ImpactingInteractivity", "InnocentVictim"]
    assert gpu_errors.gpu_error("Fatal Python error: Aborted") is None
    assert gpu_errors.gpu_error("") is None


def test_the_injected_lines_are_the_quoted_ones() -> None:
    assert set(gpu_errors.LINES) == set(GPU_ERROR_KINDS)
    assert list(gpu_errors.LINES.values()) == fixture_lines()[:3]


def test_the_error_line_is_found_among_a_crash_report() -> None:
    line = fixture_lines()[0]
    log = f"loading\n{line}\nFatal Python error: Aborted\n\nThread 0x1 (most recent call first):\n"
    assert gpu_errors.find(log) == ("Timeout", line)
    assert gpu_errors.find("Fatal Python error: Segmentation fault\n") is None


def test_the_cells_error_is_cut() -> None:
    error = gpu_errors.error_text("Timeout", "x" * 1000)
    assert error.startswith("gpu-error: Timeout: x")
    assert len(error) <= len("gpu-error: Timeout: ") + gpu_errors.ERROR_CHARS


def middle_cell_fails_alone(
    ctx: zmq.Context, agents: AgentPool, wrapper: list[str], prompts: list[int], **matrix: Any
) -> tuple[AgentClient, list[p.Message], list[dict[str, Any]]]:
    """A trusted agent started under `wrapper` runs three prefill cells of `prompts` (one pass,
    no warm-up; `matrix` more keys): the first and last are measured, the middle one fails,
    and the job ends ok with all three. The client, the job's stream and its cells."""
    client = connect(ctx, trusted_agent(agents, wrapper=wrapper))
    matrix |= {"models": ["small"], "n_prompt": prompts, "n_gen": [0], "warmup": 0, "iterations": 1}
    stream = list(client.stream(client.send("bench.start", {"matrix": matrix})))
    cells = [m.body["record"] for m in stream if m.type == "bench.cell"]
    assert [c["test"] for c in cells] == [f"pp{n}" for n in prompts]
    assert cells[0]["status"] == "ok" and cells[2]["status"] == "ok"
    assert cells[1]["status"] == "failed"
    assert stream[-1].body["status"] == "ok" and stream[-1].body["cells"] == 3
    return client, stream, cells


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_gpu_error_fails_its_cell_alone(ctx: zmq.Context, agents: AgentPool) -> None:
    injected = ["env", "MLX_FLEET_INJECT=gpu-error@2"]
    client, _, cells = middle_cell_fails_alone(ctx, agents, injected, [16, 24, 32])
    crashed = cells[1]
    assert crashed["error"] == f"gpu-error: Timeout: {gpu_errors.LINES['Timeout']}"
    assert crashed["verdict_reasons"] == ["gpu-error"]
    assert crashed["injected"] == ["gpu-error"] and "injected" in crashed["flags"]
    assert "gpu-error" not in (cells[0].get("injected") or [])
    client.close()
