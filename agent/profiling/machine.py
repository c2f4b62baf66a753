"""Facts about this machine that belong next to every benchmark number.

On a Mac they come from the tools every Mac has (mac-desk-check.md, machine facts): `sysctl`
(chip `machdep.cpu.brand_string`, model `hw.model`, memory `hw.memsize`, CPU levels
`hw.perflevelN.physicalcpu` / `.name`, macOS `kern.osproductversion`, Rosetta
`sysctl.proc_translated`), the GPU core count from the IORegistry's `AGXAccelerator`
(`gpu-core-count`), else `system_profiler SPDisplaysDataType -json` (`sppci_cores`), which tells
binned chips apart. Parsing is pure; a fact no tool gave is None ("unknown"), never guessed.
"""

from __future__ import annotations

import json
import platform
import re
import socket
import subprocess
import sys
from importlib import metadata
from typing import Any

import psutil

from agent.profiling.device_probe import DeviceProbe, probe_device
from agent.profiling.units import to_gb

GIB = 2**30
"""macOS shows memory in binary units: a 16 GB Mac has hw.memsize 17179869184 = 16 GiB."""
TOOL_TIMEOUT_S = 20
SYSCTL_KEYS = (
    "machdep.cpu.brand_string",
    "hw.model",
    "hw.memsize",
    "hw.perflevel0.physicalcpu",
    "hw.perflevel0.name",
    "hw.perflevel1.physicalcpu",
    "hw.perflevel1.name",
    "kern.osproductversion",
    "hw.optional.arm64",
    "sysctl.proc_translated",
)
LEVEL_NAMES = ("Performance", "Efficiency")
"""perflevel0/1 when macOS gives no `hw.perflevelN.name` (an M5 names them Super, Performance)."""


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# --- parsing (pure) ---------------------------------------------------------------------------


def parse_sysctl(text: str) -> dict[str, str]:
    """`sysctl NAME...` output (`NAME: value` lines) as a dict; unknown names are absent."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key != "sysctl":  # `sysctl: unknown oid ...` is not a value
            values[key.strip()] = value.strip()
    return values


def parse_ioreg_gpu_cores(text: str) -> int | None:
    match = re.search(r'"gpu-core-count" = (\d+)', text)
    return int(match.group(1)) if match else None


def parse_profiler_gpu_cores(text: str) -> int | None:
    """`sppci_cores` of the Apple GPU in `system_profiler SPDisplaysDataType -json`."""
    try:
        displays = json.loads(text).get("SPDisplaysDataType", [])
    except (json.JSONDecodeError, AttributeError):
        return None
    for gpu in displays:
        cores = str(gpu.get("sppci_cores", ""))
        if gpu.get("spdisplays_vendor") == "sppci_vendor_Apple" and cores.isdigit():
            return int(cores)
    return None


def cpu_levels(values: dict[str, str]) -> dict[str, int] | None:
    """Cores per performance level, by the level's name: {"Performance": 4, "Efficiency": 6}."""
    levels = {}
    for level, fallback in enumerate(LEVEL_NAMES):
        count = values.get(f"hw.perflevel{level}.physicalcpu", "")
        if count.isdigit():
            levels[values.get(f"hw.perflevel{level}.name") or fallback] = int(count)
    return levels or None


def mac_facts_from(values: dict[str, str], gpu_cores: int | None) -> dict[str, Any]:
    memsize = values.get("hw.memsize", "")
    return {
        "chip": values.get("machdep.cpu.brand_string"),
        "hw_model": values.get("hw.model"),
        "memory_gib": round(int(memsize) / GIB, 2) if memsize.isdigit() else None,
        "cpu_levels": cpu_levels(values),
        "gpu_cores": gpu_cores,
        "macos_version": values.get("kern.osproductversion"),
        "apple_silicon": values.get("hw.optional.arm64") == "1",
        "rosetta": values.get("sysctl.proc_translated") == "1",
    }


# --- asking the tools -------------------------------------------------------------------------


def tool_output(*command: str) -> str:
    """A tool's stdout, whatever its exit status (sysctl exits 1 after an unknown name but
    still prints the rest); "" when it cannot run."""
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def mac_facts() -> dict[str, Any]:
    values = parse_sysctl(tool_output("sysctl", *SYSCTL_KEYS))
    gpu_cores = parse_ioreg_gpu_cores(tool_output("ioreg", "-r", "-c", "AGXAccelerator", "-d", "1"))
    if gpu_cores is None:
        gpu_cores = parse_profiler_gpu_cores(
            tool_output("system_profiler", "SPDisplaysDataType", "-json")
        )
    return mac_facts_from(values, gpu_cores)


def linux_chip() -> str:
    """The cpuinfo model name, else what platform says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_facts() -> dict[str, Any]:
    """The hardware and OS: a Mac's from its tools, another machine's from /proc and psutil."""
    if sys.platform == "darwin":
        return mac_facts()
    return {
        "chip": linux_chip(),
        "hw_model": None,
        "memory_gib": round(psutil.virtual_memory().total / GIB, 2),
        "cpu_levels": None,
        "gpu_cores": None,
        "macos_version": None,
        "apple_silicon": False,
        "rosetta": None,
    }


def mlx_facts(probe: DeviceProbe) -> dict[str, Any]:
    """MLX's version and device as the probe child found them (agent.profiling.device_probe);
    when it found nothing, the device is "unknown" and `device_error` says why."""
    if probe.facts is not None:
        return {**probe.facts, "device_error": None}
    return {
        "mlx_version": package_version("mlx"),
        "backend": None,
        "device": "unknown",
        "architecture": platform.machine(),
        "metal": None,
        "metal_working_set_bytes": None,
        "device_error": probe.failure,
    }


def machine_info(probe: DeviceProbe | None = None) -> dict[str, Any]:
    """This machine's facts; `probe`: a device probe already run (else one is run now)."""
    facts = host_facts()
    mlx = mlx_facts(probe or probe_device())
    return {
        "hostname": socket.gethostname(),
        **facts,
        "chip": facts["chip"] or platform.machine(),
        **mlx,
        "device": mlx["device"] or facts["chip"] or platform.machine(),
        "memory_gb": to_gb(psutil.virtual_memory().total),
        "os": f"{platform.system()} {platform.release()}",
        "os_version": platform.mac_ver()[0] or platform.version(),
        "python": platform.python_version(),
        "python_arch": platform.machine(),
        "mlx_lm_version": package_version("mlx-lm"),
        "mlx_fleet_version": package_version("mlx-fleet"),
        "cpu_count": psutil.cpu_count(),
    }
