"""Progress that tells the truth (issue 28, builds 2 and 6): model builds announced with their size,
labels that name the cell, the idle baseline and a cooling pause, Ctrl-C obeyed mid-build, and
the warnings owed where the cooling policy cannot act or quantized cells crawl. The words are
shared.benchmark.status's (pure); the ends are real processes: `agent bench`, and a two-host
`coordinator benchmark` over real agents, one of them on a replayed curve that crosses
pause_temp."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import zmq

from agent.profiling.runner import builtin_param_count
from shared.benchmark.status import (
    PauseView,
    activity_label,
    baseline_label,
    build_label,
    duration_text,
    no_sensor_warning,
    pause_label,
    pause_line,
    quantized_cpu_warning,
)
from shared.io.keys import own_keypair
from shared.io.trust import trust
from shared.shapes import Invalid
from shared.wire.agent_shapes import check_agent_body
from tests.conftest import console_script, run_cli, subprocess_env
from tests.fleet_support import AgentPool, connect

# --- the words (pure) ---------------------------------------------------------------------------


def test_labels_name_what_runs_and_for_how_long() -> None:
    assert [duration_text(s) for s in (0, 9.9, 62, 3900)] == ["0s", "9s", "1m02s", "1h05m"]
    assert build_label("full/q4", builtin_param_count("full")) == "building full/q4 (3.21B params)"
    assert build_label("mlx/stored", None) == "building mlx/stored"
    assert baseline_label(10) == "idle baseline 10s"
    assert activity_label("small/f16 pp32 b1", 3.2) == "small/f16 pp32 b1 3s"
    pause = PauseView(86.1, None, "smc", "TCMz", 62.0)
    assert pause_label(pause) == "paused at 86.1 °C (smc · TCMz), 1m02s"
    assert activity_label("small/f16 pp32 b1", 3.2, pause) == pause_label(pause)
    replayed = PauseView(92.0, None, "replay:/a/long/path/curve.csv", "replay", 3.0)
    assert pause_label(replayed) == "paused at 92.0 °C (replay:curve.csv · replay), 3s"
    assert (
        pause_line(replayed) == "cooling: pause at 92.0 °C (replay:/a/long/path/curve.csv · replay)"
    )
    assert pause_line(pause) == "cooling: pause at 86.1 °C (smc · TCMz)"
    ended = PauseView(86.1, None, "smc", "TCMz", 62.0, done=True)
    assert pause_line(ended) == "cooling: resume after 1m02s (smc · TCMz)"


def test_warnings_only_where_protection_is_off_or_the_backend_crawls() -> None:
    assert "cooling policy cannot act" in (no_sensor_warning("none") or "")
    assert no_sensor_warning("smc") is None and no_sensor_warning("sim") is None
    slow = quantized_cpu_warning([16, 8, 4, 8], "cpu") or ""
    assert slow.startswith("warning: q4/q8 cells run on MLX's CPU backend")
    assert "no fast quantized matmul kernels" in slow and "50-400x slower" in slow
    assert quantized_cpu_warning([16, None], "cpu") is None
    assert quantized_cpu_warning([4], "gpu") is None


def test_the_new_progress_fields_are_checked() -> None:
    body = {"job": "j", "done": 0, "total": 2, "model": None}
    pause = PauseView(90.0, None, "sim", None, 1.5).to_dict()
    check_agent_body("bench.progress", {**body, "pause": pause})
    build = {"kind": "build", "model": "full", "label": "full/q4", "bits": 4, "param_count": 3}
    check_agent_body("bench.progress", {**body, "phase": build})
    check_agent_body("bench.progress", {**body, "phase": {"kind": "baseline", "seconds": 10.0}})
    for bad in ({**pause, "paused_s": -1}, {**pause, "extra": 1}):
        with pytest.raises(Invalid):
            check_agent_body("bench.progress", {**body, "pause": bad})
    with pytest.raises(Invalid):
        check_agent_body("bench.progress", {**body, "phase": {"kind": "nap"}})


# --- agent bench --------------------------------------------------------------------------------


class Lines:
    """A process's stderr, read on a thread as it comes."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.text = ""
        self._changed = threading.Condition()
        assert process.stderr is not None
        self._stream = process.stderr
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._stream:
            with self._changed:
                self.text += line
                self._changed.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while not re.search(pattern, self.text):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True


