"""The agent survives its disk: a data directory on a small tmpfs that fills up (a real mount),
stores that refuse writes (a real read-only SQLite file), and a data directory it cannot use at
start (agent/daemon/storage.py, docs/reliability.md)."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zmq

from agent.commands.serve import LogFile
from agent.daemon.benchmark.journal import Journal
from agent.daemon.storage import JOURNAL, StorageHealth
from agent.daemon.throttle import LogThrottle
from shared.io.keys import own_keypair
from shared.io.trust import trust
from tests.disk_support import fill, mounted_tmpfs
from tests.fleet_support import AgentPool, connect, receive, subscriber
from tests.test_prometheus_agent import scrape

pytestmark = pytest.mark.timeout(300)

QUICK = {"models": ["small"], "n_prompt": [16], "n_gen": [4], "warmup": 0, "iterations": 1}


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, mounted for the test (root only), unmounted after."""
    with mounted_tmpfs(tmp_path / "small-disk", "size=4m,mode=0700") as mount:
        yield mount


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.1)


def stored_seqs(home: Path) -> list[int]:
    with sqlite3.connect(f"file:{home / 'agent-telemetry.sqlite'}?mode=ro", uri=True) as conn:
        return [row[0] for row in conn.execute("SELECT seq FROM samples ORDER BY seq")]


@pytest.mark.slow
def test_an_agent_on_a_full_disk_keeps_serving_and_records_again_when_space_returns(
    ctx: zmq.Context, agents: AgentPool, tmpfs: Path
) -> None:
    options = ["--poll-interval", "0.05", "--prometheus", "127.0.0.1:0"]
    agent = agents.start(home=tmpfs, options=options)
    trust(own_keypair().public, "test", directory=agent.home / "keys" / "trusted")
    port = int(re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/", agent.log_text())[0])
    storage_ok = ("mlx_fleet_storage_ok", (("host", socket.gethostname()),))
    client = connect(ctx, agent)
    assert client.request("info")["storage"] == {"ok": True, "failing": []}
    sub = subscriber(ctx, agent)
    filler = fill(tmpfs)
    wait_for(lambda: not client.request("info")["storage"]["ok"], "the write error in info")
    assert client.request("ping")["job"] is None
    told = receive(sub, lambda m: m.type == "telemetry.sample" and m.body["storage_error"])
    assert "history" in told.body["storage_error"]
    wait_for(lambda: scrape(port).get(storage_ok) == 0.0, "the write error in the metrics")
    failing = client.request("info")["storage"]["failing"]
    assert any("No space left on device" in f["error"] or "full" in f["error"] for f in failing)
    # Cells of a job run while the disk is full are all served (from memory)
    job_id = client.request("bench.start", {"matrix": QUICK})["job"]
    wait_for(lambda: client.request("job.get", {"job": job_id})["state"] != "running", "the job")
    fetched = client.request("job.get", {"job": job_id})
    assert fetched["state"] == "ok" and len(fetched["records"]) == 2
    listed = {job["job"]: job for job in client.request("job.list")["jobs"]}
    assert listed[job_id]["state"] == "ok" and listed[job_id]["done"] == 2
    policy = client.request("policy.set", {"policy": {"pause_temp": 84.0}})["policy"]
    assert policy["pause_temp"] == 84.0  # enforced though it cannot be saved yet
    filler.unlink()
    wait_for(lambda: client.request("info")["storage"]["ok"], "writes to resume")
    wait_for(lambda: scrape(port).get(storage_ok) == 1.0, "the metrics to recover")
    seqs = stored_seqs(agent.home)
    assert seqs == list(range(1, len(seqs) + 1)), "a sample taken while the disk was full is lost"
    assert agent.journal_cells() == 2
    saved = json.loads((agent.home / "policy.json").read_text(encoding="utf-8"))
    assert saved["pause_temp"] == 84.0
    log = agent.log_text()
    assert "cannot write the history" in log and "works again" in log
    assert log.count("cannot write the history") < 5, "one line per kind of failure, not each"
    client.close()


def test_a_journal_the_disk_refuses_keeps_every_cell_until_it_takes_them(tmpfs: Path) -> None:
    storage = StorageHealth(LogThrottle(logging.getLogger("test")))
    journal = Journal(tmpfs / "jobs.sqlite", storage)
    journal.create_job("j-1", {"models": ["small"]}, 40)
    filler = fill(tmpfs)
    for index in range(40):  # a few pages of cells: more than the full disk takes
        journal.add_cell("j-1", index, {"name": f"cell {index}", "blob": "x" * 2000})
    journal.add_model("j-1", {"label": "small/f16"})
    journal.finish_job("j-1", "ok", None)
    assert JOURNAL in storage.failing
    held = journal.get_job("j-1")
    assert held is not None and len(held["records"]) == 40 and held["state"] == "ok"
    filler.unlink()
    journal.retry()
    assert JOURNAL not in storage.failing
    journal.close()
    reopened = Journal(tmpfs / "jobs.sqlite", storage)
    stored = reopened.get_job("j-1")
    assert stored is not None and stored["state"] == "ok"
    assert [r["name"] for r in stored["records"]] == [f"cell {i}" for i in range(40)]
    assert stored["models"] == [{"label": "small/f16"}]
    reopened.close()


def test_an_unusable_data_dir_is_one_line_and_exit_2(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x", encoding="utf-8")
    served = subprocess.run(
        [*agent_serve(), "--thermal-source", "none"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"MLX_FLEET_HOME": str(not_a_dir)},
    )
    assert served.returncode == 2
    lines = served.stderr.strip().splitlines()
    assert len(lines) == 1 and str(not_a_dir) in lines[0] and "not a directory" in lines[0]


def agent_serve() -> list[str]:
    from tests.conftest import console_script

    return [console_script("agent"), "serve", "--bind", "127.0.0.1:0"]


def test_a_read_only_data_dir_is_one_line_and_exit_2(tmpfs: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    served = subprocess.run(
        [*agent_serve(), "--thermal-source", "none"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ | {"MLX_FLEET_HOME": str(tmpfs / "home")},
    )
    assert served.returncode == 2
    lines = served.stderr.strip().splitlines()
    assert len(lines) == 1 and "Read-only file system" in lines[0] and str(tmpfs) in lines[0]


def test_the_data_dir_and_its_files_are_private(agents: AgentPool, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "agent.log"
    agent = agents.start(home=tmp_path / "fresh" / "home", options=["--log-file", str(log)])
    assert (agent.home.stat().st_mode & 0o777) == 0o700
    for name in ("agent-telemetry.sqlite", "agent-events.sqlite", "agent-jobs.sqlite"):
        assert (agent.home / name).stat().st_mode & 0o077 == 0, name
    assert log.stat().st_mode & 0o077 == 0


def test_a_log_file_on_a_full_disk_costs_one_line_on_stderr(
    tmpfs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    handler = LogFile(tmpfs / "agent.log", maxBytes=10**9, backupCount=1, encoding="utf-8")
    logger = logging.getLogger("test.full-disk-log")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        filler = fill(tmpfs)
        for index in range(2000):
            logger.error("line %d %s", index, "x" * 100)
        filler.unlink()
    finally:
        logger.removeHandler(handler)
        handler.close()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "cannot write" in lines[0] and "log line(s) lost" in lines[0]
