"""MLX's device is only ever asked in a child process (agent.profiling.device_probe): a child that
aborts, as MLX before 0.31.2 aborts on a Metal device list macOS left empty, leaves `agent serve`
serving with its device unknown and why, and `agent doctor` naming the failure with its fix."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import zmq

from agent.doctor.checks import bench_check, mlx_checks
from agent.profiling.device_probe import (
    MIN_MLX,
    DeviceProbe,
    older_than_minimum,
    probe_device,
    read_probe,
    version_tuple,
)
from agent.profiling.machine import machine_info
from shared.io.transport import AgentClient
from tests.fleet_support import AgentPool, cli

ROOT = Path(__file__).resolve().parent.parent
NS_RANGE = (
    "*** Terminating app due to uncaught exception 'NSRangeException', reason: "
    "'*** -[__NSArray0 objectAtIndex:]: index 0 beyond bounds for empty array'"
)
"""What MLX 0.31.1 printed as it aborted on an M5 Max under macOS 26.4.1 (ml-explore/mlx#3397;
the same text in jundot/omlx#428 and #898)."""
NO_DEVICE_ERROR = (
    "RuntimeError: [metal::load_device] No Metal device available. This typically occurs in "
    "headless, sandboxed, or virtualized macOS sessions where the GPU is not accessible."
)
"""What MLX 0.31.2 and later raise instead (ml-explore/mlx#3428, mlx/backend/metal/device.cpp)."""
FACTS = {"mlx_version": "0.32.4", "backend": "gpu", "device": "Apple M4", "metal": True}
FAKE_METAL = f'''"""A Mac whose Metal device list macOS left empty, as MLX met it before
0.31.2, in the device probe child only (the agent itself keeps the real MLX): the first device
query prints what ml-explore/mlx#3397 quotes and aborts (SIGABRT), as the uncaught
NSRangeException does; with FAKE_METAL=hang it never answers instead (a device that does not
come up)."""
import os
import sys
import time

if "agent.profiling.device_probe" in getattr(sys, "orig_argv", ()):
    import mlx.core as mx

    def _no_device(*args, **kwargs):
        if os.environ.get("FAKE_METAL") == "hang":
            time.sleep(3600)
        sys.stderr.write({NS_RANGE!r} + "\\n")
        sys.stderr.write("libc++abi: terminating due to uncaught exception of type NSException\\n")
        sys.stderr.flush()
        os.abort()

    mx.device_info = _no_device
'''


@pytest.fixture
def no_metal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every Python this test starts loads FAKE_METAL (its sitecustomize)."""
    fake = tmp_path / "no-metal"
    fake.mkdir()
    (fake / "sitecustomize.py").write_text(FAKE_METAL, encoding="utf-8")
    paths = [str(fake), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))


def test_an_abort_is_named_with_its_signal_and_what_mlx_said() -> None:
    stderr = f"{NS_RANGE}\nlibc++abi: terminating due to uncaught exception of type NSException\n"
    probe = read_probe(-signal.SIGABRT, "", stderr, bench=False)
    assert probe.facts is None and probe.fix and "mlx#3397" in probe.fix
    assert probe.failure == (
        f"the MLX device probe died of SIGABRT asking MLX for its device: {NS_RANGE}"
    )


def test_a_hang_an_error_and_a_crash_mid_benchmark_each_say_so() -> None:
    hung = read_probe(None, "", "", bench=False, timeout_s=60)
    assert hung.failure == "the MLX device probe hung asking MLX for its device: no answer in 60 s"
    error = json.dumps({"error": NO_DEVICE_ERROR})
    raised = read_probe(1, error, "", bench=False)
    assert raised.failure == f"MLX failed asking MLX for its device: {NO_DEVICE_ERROR}"
    facts_then_crash = read_probe(-signal.SIGSEGV, json.dumps({"facts": FACTS}), "", bench=True)
    assert facts_then_crash.facts == FACTS and facts_then_crash.bench is None
    assert facts_then_crash.failure == "the MLX device probe died of SIGSEGV measuring its matmul"
    both = "\n".join(json.dumps(line) for line in ({"facts": FACTS}, {"bench": {"gflops": 1.0}}))
    assert read_probe(0, both, "", bench=True) == DeviceProbe(FACTS, {"gflops": 1.0})


def test_doctor_checks_say_the_probe_failure_and_an_old_mlx() -> None:
    failed = DeviceProbe(None, None, "the MLX device probe died of SIGABRT", "the fix")
    found = {check.name: check for check in mlx_checks(failed)}
    assert not found["mlx device"].ok and found["mlx device"].required
    assert found["mlx device"].detail == failed.failure and found["mlx device"].fix == "the fix"
    bench = bench_check(failed)
    assert not bench.ok and bench.detail == failed.failure
    old = {
        check.name: check for check in mlx_checks(DeviceProbe({**FACTS, "mlx_version": "0.31.1"}))
    }
    assert not old["mlx"].ok and "older than 0.31.2" in old["mlx"].detail
    assert old["mlx"].fix == "pip install -U 'mlx>=0.31.2'" and old["mlx device"].ok
    assert version_tuple("0.32.0.dev20260101") == (0, 32, 0) and version_tuple("x") is None
    assert older_than_minimum("0.30.4") and not older_than_minimum("0.31.2")


def test_pyproject_requires_the_mlx_that_reports_a_missing_device() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    floors = re.findall(r'"mlx(?:\[cpu\])?>=([\d.]+);', text)
    assert floors and all(version_tuple(floor) == MIN_MLX for floor in floors), floors


def test_this_machines_probe_answers() -> None:
    probe = probe_device()
    assert probe.failure is None and probe.facts and probe.facts["backend"]
    assert machine_info(probe)["device_error"] is None


@pytest.mark.slow
@pytest.mark.usefixtures("no_metal")
def test_an_aborting_device_leaves_serve_serving_and_doctor_naming_it(
    ctx: zmq.Context, agents: AgentPool
) -> None:
    agent = agents.start("no-metal", insecure=True)
    client = AgentClient(ctx, agent.address, None, None, 10.0)
    client.connect()
    machine = client.request("info")["machine"]
    assert machine["device"] == "unknown" and machine["backend"] is None, machine
    assert machine["device_error"].startswith("the MLX device probe died of SIGABRT")
    assert "NSRangeException" in machine["device_error"]
    assert client.request("ping")["job"] is None  # still serving after it answered
    assert "serving degraded" in agent.log_text()
    client.close()

    doctor = cli("agent", "doctor", "--format", "json", "--bind", "127.0.0.1:0")
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    report = json.loads(doctor.stdout)
    found = {check["name"]: check for check in report["checks"]}
    device = found["mlx device"]
    assert not device["ok"] and device["required"] and "SIGABRT" in device["detail"]
    assert "mlx#3397" in device["fix"] and not found["benchmark"]["ok"]
    assert report["machine"]["device"] == "unknown"


@pytest.mark.slow
@pytest.mark.usefixtures("no_metal")
def test_a_device_that_never_answers_is_given_up_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_METAL", "hang")
    probe = probe_device(timeout_s=3)
    assert probe.facts is None
    assert probe.failure == "the MLX device probe hung asking MLX for its device: no answer in 3 s"