@pytest.mark.slow
def test_a_bare_agent_bench_announces_its_build_and_obeys_ctrl_c() -> None:
    """The default `full` model takes minutes to build on this CPU: the build is announced at
    once, with its size, and SIGINT ends it promptly with exit 130 and the partial report."""
    process = subprocess.Popen(
        [console_script("agent"), "bench", "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=subprocess_env(COLUMNS="250"),
    )
    try:
        lines = Lines(process)
        assert lines.wait_for(r"building full/q4 \(3\.21B params\)…", 120), lines.text
        assert "no thermal sensor, so the cooling policy cannot act" in lines.text
        assert "q4 cells run on MLX's CPU backend" in lines.text
        announced = time.monotonic()
        process.send_signal(signal.SIGINT)
        stdout, _ = process.communicate(timeout=120)
        answered = time.monotonic() - announced
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, lines.text
    assert answered < 60  # the build alone takes far longer here
    report = json.loads(stdout)
    assert report["interrupted"] and all(c["status"] != "ok" for c in report["cells"])


@pytest.mark.slow
def test_agent_bench_names_each_cell_when_stderr_is_a_terminal() -> None:
    """Rich drawn as on a terminal (TTY_COMPATIBLE): the label names the build and the cell."""
    result = run_cli(
        "agent", "bench", "--config-small", "-p", "16", "-n", "0", "-r", "1", "-w", "0",
        "--no-cool-start", "-o", "json",
        env={"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.search(r"building small/f16 \(\d+\.\dM params\) \d+s", result.stderr)
    assert re.search(r"small/f16 pp16 b1 \d+s", result.stderr)


# --- coordinator benchmark: a host that pauses --------------------------------------------------

PAUSING_CURVE_PERIOD_S = 3
"""The replayed curve: 1 s at 70 °C, then 2 s at 92 °C (above pause_temp 85), for 20 minutes.
Periodic, so a job pauses wherever in the curve it starts (the replay's clock starts with the
agent, the job some seconds later): every cool second is shorter than the jobs' delays (0.6 s,
1.2 s) plus their work, so each job meets a hot window; a slower (busier) machine meets more."""


def pausing_curve(path: Path) -> Path:
    rows = ["seconds,celsius"]
    for start in range(0, 1200, PAUSING_CURVE_PERIOD_S):
        rows += [f"{start},70", f"{start + 0.9},70", f"{start + 1},92", f"{start + 2.9},92"]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.timeout(600)
@pytest.mark.slow
def test_a_paused_host_shows_its_pause_and_the_run_completes(
    agents: AgentPool, tmp_path: Path
) -> None:
    curve = pausing_curve(tmp_path / "pausing.csv")
    hot = agents.start(
        "hot", insecure=True, thermal=f"replay:{curve}", options=["--poll-interval", "0.2"]
    )
    cool = agents.start("cool", insecure=True)  # no sensor: its host says so
    cells = ["-p", "16,32,48", "-n", "8", "-r", "10", "-w", "0", "--delay", "0.6"]
    result = run_cli(
        "coordinator", "benchmark", "--config-small", *cells, "--no-cool-start",
        "--hosts", f"{hot.address},{cool.address}", "--insecure", "-o", "json",
        env={"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"},
        timeout=540,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    label = rf"{re.escape(hot.address)}: paused at 92\.0 °C \(replay:\S+ · replay\), \d+s"
    assert re.search(label, result.stderr), result.stderr[-3000:]
    assert re.search(
        rf"{re.escape(hot.address)}: cooling: pause at 92\.0 °C \(replay:", result.stderr
    )
    assert f"{cool.address}: warning: thermal source none: no thermal sensor" in result.stderr
    assert f"{hot.address}: warning: thermal source" not in result.stderr
    report = json.loads(result.stdout)
    assert len(report["cells"]) == 8 and all(c["status"] == "ok" for c in report["cells"])
    paused = [c for c in report["cells"] if c["host"] == hot.address and c["pause_s"] > 0]
    assert paused, "the hot host paused in no cell"


@pytest.mark.slow
def test_agent_bench_shows_a_pause_in_its_label(tmp_path: Path) -> None:
    curve = pausing_curve(tmp_path / "pausing.csv")
    result = run_cli(
        "agent", "bench", "--config-small", "-p", "16,32", "-n", "0", "-r", "10", "-w", "0",
        "--delay", "1.2",
        "--no-cool-start", "--thermal-source", f"replay:{curve}", "--poll-interval", "0.2",
        "-o", "json",
        env={"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert re.search(r"paused at 92\.0 °C \(replay:\S+ · replay\), \d+s", result.stderr)
    assert "cooling: pause at 92.0 °C (replay:" in result.stderr
    assert "no thermal sensor" not in result.stderr
    cells = json.loads(result.stdout)["cells"]
    assert len(cells) == 2 and all(c["status"] == "ok" for c in cells)


@pytest.mark.slow
def test_an_agent_sends_the_new_fields_only_to_a_coordinator_that_asks(
    ctx: zmq.Context, agents: AgentPool, tmp_path: Path
) -> None:
    """A coordinator that predates `pause` and `phase` (it rejects unknown fields) never gets
    them: bench.start's `progress` asks for them by name."""
    curve = pausing_curve(tmp_path / "pausing.csv")
    agent = agents.start(thermal=f"replay:{curve}", options=["--poll-interval", "0.2"])
    trust(own_keypair().public, "test", directory=agent.home / "keys" / "trusted")
    client = connect(ctx, agent)
    matrix = {
        "models": ["small"],
        "n_prompt": [16, 24, 32],
        "n_gen": [0],
        "warmup": 0,
        "iterations": 10,
        "delay_s": 0.6,  # the cells span more than the curve's cool second: one pauses
    }
    try:
        for asked in (None, ["pause", "phase", "from-the-future"]):
            body = {"matrix": matrix} | ({"progress": asked} if asked else {})
            stream = list(client.stream(client.send("bench.start", body)))
            progress = [m.body for m in stream if m.type == "bench.progress"]
            phases = [b["phase"] for b in progress if b.get("phase")]
            pauses = [b["pause"] for b in progress if b.get("pause")]
            assert stream[-1].type == "bench.done" and stream[-1].body["status"] == "ok"
            if asked is None:
                assert phases == [] and pauses == []
                continue
            assert phases[0]["kind"] == "build" and phases[0]["label"] == "small/f16"
            assert phases[0]["param_count"] == builtin_param_count("small")
            assert pauses and pauses[0]["celsius"] == 92.0 and not pauses[0]["done"]
            assert pauses[0]["sensor"] == "replay" and any(p["done"] for p in pauses)
    finally:
        client.close()


def test_the_fleet_bar_says_each_hosts_warnings_and_pause(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from coordinator.commands.benchmark import FleetProgress
    from coordinator.runs.driver import MACHINE, PAUSE, PHASE, STARTED, THERMAL, HostEvent

    progress = FleetProgress(["mac1"], [4])
    progress(HostEvent("mac1", MACHINE, {"device": "AMD EPYC", "backend": "cpu"}))
    progress(HostEvent("mac1", THERMAL, {"source": "none"}))
    progress(HostEvent("mac1", STARTED, {"job": "j", "cells": ["full/q4 pp32 b1"]}))
    status = progress.status["mac1"]
    assert status.label(status.since + 5) == "mac1: full/q4 pp32 b1 5s"
    build = {"kind": "build", "model": "full", "label": "full/q4", "param_count": 3212749824}
    progress(HostEvent("mac1", PHASE, build))
    assert status.label(status.since + 62) == "mac1: building full/q4 (3.21B params) 1m02s"
    pause = PauseView(86.1, None, "smc", "TCMz", 2.0).to_dict()
    progress(HostEvent("mac1", PAUSE, pause))
    assert status.label(status.heard + 60) == "mac1: paused at 86.1 °C (smc · TCMz), 1m02s"
    progress(HostEvent("mac1", PAUSE, {**pause, "paused_s": 70.0, "done": True}))
    assert status.pause is None
    err = capsys.readouterr().err
    assert err.count("mac1: warning: q4 cells run on MLX's CPU backend") == 1
    assert "mac1: warning: thermal source none: no thermal sensor" in err
    assert "mac1: cooling: pause at 86.1 °C (smc · TCMz)" in err
    assert "mac1: cooling: resume after 1m10s (smc · TCMz)" in err
