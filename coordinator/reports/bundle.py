"""A published run (`coordinator publish`, `verify`): one self-describing JSON bundle that a
reader can check without trusting the lab's word, and its Markdown for a discussion thread.

The bundle holds every valid cell of the run with its settings (macOS build, MLX and mlx-lm
versions, power mode and source, the model's digest, depth...), each host's facts, each cell's
per-iteration samples with their SHA-256, and an Ed25519 signature over all of it (JSON with
sorted keys and no spaces, the `signature` member left out). `verify` checks the signature and
recomputes every figure from the samples: each tok/s sample is the cell's tokens over its time,
each mean and sample deviation (n-1) is the samples', so a figure edited without its samples, or
a sample edited without its figures, or anything edited after signing, is named.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import statistics
from collections.abc import Sequence
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from rich.text import Text

from shared.benchmark.aggregate import ordered
from shared.reports.benchmark import (
    judged,
    machine_line,
    markdown_table,
    mean_std,
    record_model_label,
)
from shared.safe_text import DETAIL_CAP, shown
from shared.tables import WHOLE, WORDS, FitTable

BUNDLE_FORMAT = "mlx-fleet-bundle/1"
CELL_KEYS = (
    "host", "model", "bits", "test", "n_prompt", "n_gen", "n_depth", "batch_size",
    "prefill_step_size", "test_time", "verdict", "settings", "tokens_per_sec",
    "std_tokens_per_sec", "latency_ms", "std_latency_ms", "samples_ms", "samples_tokens_per_sec",
)  # fmt: skip
"""What a bundle keeps of a cell, besides its model label and its samples' hash."""
SHOWN_SETTINGS = ("os_build", "mlx_version", "mlx_lm_version", "power_mode", "power_source")
"""The settings a bundle's table shows (all are in the bundle)."""
RELATIVE = 1e-9
"""How close a stated figure must be to the one recomputed (float rounding only)."""


class BundleError(ValueError):
    """A file that is not a bundle at all (the message says why): a usage error."""


def canonical(value: Any) -> bytes:
    """The bytes a signature and a hash cover: JSON, sorted keys, no spaces, ASCII."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def samples_hash(cell: dict[str, Any]) -> str:
    samples = {key: cell[key] for key in ("samples_ms", "samples_tokens_per_sec")}
    return hashlib.sha256(canonical(samples)).hexdigest()


def bundle_cell(record: dict[str, Any]) -> dict[str, Any]:
    cell = {key: record.get(key) for key in CELL_KEYS}
    cell["model_label"] = record_model_label(record)
    cell["samples_sha256"] = samples_hash(cell)
    return cell


def make_bundle(
    report: dict[str, Any], key: Ed25519PrivateKey, published: str, every: bool = False
) -> dict[str, Any]:
    """The run's valid cells (`every`: every cell with samples, each with its verdict) with
    their hosts' facts, signed by `key`."""
    cells = [
        bundle_cell({**r, "verdict": judged(r).get("verdict")})
        for r in ordered(report["cells"])
        if r.get("samples_ms") and (every or judged(r).get("verdict") == "valid")
    ]
    used = {cell["host"] for cell in cells}
    bundle = {
        "format": BUNDLE_FORMAT,
        "run_id": report.get("run_id"),
        "published": published,
        "hosts": [
            {"host": h.get("host"), "machine": h.get("machine") or {}}
            for h in report.get("hosts") or []
            if h.get("host") in used
        ],
        "cells": cells,
    }
    public = key.public_key().public_bytes_raw()
    bundle["signature"] = {
        "algorithm": "ed25519",
        "public_key": base64.b64encode(public).decode("ascii"),
        "value": base64.b64encode(key.sign(canonical(bundle))).decode("ascii"),
    }
    return bundle


def read_bundle(text: str) -> dict[str, Any]:
    """The bundle in `text`, or BundleError saying why it is none."""
    try:
        bundle = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BundleError(f"not JSON: {exc}") from None
    if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
        raise BundleError(f"not an mlx-fleet bundle (no format {BUNDLE_FORMAT!r})")
    if not isinstance(bundle.get("cells"), list) or not isinstance(bundle.get("signature"), dict):
        raise BundleError("a bundle without its cells or its signature")
    return bundle


def cell_name(cell: dict[str, Any]) -> str:
    return shown(f"{cell.get('host')} {cell.get('model_label')} {cell.get('test')}", DETAIL_CAP)


def _differs(stated: Any, computed: float | None) -> bool:
    if computed is None or stated is None:
        return stated is not computed
    if not isinstance(stated, (int, float)) or not math.isfinite(stated):
        return True
    return not math.isclose(stated, computed, rel_tol=RELATIVE, abs_tol=1e-12)


