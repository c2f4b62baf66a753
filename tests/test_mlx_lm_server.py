"""`--serve mlx_lm`'s server (agent.profiling.mlx_lm_server): a real mlx_lm.server on a tiny
model directory, started on a free port, streamed from, stopped; killed while serving; unable to
load; and orphaned, when it must die with its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.profiling.mlx_lm_server import MlxLmServer, ServerDied
from agent.profiling.openai_client import stream_request
from shared.benchmark.openai_stream import DEFAULT_MODEL
from tests.conftest import alive, subprocess_env

pytest.importorskip("mlx_lm", reason="the `lm` extra (mlx-lm) is not installed")

pytestmark = pytest.mark.slow
DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def served_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.test_model_dir import write_served_model

    return write_served_model(tmp_path_factory.mktemp("served-llama"))


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {DEADLINE_S} s"
        time.sleep(0.05)


def test_the_server_streams_the_model_and_is_gone_after(served_model: Path) -> None:
    with MlxLmServer(str(served_model)) as server:
        pid = server.pid
        assert pid is not None
        timing = stream_request(server.url, DEFAULT_MODEL, "w1 w2 w3 w4", 8, DEADLINE_S)
        assert server.death() is None
    assert timing.error is None
    assert timing.output_tokens == 8 and timing.prompt_tokens is not None
    wait_until(lambda: not alive(pid), "the stopped server's process gone")


def test_a_server_killed_while_serving_fails_requests_and_says_why(served_model: Path) -> None:
    """(Death in the middle of a stream is the fake server's die-after-N: tests/
    test_openai_client.py.)"""
    with MlxLmServer(str(served_model)) as server:
        assert server.pid is not None
        os.kill(server.pid, signal.SIGKILL)
        wait_until(lambda: server.death() is not None, "the death seen")
        timing = stream_request(server.url, DEFAULT_MODEL, "w1 w2", 8, DEADLINE_S)
        assert timing.error is not None and timing.error.startswith("no reply: ")
        assert str(server.death()).startswith("mlx_lm.server exited with signal 9")


def test_a_model_that_does_not_load_is_named_with_the_servers_last_lines(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    server = MlxLmServer(str(tmp_path), ready_timeout_s=DEADLINE_S)
    with pytest.raises(
        ServerDied, match=r"^mlx_lm.server cannot generate .*No safetensors"
    ) as raised:
        server.__enter__()
    assert "\n" not in str(raised.value)


def test_the_server_dies_with_the_process_that_started_it(served_model: Path) -> None:
    starter = (
        "import sys, time\n"
        "from agent.profiling.mlx_lm_server import MlxLmServer\n"
        f"server = MlxLmServer({str(served_model)!r}).__enter__()\n"
        "print(server.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True, env=subprocess_env()
    )
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    assert alive(pid)
    parent.kill()
    parent.wait()
    wait_until(lambda: not alive(pid), "the orphaned server gone")
