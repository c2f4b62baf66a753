"""A group's serving cells end to end: two real agents on loopback as the ranks of a ring, each
starting its rank of one distributed mlx_lm.server (agent.profiling.group_serving) on a tiny
mlx-lm model directory, rank 0's agent sending the load; `coordinator benchmark --hosts A+B
--serve mlx_lm` prints the group's serving cells (closed and open loops), every member named,
each rank's peak memory its server's; rank 1's server killed as one cell starts fails that cell
naming rank 1 first, and the next cell serves; killed during an open loop's pass, the same,
rank 0's own failure (its server's generation ended) named after rank 1's."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from shared.reports.group_cells import SERVER_PEER_FAILED
from tests.fleet_support import AgentPool
from tests.group_support import insecure_benchmark as coordinator
from tests.group_support import wait_for_no_rank

pytestmark = pytest.mark.slow
SERVER = "agent.profiling.mlx_lm_server"


@pytest.fixture(scope="module")
def served_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mlx_lm", reason="the `lm` extra (mlx-lm) is not installed")
    from tests.test_model_dir import write_served_model

    return write_served_model(tmp_path_factory.mktemp("group-served-llama"))


def rank_servers(rank: str) -> dict[int, list[str]]:
    """The mlx_lm.server ranks `rank` running now (their MLX_RANK), of any job: pid to argv. A
    server's own short-lived children (forked to run a command: the same argv and environment
    until they exec) are left out."""
    found, parents = {}, {}
    for process in psutil.process_iter(["cmdline", "ppid"]):
        argv = process.info["cmdline"] or []
        if SERVER not in argv:
            continue
        try:
            if process.environ().get("MLX_RANK") == rank:
                found[process.pid], parents[process.pid] = argv, process.info["ppid"]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return {pid: argv for pid, argv in found.items() if parents[pid] not in found}


def requests_logged(pid: int) -> int:
    """The chat requests the server `pid` has logged so far (its access log, in the file its
    stdout is: mlx_lm_server's log), 0 while there is none."""
    try:
        log = Path(f"/proc/{pid}/fd/1").read_bytes()
    except OSError:
        return 0
    return log.count(b'"POST /v1/chat/completions ')


def kill_rank_1(killed: list[int], done: threading.Event) -> None:
    """SIGKILL rank 1's server of the second cell as soon as it appears (before its ring forms),
    and that of the fourth (an open loop whose requests arrive over 2.3 s: seed 0, rate 1) once
    rank 0's server has logged the pass's first request (its second: the first is the ready
    check's), so during the pass."""
    seen: set[int] = set()
    deadline = time.monotonic() + 300
    while len(killed) < 2 and not done.is_set() and time.monotonic() < deadline:
        for pid in sorted(set(rank_servers("1")) - seen):
            seen.add(pid)
            while len(seen) == 4 and not done.is_set():
                if any(requests_logged(lead) >= 2 for lead in rank_servers("0")):
                    break
                time.sleep(0.02)
            if len(seen) in (2, 4):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        time.sleep(0.05)


def test_a_group_serves_through_mlx_lm_servers_distributed_mode(
    agents: AgentPool, served_model: Path
) -> None:
    metered = ["--power-source", "sim", "--idle-baseline", "0"]  # a modelled meter, labelled
    a, b = (agents.start(name, insecure=True, options=metered) for name in "ab")
    group = f"{a.address}+{b.address}"
    killed: list[int] = []
    done = threading.Event()
    killer = threading.Thread(target=kill_rank_1, args=(killed, done))
    killer.start()
    try:
        ran = coordinator(
            "--hosts", group, "--model", str(served_model), "--serve", "mlx_lm",
            "--concurrency", "1,2,4", "--request-rate", "1,8", "-p", "32", "-n", "8",
            "--requests", "4", "-r", "1", "--host-timeout", "30", "-w", "0", "-o", "json",
        )  # fmt: skip
    finally:
        done.set()
        killer.join()
    assert len(killed) == 2, ran.stderr
    assert ran.returncode == 1, ran.stderr  # two cells failed, the others measured
    cells = [cell for cell in json.loads(ran.stdout)["cells"] if cell["host"] == group]
    assert [cell["name"].split()[-1] for cell in cells] == ["c1", "c2", "c4", "r1.0", "r8.0"]
    first, second, third, killed_in_pass, open_loop = cells
    assert "; here: " in killed_in_pass["error"]  # rank 0's own failure, mid-pass
    for failed in (second, killed_in_pass):
        assert failed["status"] == "failed"
        error = failed["error"]
        assert error.startswith(f"rank 1 ({b.address}): "), error  # the cause, then its effect
        assert "mlx_lm.server exited with signal 9" in error.split(" (then ")[0]
        assert (
            f"(then rank 0 ({a.address}): GroupServingFailed: {SERVER_PEER_FAILED} rank 1" in error
        )
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
        joules = [rank["energy_j"] for rank in cell["ranks"]]  # each Mac's over the passes
        assert all(j > 0 for j in joules) and cell["energy_j"] == pytest.approx(sum(joules))
        assert cell["joules_per_token"] == pytest.approx(sum(joules) / (4 * 8))
        assert cell["energy_simulated"] is True
        peaks = [rank["peak_memory_gb"] for rank in cell["ranks"]]  # each server's own
        assert all(peak > 0 for peak in peaks) and cell["peak_memory_gb"] == max(peaks)
    wait_for_no_rank({"a": a, "b": b}, within=30)
    assert not rank_servers("0") and not rank_servers("1")
