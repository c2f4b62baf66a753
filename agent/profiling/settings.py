"""The settings every benchmark record carries (docs/protocol.md §5, shared.benchmark.settings):
what changes speed besides the code measured — the OS build, the MLX versions, the weights, Low
Power Mode, the power source, the wired limit, the cooling policy.

Every reader says None (unknown) rather than guess. The parse functions are pure and tested on
captured `pmset` text; the readers call `sw_vers`, `sysctl`, `pmset` on macOS and read sysfs on
Linux. Injected faults (shared.benchmark.faults: `low-power`, `on-battery`) override what was read,
and the record says so in its `injected` list.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
import re
import subprocess
from collections.abc import Callable
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from shared.benchmark.faults import INJECTED_FLAG, Fault, for_cell

COMMAND_TIMEOUT_S = 5.0
SYSFS_POWER = Path("/sys/class/power_supply")
PLATFORM_PROFILE = Path("/sys/firmware/acpi/platform_profile")
INJECTED_SETTINGS = {"low-power": ("power_mode", "low"), "on-battery": ("power_source", "battery")}
"""Fault kind -> (the setting it overrides, the value it says)."""


# --- pure parsing -------------------------------------------------------------------------------


def parse_pmset_power_mode(text: str) -> str | None:
    """`pmset -g` output -> `low`, `high` or `normal`; None when it names no mode.

    Older macOS prints ` lowpowermode         1`; macOS 12+ on some Macs prints
    ` powermode            1` (0 automatic/normal, 1 low, 2 high). Where both appear, a set
    lowpowermode wins."""
    values = dict(re.findall(r"^\s*(lowpowermode|powermode)\s+(\d+)\s*$", text, re.MULTILINE))
    if values.get("lowpowermode") == "1":
        return "low"
    mode = values.get("powermode")
    if mode is not None:
        return {"1": "low", "2": "high"}.get(mode, "normal")
    if "lowpowermode" in values:
        return "normal"
    return None


def parse_pmset_power_source(text: str) -> str | None:
    """`pmset -g batt` output -> `ac` or `battery`; None when it names neither."""
    match = re.search(r"Now drawing from '([^']+)'", text)
    if match is None:
        return None
    source = match.group(1)
    if source == "AC Power":
        return "ac"
    if source == "Battery Power":
        return "battery"
    return None


def linux_power_source(supplies: list[dict[str, str]]) -> str | None:
    """Power supplies (their sysfs `type`, `online`, `status`) -> `ac`, `battery` or None: a
    Mains online is `ac`; a discharging Battery with no Mains online is `battery`."""
    if any(s.get("type") == "Mains" and s.get("online") == "1" for s in supplies):
        return "ac"
    if any(s.get("type") == "Battery" and s.get("status") == "Discharging" for s in supplies):
        return "battery"
    return None


def linux_power_mode(profile: str | None) -> str | None:
    """/sys/firmware/acpi/platform_profile's text -> `low`, `normal`, or None when absent."""
    if profile is None:
        return None
    return "low" if profile.strip() == "low-power" else "normal"


def config_digest(config: Any, seed: int | None) -> str:
    """A builtin model's identity: `config:` + sha256 over its config and weight seed (its
    weights are random from that seed, so these are all that fixes them)."""
    fields = asdict(config) if is_dataclass(config) and not isinstance(config, type) else config
    text = json.dumps({"config": fields, "seed": seed}, sort_keys=True, default=str)
    return "config:" + hashlib.sha256(text.encode()).hexdigest()


def weights_digest(directory: Path) -> str | None:
    """An mlx-lm directory's weights: `sha256:` over the sorted (file name, file sha256) of its
    *.safetensors. A symlink into a Hugging Face cache's blobs/ is named by its sha256, which is
    used as is; any other file is hashed. None without safetensors or when one cannot be read."""
    return _files_digest(directory, "sha256:", file_sha256)


def listing_digest(directory: Path) -> str | None:
    """What names a directory's weights without reading them: `listing:` + sha256 over the
    sorted (file name, size) of its *.safetensors, a blob in a Hugging Face cache by its hash
    (weights_digest's). Cheap enough to answer a request with; two directories of the same
    names and sizes but other bytes pass it, and fail weights_digest's check when loaded."""
    return _files_digest(directory, "listing:", lambda file: blob_hash(file) or file.stat().st_size)


def _files_digest(directory: Path, prefix: str, of: Callable[[Path], object]) -> str | None:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    outer = hashlib.sha256()
    try:
        for file in files:
            outer.update(f"{file.name}\0{of(file)}\n".encode())
    except OSError:
        return None
    return prefix + outer.hexdigest()


