"""Nothing lost to a signal: `agent bench` takes SIGTERM (timeout(1), a CI cancel, a scheduler)
as Ctrl-C, prints the cells that finished, saves the run, and exits 143 (README, Exit codes)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import console_script, interrupt, piped

pytestmark = pytest.mark.timeout(300)


def small_bench(*args: str) -> subprocess.Popen[str]:
    """`agent bench -o json` of the small config, no decode, no warm-up, ARGS added: piped."""
    argv = [console_script("agent"), "bench", "--config-small", "-n", "0", "-w", "0", *args]
    return piped([*argv, "-o", "json"])


@pytest.mark.slow
def test_sigterm_after_the_first_cell_prints_and_saves_it(fleet_home: Path) -> None:
    process = small_bench("-p", "16,4096,8192", "-r", "3")
    try:
        assert process.stderr is not None
        seen = []
        while not seen or "[1/3]" not in seen[-1]:  # a line per cell: stderr is a pipe
            line = process.stderr.readline()
            assert line, f"agent bench ended before its first cell: {''.join(seen)}"
            seen.append(line)
        assert "pp16" in seen[-1], seen
        stdout, stderr = interrupt(process, signal.SIGTERM, 240)
    finally:
        process.kill()
    report = json.loads(stdout)
    assert report["interrupted"] is True
    cells = [(c["test"], c["status"]) for c in report["cells"]]
    assert cells[0] == ("pp16", "ok") and len(cells) == 3
    assert cells[-1][1] == "not run"
    saved = re.search(r"^saved (\S+)$", stderr, re.MULTILINE)
    assert saved is not None, stderr
    path = Path(saved.group(1))
    assert path.parent == fleet_home / "runs" and path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text(encoding="utf-8"))["cells"] == report["cells"]
    assert "Traceback" not in stderr


@pytest.mark.slow
def test_ctrl_c_in_a_sustained_cell_keeps_its_finished_windows(fleet_home: Path) -> None:
    """Issue 42: Ctrl-C in a --sustain cell dropped every finished window. The cell is now kept,
    failed `interrupted`, with the windows it finished; the run says it was interrupted."""
    import psutil

    process = small_bench("-p", "16", "--sustain", "120s", "--sustain-window", "1s")
    try:
        assert process.stderr is not None
        line = ""
        while "building" not in line:
            line = process.stderr.readline()
            assert line, "agent bench ended before it built its model"
        measured = psutil.Process(process.pid)
        began = sum(measured.cpu_times()[:2])
        deadline = time.monotonic() + 120
        while sum(measured.cpu_times()[:2]) - began < 6.0:  # 3 s of wall at most 2 cores
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.1)
        stdout, stderr = interrupt(process, signal.SIGINT, 120)
    finally:
        process.kill()
    report = json.loads(stdout)
    (cell,) = report["cells"]
    assert report["interrupted"] is True and cell["status"] == "failed"
    assert cell["error"].startswith("interrupted"), cell["error"]
    windows = cell["sustain"]["windows"]
    assert len(windows) >= 1 and all(w["iterations"] >= 0 for w in windows), windows
    assert sum(w["tokens"] for w in windows) > 0
    assert "Traceback" not in stderr


@pytest.mark.slow
def test_a_cancelled_sustained_job_keeps_its_finished_windows(tmp_path: Path) -> None:
    """Issue 42 through the agent: bench.cancel (what `coordinator benchmark --sustain` sends
    on Ctrl-C) SIGTERMs the job; its sustained cell is journaled, failed `interrupted`, with
    the windows it finished, and job.get serves it."""
    import psutil
    import zmq

    from shared.io.keys import own_keypair
    from shared.io.trust import trust
    from tests.fleet_support import AgentPool, connect

    pool = AgentPool(tmp_path / "agents")
    context = zmq.Context()
    try:
        agent = pool.start("sustained", options=["--poll-interval", "0.2"])
        trust(own_keypair().public, "test", directory=agent.home / "keys" / "trusted")
        client = connect(context, agent, timeout=60)
        matrix = {"models": ["small"], "n_prompt": [16], "n_gen": [0], "warmup": 0}
        sustain = {"duration_s": 120.0, "window_s": 1.0}
        job = client.request("bench.start", {"matrix": matrix, "sustain": sustain})["job"]
        daemon = psutil.Process(agent.process.pid)
        deadline = time.monotonic() + 120
        while not (children := daemon.children(recursive=True)):
            assert time.monotonic() < deadline, "no job process"
            time.sleep(0.1)
        child = children[0]
        began = sum(child.cpu_times()[:2])
        while sum(child.cpu_times()[:2]) - began < 8.0:  # past the build, windows measured
            assert time.monotonic() < deadline and child.is_running()
            time.sleep(0.1)
        client.request("bench.cancel", {"job": job})
        while (page := client.request("job.get", {"job": job, "offset": 0}))["state"] == "running":
            assert time.monotonic() < deadline, page
            time.sleep(0.2)
        client.close()
    finally:
        pool.kill_all()
        context.destroy(linger=0)
    assert page["state"] == "cancelled", page
    (record,) = page["records"]
    assert record["status"] == "failed" and record["error"].startswith("interrupted")
    windows = record["sustain"]["windows"]
    assert len(windows) >= 1 and sum(w["tokens"] for w in windows) > 0, windows
