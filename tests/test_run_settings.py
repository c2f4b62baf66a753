"""The settings every record carries (agent.profiling.settings, docs/protocol.md §5)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from agent.model import ModelArgs
from agent.profiling import settings as reader
from agent.profiling.runner import run_matrix
from shared.benchmark.faults import parse
from shared.benchmark.matrix import MatrixSpec
from shared.benchmark.settings import SETTINGS
from tests.conftest import subprocess_env
from tests.fleet_support import QUICK, cli

# `pmset -g` as macOS prints it (format of Apple's pmset(1), macOS 12-14: one setting a line,
# name padded to a column; Low Power Mode is `lowpowermode`, newer Apple-silicon laptops print
# `powermode`, 0 automatic, 1 low, 2 high). Written from that format, not a live capture.
PMSET_G_LOW = """System-wide power settings:
Currently in use:
 standby              1
 Sleep On Power Button 1
 hibernatefile        /var/vm/sleepimage
 powernap             1
 networkoversleep     0
 disksleep            10
 sleep                1 (sleep prevented by coreaudiod)
 hibernatemode        3
 ttyskeepawake        1
 displaysleep         10
 tcpkeepalive         1
 lowpowermode         1
 womp                 0
"""
PMSET_G_POWERMODE_HIGH = """System-wide power settings:
Currently in use:
 standby              1
 displaysleep         10
 powermode            2
 sleep                1
"""
PMSET_BATT_BATTERY = """Now drawing from 'Battery Power'
 -InternalBattery-0 (id=4653155)\t85%; discharging; 5:12 remaining present: true
"""
PMSET_BATT_AC = """Now drawing from 'AC Power'
 -InternalBattery-0 (id=4653155)\t100%; charged; 0:00 remaining present: true
"""
PMSET_BATT_DESKTOP = "Now drawing from 'AC Power'\n"


def test_pmset_power_mode() -> None:
    assert reader.parse_pmset_power_mode(PMSET_G_LOW) == "low"
    assert reader.parse_pmset_power_mode(
        PMSET_G_LOW.replace("mode         1", "mode         0")
    ) == ("normal")
    assert reader.parse_pmset_power_mode(PMSET_G_POWERMODE_HIGH) == "high"
    assert reader.parse_pmset_power_mode(" powermode            0\n") == "normal"
    assert reader.parse_pmset_power_mode("System-wide power settings:\n sleep 1\n") is None


def test_pmset_power_source() -> None:
    assert reader.parse_pmset_power_source(PMSET_BATT_BATTERY) == "battery"
    assert reader.parse_pmset_power_source(PMSET_BATT_AC) == "ac"
    assert reader.parse_pmset_power_source(PMSET_BATT_DESKTOP) == "ac"
    assert reader.parse_pmset_power_source("Now drawing from 'UPS Power'\n") is None
    assert reader.parse_pmset_power_source("") is None


def test_linux_power() -> None:
    mains = {"type": "Mains", "online": "1"}
    battery = {"type": "Battery", "status": "Discharging"}
    assert reader.linux_power_source([mains, {"type": "Battery", "status": "Charging"}]) == "ac"
    assert reader.linux_power_source([{"type": "Mains", "online": "0"}, battery]) == "battery"
    assert reader.linux_power_source([]) is None
    assert reader.linux_power_mode("low-power\n") == "low"
    assert reader.linux_power_mode("balanced") == "normal"
    assert reader.linux_power_mode(None) is None


def test_weights_digest_uses_hf_blob_names(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    content = b"weights"
    sha = hashlib.sha256(content).hexdigest()
    (blobs / sha).write_bytes(content)
    linked, plain = tmp_path / "linked", tmp_path / "plain"
    linked.mkdir()
    plain.mkdir()
    (linked / "model.safetensors").symlink_to(blobs / sha)
    (plain / "model.safetensors").write_bytes(content)
    assert reader.file_sha256(linked / "model.safetensors") == sha
    assert reader.weights_digest(linked) == reader.weights_digest(plain)
    assert str(reader.weights_digest(plain)).startswith("sha256:")
    assert reader.weights_digest(tmp_path / "blobs") is None
    small = ModelArgs.small()
    assert reader.config_digest(small, 0).startswith("config:")
    assert reader.config_digest(small, 0) != reader.config_digest(small, 1)


def test_injected_faults_override_and_say_so() -> None:
    base = {"power_mode": "normal", "power_source": "ac"}
    faults = parse("low-power@2,on-battery")
    first, injected = reader.with_faults(base, faults, 1)
    assert (first, injected) == (
        {"power_mode": "normal", "power_source": "battery"},
        ["on-battery"],
    )
    second, injected = reader.with_faults(base, faults, 2)
    assert second == {"power_mode": "low", "power_source": "battery"}
    record: dict = {"flags": []}
    reader.mark_injected(record, injected)
    assert record == {"flags": ["injected"], "injected": ["low-power", "on-battery"]}


def test_run_matrix_records_carry_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLX_FLEET_INJECT", "low-power@2")
    spec = MatrixSpec(
        n_prompt=(8, 16), n_gen=(0,), models=("small",), bits=(16,), warmup=0, iterations=1
    )
    records = list(run_matrix(spec))
    assert [set(r["settings"]) for r in records] == [set(SETTINGS)] * 2
    first, second = records
    assert first["settings"]["weights_digest"].startswith("config:")
    assert first["settings"]["mlx_version"]
    assert "injected" not in first and "injected" not in first["flags"]
    assert second["settings"]["power_mode"] == "low"
    assert second["injected"] == ["low-power"] and "injected" in second["flags"]


def test_agent_bench_records_carry_settings(agent_cli: str) -> None:
    result = subprocess.run(
        [agent_cli, "bench", "--config-small", "-p", "32", "-n", "8", "-r", "2", "-w", "1"]
        + ["-o", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(),
    )
    assert result.returncode == 0, result.stderr
    cells = json.loads(result.stdout)["cells"]
    assert cells and all(set(cell["settings"]) == set(SETTINGS) for cell in cells)
    assert all(cell["settings"]["thermal_source"] for cell in cells)


@pytest.mark.slow
def test_a_daemon_job_records_settings(fleet_home: Path) -> None:
    """The embedded agent's job (agent.daemon.benchmark.child) carries them to the report."""
    result = cli("coordinator", "benchmark", *QUICK, "--format", "json")
    assert result.returncode == 0, result.stderr
    cells = json.loads(result.stdout)["cells"]
    assert cells and all(set(cell["settings"]) == set(SETTINGS) for cell in cells)
