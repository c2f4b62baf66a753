"""`coordinator publish` then `verify`: a real stored run as a signed bundle, checked, and every
kind of edit (a sample, a mean, a byte of the signature) named (coordinator.reports.bundle)."""

from __future__ import annotations

import base64
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from coordinator.reports.bundle import bundle_problems, make_bundle
from tests.conftest import run_cli


def edited(path: Path, change: Any) -> Path:
    bundle = json.loads(path.read_text())
    change(bundle)
    out = path.with_name(f"edited-{path.name}")
    out.write_text(json.dumps(bundle))
    return out


def scale_a_sample(bundle: dict[str, Any]) -> None:
    bundle["cells"][0]["samples_ms"][0] *= 1.01


def raise_a_mean(bundle: dict[str, Any]) -> None:
    bundle["cells"][1]["tokens_per_sec"] += 1


def flip_a_byte(bundle: dict[str, Any]) -> None:
    raw = bytearray(base64.b64decode(bundle["signature"]["value"]))
    raw[7] ^= 0x01
    bundle["signature"]["value"] = base64.b64encode(bytes(raw)).decode()


@pytest.mark.slow
def test_publish_then_verify_and_every_edit_is_named(tmp_path: Path, fleet_home: Path) -> None:
    run = run_cli(
        "coordinator", "benchmark", "--config-small", "-p", "16", "-n", "4", "-r", "3",
        "-w", "0", "-o", "json",
    )  # fmt: skip
    assert run.returncode in (0, 1), run.stderr  # 1: a noisy cell on a busy machine
    run_id = json.loads(run.stdout)["run_id"]
    published = run_cli("coordinator", "publish", run_id, "--out", str(tmp_path), "--all")
    assert published.returncode == 0, published.stderr
    key = published.stderr.strip().rsplit("signed by ", 1)[1]
    path = tmp_path / f"{run_id}.bundle.json"
    bundle = json.loads(path.read_text())
    assert [c["test"] for c in bundle["cells"]] == ["pp16", "tg4"]
    cell = bundle["cells"][0]
    assert len(cell["samples_ms"]) == 3 and len(cell["samples_sha256"]) == 64
    assert {"os_build", "mlx_version", "mlx_lm_version", "power_mode", "weights_digest"} <= set(
        cell["settings"]
    )
    assert cell["n_depth"] == 0 and bundle["hosts"][0]["machine"]["mlx_version"]
    markdown = (tmp_path / f"{run_id}.md").read_text()
    assert f"coordinator verify {path.name} --key {key}" in markdown and "| pp16 |" in markdown

    ok = run_cli("coordinator", "verify", str(path), "--key", key)
    assert ok.returncode == 0, ok.stderr
    assert "pp16" in ok.stdout and "tg4" in ok.stdout
    assert f"verifies: 2 cells recomputed from their samples; signed by {key}" in ok.stderr

    other = base64.b64encode(bytes(32)).decode()
    cases = {
        "a sample": (
            scale_a_sample,
            [
                "local small/f16 pp16: the samples differ from their SHA-256",
                "local small/f16 pp16: a tok/s sample is not 16 tokens over its time",
                "local small/f16 pp16: mean latency ms",
                "the signature does not match the bundle's content",
            ],
        ),
        "a mean": (
            raise_a_mean,
            ["local small/f16 tg4: mean tok/s", "is not the samples'", "signature does not match"],
        ),
        "a byte of the signature": (flip_a_byte, ["the signature does not match"]),
    }  # fmt: skip
    for what, (change, reasons) in cases.items():
        done = run_cli("coordinator", "verify", str(edited(path, change)))
        assert done.returncode == 1, (what, done.stderr)
        assert done.stderr.startswith("error: does not verify: "), (what, done.stderr)
        assert all(reason in done.stderr for reason in reasons), (what, done.stderr)
    stranger = run_cli("coordinator", "verify", str(path), "--key", other)
    assert stranger.returncode == 1 and f"not by {other}" in stranger.stderr
    (tmp_path / "notes.json").write_text("{}")
    for bad, message in ((tmp_path / "notes.json", "not an mlx-fleet bundle"), (tmp_path, "")):
        done = run_cli("coordinator", "verify", str(bad))
        assert done.returncode == 2 and message in done.stderr, done.stderr


def test_only_valid_cells_are_published_unless_all() -> None:
    """A noisy cell stays out of the bundle by default; the one kept verifies."""
    samples = [10.0, 10.5, 9.5]
    rates = [16_000 / t for t in samples]

    def cell(test: str, noisy: bool) -> dict[str, Any]:
        return {
            "host": "mac1", "model": "small", "bits": 16, "name": f"small/f16 {test} b1",
            "test": test, "n_prompt": 16, "n_gen": 0, "n_depth": 0, "batch_size": 1,
            "status": "ok", "verdict": "invalid" if noisy else "valid",
            "verdict_reasons": ["noisy"] if noisy else [], "samples_ms": samples,
            "samples_tokens_per_sec": rates, "tokens_per_sec": statistics.fmean(rates),
            "std_tokens_per_sec": statistics.stdev(rates), "latency_ms": statistics.fmean(samples),
            "std_latency_ms": statistics.stdev(samples), "settings": {"os_build": "24A335"},
        }  # fmt: skip

    report = {
        "run_id": "r-1",
        "hosts": [{"host": "mac1", "machine": {"hostname": "mac1", "mlx_version": "0.29.1"}}],
        "cells": [cell("pp16", noisy=False), cell("pp32", noisy=True)],
    }
    key = Ed25519PrivateKey.generate()
    valid = make_bundle(report, key, "2026-12-06T06:00:00+00:00")
    assert [c["test"] for c in valid["cells"]] == ["pp16"] and bundle_problems(valid) == []
    every = make_bundle(report, key, "2026-12-06T06:00:00+00:00", every=True)
    assert [c["verdict"] for c in every["cells"]] == ["valid", "invalid"]
    assert bundle_problems(every) == []