def figure_problems(cell: dict[str, Any]) -> list[str]:
    """What in one cell disagrees with its samples (empty: every figure recomputes)."""
    name = cell_name(cell)
    try:
        times = [float(t) for t in cell["samples_ms"]]
        rates = [float(r) for r in cell["samples_tokens_per_sec"]]
        tokens = (int(cell["n_prompt"]) + int(cell["n_gen"])) * int(cell["batch_size"])
    except (KeyError, TypeError, ValueError):
        return [f"{name}: its samples or its test are missing or not numbers"]
    problems = []
    if samples_hash(cell) != cell.get("samples_sha256"):
        problems.append(f"{name}: the samples differ from their SHA-256")
    if not times or len(times) != len(rates):
        return [*problems, f"{name}: {len(times)} times for {len(rates)} tok/s samples"]
    if any(_differs(rate, tokens * 1000 / t) for rate, t in zip(rates, times, strict=True)):
        problems.append(f"{name}: a tok/s sample is not {tokens} tokens over its time")
    deviation = statistics.stdev if len(times) > 1 else (lambda _: None)
    for label, key, computed in (
        ("mean tok/s", "tokens_per_sec", statistics.fmean(rates)),
        ("tok/s ±", "std_tokens_per_sec", deviation(rates)),
        ("mean latency ms", "latency_ms", statistics.fmean(times)),
        ("latency ms ±", "std_latency_ms", deviation(times)),
    ):
        if _differs(cell.get(key), computed):
            problems.append(f"{name}: {label} {cell.get(key)!r} is not the samples' {computed!r}")
    return problems


def signature_problem(bundle: dict[str, Any], expected_key: str | None = None) -> str | None:
    """Why the signature does not hold (None: it does, by the key given if one is)."""
    signature = bundle["signature"]
    unsigned = {key: value for key, value in bundle.items() if key != "signature"}
    try:
        public = base64.b64decode(signature.get("public_key", ""), validate=True)
        value = base64.b64decode(signature.get("value", ""), validate=True)
        Ed25519PublicKey.from_public_bytes(public).verify(value, canonical(unsigned))
    except (binascii.Error, ValueError, TypeError, AttributeError):
        return "the signature or its key is not readable Ed25519 base64"
    except InvalidSignature:
        return "the signature does not match the bundle's content"
    if expected_key is not None and signature.get("public_key") != expected_key:
        return f"signed by key {shown(str(signature.get('public_key')))}, not by {expected_key}"
    return None


def bundle_problems(bundle: dict[str, Any], expected_key: str | None = None) -> list[str]:
    """Everything that does not verify: each cell's figures, then the signature."""
    problems = [p for cell in bundle["cells"] for p in figure_problems(cell)]
    signed = signature_problem(bundle, expected_key)
    return problems + ([signed] if signed else [])


def _row(cell: dict[str, Any]) -> list[str]:
    settings = cell.get("settings") or {}
    shown_settings = ", ".join(
        f"{key}={settings[key]}" for key in SHOWN_SETTINGS if settings.get(key) is not None
    )
    return [
        str(cell.get("host")),
        str(cell.get("model_label")),
        str(cell.get("test")),
        str(cell.get("batch_size")),
        mean_std(cell, "tokens_per_sec", "std_tokens_per_sec"),
        str(len(cell.get("samples_ms") or [])),
        str(cell.get("verdict")),
        shown_settings,
    ]


HEADERS = ["host", "model", "test", "batch", "tok/s", "n", "verdict", "settings"]


def bundle_table(bundle: dict[str, Any]) -> FitTable:
    # a bundle is anyone's file, and its strings an agent's words: Text, never markup
    title = Text(shown(f"mlx-fleet run {bundle.get('run_id')} (published)"))
    table = FitTable(title=title, folds=("settings", "n", "batch"))
    for name in HEADERS:
        right = name in ("batch", "tok/s", "n")
        wrap = WORDS if name == "settings" else WHOLE
        table.add_column(name, justify="right" if right else "left", wrap=wrap)
    for cell in bundle["cells"]:
        table.add_row(*(Text(shown(text, DETAIL_CAP)) for text in _row(cell)))
    return table


def host_lines(bundle: dict[str, Any]) -> list[str]:
    return [machine_line(h.get("machine") or {}, h.get("host")) for h in bundle.get("hosts") or []]


def bundle_markdown(bundle: dict[str, Any], file_name: str) -> str:
    """The bundle as a Markdown section a lab pastes into a discussion: hosts, every cell, and
    how a reader checks it."""
    key = bundle["signature"].get("public_key")
    lines = [f"### mlx-fleet run {shown(str(bundle.get('run_id')))}", ""]
    lines += [f"- {shown(line, DETAIL_CAP)}" for line in host_lines(bundle)]
    lines += ["", *markdown_table(HEADERS, (_row(cell) for cell in bundle["cells"])), ""]
    every = all(cell.get("verdict") == "valid" for cell in bundle["cells"])
    lines.append(
        f"{'Valid cells only' if every else 'Every cell, with its verdict'}, each with its "
        f"samples; signed (Ed25519) by `{key}`. "
        f"Check it: `coordinator verify {file_name} --key {key}`."
    )
    return "\n".join(lines) + "\n"


def summary(problems: Sequence[str]) -> str:
    return "does not verify: " + "; ".join(problems)
