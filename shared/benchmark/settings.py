"""What makes two cells comparable: the settings every record carries (docs/protocol.md §5).

Pure. An agent fills a record's `settings` map (agent/settings.py); `compare` refuses pairs
whose COMPARED settings differ unless told to ignore them, and `compare --by` may group by any
of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

COMPARED = (
    "os_build",
    "mlx_version",
    "mlx_lm_version",
    "mlx_fleet_version",
    "model_revision",
    "weights_digest",
    "power_mode",
    "power_source",
    "wired_limit_bytes",
)
"""The settings two compared cells must share: each changes speed on its own (an OS or MLX
build, other weights, Low Power Mode or a battery, a wired limit). The host's name, its sensor
and its policy differ between hosts a lab means to compare, so they are shown, not enforced."""
SETTINGS = (
    "os_name",
    "os_version",
    *COMPARED,
    "thermal_source",
    "policy",
    "policy_origin",
    "sleep_assertion",
    "agent",
)
"""Every key of a record's `settings` (each may be None: unknown, said so).

power_mode: `normal`, `low` (macOS Low Power Mode) or `high`; power_source: `ac` or `battery`;
policy: the thresholds the cooling policy held; sleep_assertion: what kept the machine awake, or
why nothing could."""


EXPORTED = (
    "os_name",
    "os_version",
    "os_build",
    "mlx_lm_version",
    "model_revision",
    "weights_digest",
    "power_mode",
    "power_source",
    "policy",
    "policy_origin",
    "sleep_assertion",
)
"""The settings a cell's jsonl, csv and sql row carries beside its own columns (mlx_version,
mlx_fleet_version and thermal_source are columns already): issue 42, the rows lacked what the
json records carry."""


def exported_settings(record: Mapping[str, Any]) -> dict[str, Any]:
    """EXPORTED of the record's settings, each None when unknown; the policy as `k=v` text."""
    settings = record.get("settings") or {}
    row = {key: settings.get(key) for key in EXPORTED}
    if row["policy"] is not None:
        row["policy"] = setting_text(row["policy"])
    return row


def setting_text(value: Any) -> str:
    """A setting as one short line: a policy map as `k=v` pairs, None as `unknown`."""
    if value is None:
        return "unknown"
    if isinstance(value, Mapping):
        return " ".join(f"{key}={value[key]}" for key in sorted(value))
    return str(value)


def differing(
    first: Iterable[Mapping[str, Any]],
    second: Iterable[Mapping[str, Any]],
    keys: Iterable[str] = COMPARED,
) -> dict[str, tuple[list[str], list[str]]]:
    """For each of `keys` whose values differ between the two sets of records: the values each
    side holds (as setting_text), sorted. Records without settings contribute `unknown`."""
    keys = list(keys)
    left = _values(first, keys)
    right = _values(second, keys)
    return {key: (left[key], right[key]) for key in keys if left[key] != right[key]}


def _values(records: Iterable[Mapping[str, Any]], keys: list[str]) -> dict[str, list[str]]:
    seen: dict[str, set[str]] = {key: set() for key in keys}
    for record in records:
        settings = record.get("settings") or {}
        for key in keys:
            seen[key].add(setting_text(settings.get(key)))
    return {key: sorted(values) for key, values in seen.items()}
