"""A group's serving cells end to end: two real agents on loopback as the ranks of a ring, each
starting its rank of one distributed mlx_lm.server (agent.profiling.group_serving) on a tiny
mlx-lm model directory, rank 0's agent sending the load; `coordinator benchmark --hosts A+B
--serve mlx_lm` prints the group's serving cells (closed and open loops), every member named,
each rank's peak memory its server's; rank 1's server killed as one cell starts fails that cell
naming rank 1 first, and the next cell serves."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from tests.fleet_support import AgentPool
from tests.group_support import insecure_benchmark as coordinator
from tests.group_support import wait_for_no_rank

pytestmark = pytest.mark.slow
SERVER = "agent.profiling.mlx_lm_server"


@pytest.fixture(scope="module")
def served_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mlx_lm", reason="the `lm` extra (mlx-lm) is not installed")
    from tests.test_model_dir import TINY_LLAMA, write_model, write_tokenizer

    directory = tmp_path_factory.mktemp("group-served-llama")
    write_model(directory, TINY_LLAMA)
    write_tokenizer(directory, TINY_LLAMA["vocab_size"], eos=TINY_LLAMA["vocab_size"])
    return directory


def rank_servers(rank: str) -> set[int]:
    """The mlx_lm.server ranks `rank` running now (their MLX_RANK), of any job."""
    found = set()
    for process in psutil.process_iter(["cmdline"]):
        if SERVER not in (process.info["cmdline"] or []):
            continue
        try:
            if process.environ().get("MLX_RANK") == rank:
                found.add(process.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def kill_the_second(rank: str, killed: list[int], done: threading.Event) -> None:
    """SIGKILL the second server of `rank` to appear (the second cell's) as soon as it does."""
    seen: set[int] = set()
    deadline = time.monotonic() + 200
    while not killed and not done.is_set() and time.monotonic() < deadline:
        for pid in rank_servers(rank) - seen:
            seen.add(pid)
            if len(seen) == 2:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.05)


def test_a_group_serves_through_mlx_lm_servers_distributed_mode(
    agents: AgentPool, served_model: Path
) -> None:
    a, b = agents.start("a", insecure=True), agents.start("b", insecure=True)
    group = f"{a.address}+{b.address}"
    killed: list[int] = []
    done = threading.Event()
    killer = threading.Thread(target=kill_the_second, args=("1", killed, done))
    killer.start()
    try:
        ran = coordinator(
            "--hosts", group, "--model", str(served_model), "--serve", "mlx_lm",
            "--concurrency", "1,2,4", "--request-rate", "8", "-p", "32", "-n", "8",
            "--requests", "4", "-r", "1", "--host-timeout", "30",
            "-w", "0", "-o", "json",
        )  # fmt: skip
    finally:
        done.set()
        killer.join()
    assert killed, ran.stderr
    assert ran.returncode == 1, ran.stderr  # one cell failed, the others measured
    cells = [cell for cell in json.loads(ran.stdout)["cells"] if cell["host"] == group]
    assert [cell["name"].split()[-1] for cell in cells] == ["c1", "c2", "c4", "r8.0"]
    first, second, third, open_loop = cells
    assert second["status"] == "failed"
    assert second["error"].startswith(f"rank 1 ({b.address}): "), second["error"]
    assert "mlx_lm.server exited with signal 9" in second["error"]
    assert f"rank 0 ({a.address}): " in second["error"]  # the effect, after the cause
    assert open_loop["serving"]["loop"] == "open"
    for cell in (first, third, open_loop):
        assert cell["status"] == "ok", cell.get("error")
        assert cell["group"]["members"] == [a.address, b.address]
        assert [rank["host"] for rank in cell["ranks"]] == [a.address, b.address]
        serving = cell["serving"]
        assert "distributed" in serving["engine"]
        figures = serving["figures"]
        assert figures["completed"] == 4 and figures["output_tokens"] == 4 * 8
        for key in ("ttft_p99_ms", "itl_p50_ms", "tpot_p95_ms", "goodput"):
            assert isinstance(figures[key], float), key
        assert cell["tokens_per_sec"] > 0 and all(r["tokens_per_sec"] for r in cell["ranks"])
        peaks = [rank["peak_memory_gb"] for rank in cell["ranks"]]  # each server's own
        assert all(peak > 0 for peak in peaks) and cell["peak_memory_gb"] == max(peaks)
    wait_for_no_rank({"a": a, "b": b}, within=30)
    assert not rank_servers("0") | rank_servers("1")
