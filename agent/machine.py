"""Facts about this machine that belong next to every benchmark number."""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
from importlib import metadata
from typing import Any

import mlx.core as mx
import psutil

from agent.profiling.memory import to_gb


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def chip_name() -> str:
    """The CPU/SoC marketing name: 'Apple M4' on a Mac, the cpuinfo model name on Linux."""
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            )
            return out.stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, Any]:
    device = dict(mx.device_info())
    return {
        "hostname": socket.gethostname(),
        "chip": chip_name(),
        "device": device.get("device_name") or chip_name(),
        "architecture": device.get("architecture", platform.machine()),
        "backend": mx.default_device().type.name,
        "memory_gb": to_gb(psutil.virtual_memory().total),
        "os": f"{platform.system()} {platform.release()}",
        "os_version": platform.mac_ver()[0] or platform.version(),
        "python": platform.python_version(),
        "mlx_version": mx.__version__,
        "mlx_lm_version": package_version("mlx-lm"),
        "mlx_fleet_version": package_version("mlx-fleet"),
        "cpu_count": psutil.cpu_count(),
    }
