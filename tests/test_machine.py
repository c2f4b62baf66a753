"""Machine facts: what every benchmark number is shown next to. The Mac tools are fakes on PATH
(tests/fakes/mac_tools.py) answering from captures of real Macs (tests/fixtures/mac/README.md)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from agent.profiling.machine import (
    GIB,
    mac_facts,
    machine_info,
    parse_profiler_gpu_cores,
    parse_sysctl,
)
from shared.reports.benchmark import machine_line

FAKE = Path(__file__).parent / "fakes" / "mac_tools.py"
TOOLS = ("sysctl", "sw_vers", "ioreg", "system_profiler")


@pytest.fixture
def mac(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This process sees the fake tools first on PATH; set FAKE_MAC to pick the Mac."""
    folder = tmp_path / "mac-bin"
    folder.mkdir()
    for tool in TOOLS:
        (folder / tool).symlink_to(FAKE)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    return monkeypatch


def test_a_16_gib_mac_shows_16_and_its_gpu_cores_from_the_io_registry(
    mac: pytest.MonkeyPatch,
) -> None:
    mac.setenv("FAKE_MAC", "m4")
    assert mac_facts() == {
        "chip": "Apple M4",
        "hw_model": "Mac16,10",
        "memory_gib": 16,
        "cpu_levels": {"Performance": 4, "Efficiency": 6},
        "gpu_cores": 10,
        "macos_version": "15.3.1",
        "apple_silicon": True,
        "rosetta": False,
    }


def test_gpu_cores_fall_back_to_system_profiler(mac: pytest.MonkeyPatch) -> None:
    """No AGXAccelerator answer (no ioreg capture of an M2 Max): system_profiler's sppci_cores."""
    mac.setenv("FAKE_MAC", "m2-max")
    facts = mac_facts()
    assert facts["gpu_cores"] == 30 and facts["memory_gib"] == 64
    assert facts["cpu_levels"] == {"Performance": 8, "Efficiency": 4}
    assert (facts["hw_model"], facts["macos_version"]) == ("Mac14,6", "26.6.2")


def test_cpu_levels_keep_the_names_macos_gives(mac: pytest.MonkeyPatch) -> None:
    """An M5 Max has Super and Performance cores, no efficiency ones; no version captured."""
    mac.setenv("FAKE_MAC", "m5-max")
    facts = mac_facts()
    assert facts["cpu_levels"] == {"Super": 6, "Performance": 12}
    assert facts["gpu_cores"] == 40 and facts["memory_gib"] == 128
    assert facts["macos_version"] is None


def test_rosetta_is_detected_and_shown(mac: pytest.MonkeyPatch) -> None:
    mac.setenv("FAKE_MAC", "m4")
    mac.setenv("FAKE_SYSCTL", "sysctl.proc_translated=1")
    facts = mac_facts()
    assert facts["rosetta"] is True
    line = machine_line({"hostname": "mini", "device": "Apple M4", "backend": "gpu", **facts})
    assert "PYTHON UNDER ROSETTA" in line


def test_the_device_line_tells_two_macs_of_one_name_apart(mac: pytest.MonkeyPatch) -> None:
    mac.setenv("FAKE_MAC", "m4")
    machine = {
        "hostname": "mini",
        "device": "Apple M4",
        "backend": "gpu",
        "os": "Darwin 24.3.0",
        "mlx_version": "0.30.4",
        "mlx_fleet_version": "0.1.0",
        "metal_working_set_bytes": 11_453_251_584,
        **mac_facts(),
    }
    assert machine_line(machine) == (
        "mini: Apple M4 (gpu), 16 GiB RAM, macOS 15.3.1, MLX 0.30.4, mlx-fleet 0.1.0; "
        "Mac16,10, 10-core GPU, 4P+6E, Metal working set 10.7 GiB"
    )


def test_parsers_tolerate_what_the_tools_print_around_the_facts() -> None:
    text = "hw.memsize: 17179869184\nsysctl: unknown oid 'hw.perflevel1.name'\n"
    assert parse_sysctl(text) == {"hw.memsize": "17179869184"}
    assert parse_profiler_gpu_cores("not json") is None
    assert parse_profiler_gpu_cores('{"SPDisplaysDataType": [{"sppci_model": "AMD"}]}') is None


def test_this_machine_says_what_it_does_not_know() -> None:
    """Off macOS the Mac-only facts are None, never guessed; memory is still in GiB."""
    info = machine_info()
    assert info["memory_gib"] == round(psutil.virtual_memory().total / GIB, 2)
    assert info["mlx_version"] and info["backend"] and info["device"]
    if info["metal"] is False:
        assert info["metal_working_set_bytes"] is None
    if not info["apple_silicon"]:
        assert info["gpu_cores"] is None and info["macos_version"] is None
