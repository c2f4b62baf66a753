"""A rank as the agent starts it (agent.cluster.rank_process): real processes, real ring ranks
on loopback. Two ranks run the link benchmark to its report, their progress counted to its
last unit; a rank whose peer never comes is ended at its bound, its session with it, its
progress still; a rank whose agent goes away ends; a failing rank says why in one line; ending
a rank returns at once and a rank that ignores SIGTERM is SIGKILLed by a later poll."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from agent.cluster.rank_process import (
    FAILED,
    OK,
    RUNNING,
    STOP_GRACE_S,
    STOPPED,
    RankProcess,
    python_module,
)
from shared.distributed.netbench import measured_from, progress_total
from shared.distributed.rank_env import RING, Member, rank_launch
from tests.ring_support import ROOT, free_port_run

DEADLINE_S = 300.0
SPEC = {"sizes": [1024, 4096], "repetitions": 2, "warmup": 1, "hosts": ["a", "b"]}


def wait_for(done: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline_s
    while not done():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


STARTED: list[RankProcess] = []


@pytest.fixture(autouse=True)
def no_rank_left(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Whatever a test asserted, every rank it made is ended after it. Ranks get this checkout
    on PYTHONPATH (RankProcess passes os.environ on) for this test only: left in the worker's
    environment, every later CLI a test starts there would find the checkout's egg-info before
    the installed distribution (`coordinator deploy` then saw no source tree)."""
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH") or str(ROOT))
    yield
    while STARTED:
        rank = STARTED.pop()
        rank.stop("the test ended")
        rank.settle(wait=True)


def gone(rank: RankProcess) -> bool:
    """Polled until its process has ended and been reaped."""
    rank.poll()
    return not rank.alive


def ranks(tmp_path: Path, count: int, argv: list[str], bound_s: float = DEADLINE_S):
    members = [Member(f"m{rank}", ("127.0.0.1",)) for rank in range(count)]
    base = free_port_run(count)
    made = [
        RankProcess(
            "n-test", rank_launch(members, rank, RING, base), argv, tmp_path / f"r{rank}", bound_s
        )
        for rank in range(count)
    ]
    STARTED.extend(made)
    return made


def test_two_ranks_run_the_link_benchmark_to_its_report(tmp_path: Path) -> None:
    pair = ranks(tmp_path, 2, python_module("agent.cluster.netbench", json.dumps(SPEC)))
    for rank in pair:
        rank.start()
    wait_for(lambda: all(rank.poll() != RUNNING for rank in pair), "both ranks")
    assert [rank.state for rank in pair] == [OK, OK], [rank.error for rank in pair]
    assert pair[1].report is None
    found = measured_from(pair[0].report, SPEC["sizes"], SPEC["hosts"], 2)
    assert len(found) == 4
    total = progress_total(SPEC["sizes"], SPEC["hosts"], SPEC["warmup"], SPEC["repetitions"])
    assert [rank.progress for rank in pair] == [total, total]  # every unit, on each rank
    assert all(0 <= rank.progress_age_s() < DEADLINE_S for rank in pair)
    assert oct((tmp_path / "r0" / "mlx_hostfile.json").stat().st_mode & 0o777) == "0o600"


@pytest.mark.slow
def test_a_rank_whose_peer_never_comes_is_ended_at_its_bound(tmp_path: Path) -> None:
    alone = ranks(tmp_path, 2, python_module("agent.cluster.netbench", json.dumps(SPEC)), 2.0)[0]
    alone.start()
    pid = alone._process.pid  # noqa: SLF001 - the test needs the process to see it end
    wait_for(lambda: alone.poll() != RUNNING, "the bound")
    assert alone.state == FAILED
    assert alone.error == "rank 0 ran past its bound of 2 s"
    assert alone.progress == 0  # still forming the ring: no unit done
    assert alone.progress_age_s() == pytest.approx(alone.elapsed_s())
    wait_for(lambda: gone(alone), "its end")
    assert not psutil.pid_exists(pid)


def test_a_rank_ends_when_its_agent_goes_away(tmp_path: Path) -> None:
    alone = ranks(tmp_path, 2, python_module("agent.cluster.netbench", json.dumps(SPEC)))[0]
    alone.start()
    process = alone._process  # noqa: SLF001
    assert process is not None and process.stdin is not None
    process.stdin.close()  # what the kernel does to the pipe when the agent exits
    assert process.wait(DEADLINE_S) == -signal.SIGKILL


def test_a_failing_rank_says_why(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('noise'); sys.exit('no route to host')"]
    failing = ranks(tmp_path, 2, argv)[1]
    failing.start()
    wait_for(lambda: failing.poll() != RUNNING, "the failing rank")
    assert failing.state == FAILED
    assert failing.error == "rank 1 ended with exit 1: no route to host"


def test_a_rank_stopped_early_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    alone = ranks(tmp_path, 2, python_module("agent.cluster.netbench", json.dumps(SPEC)))[1]
    alone.start()
    pid = alone._process.pid  # noqa: SLF001
    alone.stop("rank 0 failed: unreachable")
    assert (alone.state, alone.error) == (STOPPED, "rank 0 failed: unreachable")
    wait_for(lambda: gone(alone), "its end")
    assert not psutil.pid_exists(pid)


@pytest.mark.slow
def test_stopping_returns_at_once_and_a_later_poll_kills_a_rank_ignoring_sigterm(
    tmp_path: Path,
) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(600)"
    )
    stubborn = ranks(tmp_path, 2, [sys.executable, "-c", code])[0]
    stubborn.start()
    pid = stubborn._process.pid  # noqa: SLF001
    wait_for(lambda: "ready" in (tmp_path / "r0" / "stdout").read_text(), "its SIGTERM ignored")
    asked = time.monotonic()
    stubborn.stop("test over")
    assert time.monotonic() - asked < STOP_GRACE_S / 3  # no wait for the grace
    assert stubborn.state == STOPPED and stubborn.alive  # it ignored SIGTERM: still there
    wait_for(lambda: gone(stubborn), "the SIGKILL after the grace")
    assert time.monotonic() - asked >= STOP_GRACE_S
    assert not psutil.pid_exists(pid)