def blob_hash(file: Path) -> str | None:
    """A Hugging Face cache's file is a symlink to blobs/SHA256: its hash, unread."""
    if file.is_symlink():
        target = file.resolve()
        if target.parent.name == "blobs" and re.fullmatch(r"[0-9a-f]{64}", target.name):
            return target.name
    return None


def file_sha256(file: Path) -> str:
    if (known := blob_hash(file)) is not None:
        return known
    digest = hashlib.sha256()
    with file.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def with_faults(
    settings: dict[str, Any], faults: tuple[Fault, ...], number: int
) -> tuple[dict[str, Any], list[str]]:
    """The settings of cell `number` (1-based) with its injected faults applied, and the kinds
    applied (for the record's `injected` list)."""
    injected = []
    settings = dict(settings)
    for kind in for_cell(faults, number):
        if kind in INJECTED_SETTINGS:
            key, value = INJECTED_SETTINGS[kind]
            settings[key] = value
            injected.append(kind)
    return settings, injected


def mark_injected(record: dict[str, Any], kinds: list[str]) -> None:
    """Add `kinds` to the record's `injected` list and flag it `injected`."""
    if not kinds:
        return
    record["injected"] = list(dict.fromkeys([*(record.get("injected") or []), *kinds]))
    flags = record.setdefault("flags", [])
    if isinstance(flags, list) and INJECTED_FLAG not in flags:
        flags.append(INJECTED_FLAG)


# --- readers ------------------------------------------------------------------------------------


def _command(*argv: str) -> str | None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def os_settings() -> dict[str, str | None]:
    if platform.system() == "Darwin":
        version = (_command("sw_vers", "-productVersion") or platform.mac_ver()[0]).strip()
        build = _command("sw_vers", "-buildVersion") or _command("sysctl", "-n", "kern.osversion")
        return {
            "os_name": "macOS",
            "os_version": version or None,
            "os_build": build.strip() if build else None,
        }
    return {
        "os_name": platform.system() or None,
        "os_version": platform.release() or None,
        "os_build": platform.version() or None,
    }


def power_settings() -> dict[str, str | None]:
    if platform.system() == "Darwin":
        mode = _command("pmset", "-g")
        batt = _command("pmset", "-g", "batt")
        return {
            "power_mode": parse_pmset_power_mode(mode) if mode else None,
            "power_source": parse_pmset_power_source(batt) if batt else None,
        }
    supplies = []
    if SYSFS_POWER.is_dir():
        for supply in sorted(SYSFS_POWER.iterdir()):
            fields = {name: _read(supply / name) for name in ("type", "online", "status")}
            supplies.append({k: v for k, v in fields.items() if v is not None})
    return {
        "power_mode": linux_power_mode(_read(PLATFORM_PROFILE)),
        "power_source": linux_power_source(supplies),
    }


def sleep_assertion() -> str | None:
    """What keeps the machine awake (agent.awake.assertion.held()), None where unknown."""
    try:
        from agent.awake import assertion  # noqa: PLC0415 - optional, read when present
    except ImportError:
        return None
    held = getattr(assertion, "held", None)
    try:
        return held() if callable(held) else None
    except Exception:  # a reader of settings never fails a run
        return None


def _policy(guard: Any) -> dict[str, Any] | None:
    policy = getattr(guard, "policy", None) if guard is not None else None
    to_dict = getattr(policy, "to_dict", None)
    return to_dict() if callable(to_dict) else None


def _policy_origin(guard: Any) -> str | None:
    for holder in (guard, getattr(guard, "monitor", None)):
        origin = getattr(holder, "policy_origin", None)
        if isinstance(origin, str):
            return origin
    return None


def _thermal_source(guard: Any) -> str | None:
    source = getattr(getattr(guard, "monitor", None), "source", None)
    name = getattr(source, "name", None)
    return name if isinstance(name, str) else None


def run_settings(
    guard: Any = None, wired_limit_bytes: int | None = None, agent: str | None = None
) -> dict[str, Any]:
    """The run-wide settings (model_revision and weights_digest None: model_settings fills
    them per model). `guard` gives the policy and the thermal source where it has them."""
    return {
        **os_settings(),
        "mlx_version": _version("mlx"),
        "mlx_lm_version": _version("mlx-lm"),
        "mlx_fleet_version": _version("mlx-fleet"),
        "model_revision": None,
        "weights_digest": None,
        **power_settings(),
        "wired_limit_bytes": wired_limit_bytes,
        "thermal_source": _thermal_source(guard),
        "policy": _policy(guard),
        "policy_origin": _policy_origin(guard),
        "sleep_assertion": sleep_assertion(),
        "agent": agent or platform.node() or None,
    }
