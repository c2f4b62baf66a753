"""The coordinator's side of staging, without agents: the models table, the copy a
benchmark's --model names on a host and the line that refuses a differing one
(shared/staging/fleet.py), and `coordinator stage`'s bad input, refused before any host is
asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.staging.fleet import (
    byte_text,
    chunk_size_for,
    differing_copy,
    models_matrix,
    named_copy,
    rate_text,
    state_text,
)
from tests.conftest import run_cli

COMMIT_A = "a" * 40
COMMIT_B = "b" * 40


def copy(state: str = "present", revision: str = COMMIT_A, digest: str | None = "d" * 64,
         refs: tuple[str, ...] = ("main",), size: int = 1000, held: int = 1000,
         error: str | None = None, model: str = "org/m") -> dict:  # fmt: skip
    return {
        "model": model,
        "revision": revision,
        "refs": list(refs),
        "state": state,
        "digest": digest,
        "size": size,
        "bytes": held,
        "files": 3,
        "error": error,
    }


def test_the_models_table_names_every_state_of_every_host() -> None:
    rows = [
        {"host": "a", "models": [copy(), copy(model="org/other")], "error": None},
        {"host": "b", "models": [copy("partial", held=450)], "error": None},
        {"host": "c", "models": [copy("mismatch", error="model.safetensors differs")],
         "error": None},
        {"host": "d", "models": [], "error": None},
        {"host": "e", "models": [], "error": "unreachable"},
    ]  # fmt: skip
    matrix = models_matrix(rows)
    assert [entry["model"] for entry in matrix] == ["org/m@aaaaaaa", "org/other@aaaaaaa"]
    assert matrix[0]["hosts"] == {
        "a": "present",
        "b": "partial (45 %)",
        "c": "mismatch",
        "d": "missing",
        "e": "unknown",
    }
    assert matrix[1]["hosts"]["b"] == "missing"


def test_a_model_id_names_the_copy_its_ref_or_commit_names() -> None:
    held = [copy(revision=COMMIT_A, refs=("main",)), copy(revision=COMMIT_B, refs=("v1",))]
    assert named_copy(held, "org/m", None)["revision"] == COMMIT_A
    assert named_copy(held, "org/m", "v1")["revision"] == COMMIT_B
    assert named_copy(held, "org/m", COMMIT_B[:7])["revision"] == COMMIT_B
    assert named_copy(held, "org/m", "bbb") is None  # too short a prefix to name a commit
    assert named_copy(held, "org/x", None) is None
    assert named_copy([copy(refs=())], "org/m", None)["revision"] == COMMIT_A


def test_a_flipped_byte_refuses_its_host_naming_the_file() -> None:
    held = {
        "a": copy(),
        "b": copy("mismatch", error="model.safetensors: sha256 differs from the manifest"),
        "c": None,
    }
    assert differing_copy("org/m", held) == (
        "b: its copy of org/m is not what was staged: model.safetensors: sha256 differs from the "
        "manifest"
    )


def test_a_copy_of_another_digest_is_named_against_the_others() -> None:
    held = {"a": copy(), "b": copy(digest="e" * 64, revision=COMMIT_B), "c": copy()}
    line = differing_copy("org/m", held)
    assert line is not None and line.startswith("b: its copy of org/m (bbbbbbbbbbbb, digest ")
    assert "is not a's (aaaaaaaaaaaa" in line
    assert differing_copy("org/m", {"a": copy(), "b": copy(), "c": None}) is None
    assert differing_copy("org/m", {"a": copy(digest=None), "b": copy()}) is None


def test_a_small_model_is_cut_into_more_chunks() -> None:
    assert chunk_size_for(6_000_000) == 256 * 1024
    assert chunk_size_for(32 * 1024 * 1024) == 1024 * 1024
    assert chunk_size_for(4_500_000_000) == chunk_size_for(64 * 1024 * 1024) == 2 * 1024 * 1024
    assert chunk_size_for(0) == 256 * 1024


def test_figures_in_words() -> None:
    assert byte_text(17_131_137) == "17.1 MB"
    assert byte_text(4_500_000_000) == "4.50 GB"
    assert byte_text(None) == "?"
    assert rate_text(None) == "rate unknown"
    assert rate_text(5_300_000) == "5.3 MB/s"
    assert state_text({"state": "hashing", "bytes": 50, "total": 200}) == "hashing 25 %"
    assert state_text({"state": "ready", "bytes": 200, "total": 200}) == "ready"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["org/m", "--hosts", "127.0.0.1:1,127.0.0.1:1"],
         "--hosts: item 2 '127.0.0.1:1': duplicate host 127.0.0.1:1 (already item 1 "
         "'127.0.0.1:1')"),
        (["org/m", "--hosts", ""], "--hosts is empty: name at least one HOST[:PORT]"),
        (["not an id", "--hosts", "127.0.0.1:1"],
         "model not an id: neither a directory here nor a Hugging Face id ORG/NAME[@REVISION]"),
        (["org/m", "--as", "x/y", "--hosts", "127.0.0.1:1"],
         "--as names a directory's copy: MODEL is no directory here"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_before_any_host_is_asked(args: list[str], message: str) -> None:
    done = run_cli("coordinator", "stage", *args)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {message}"]


def test_a_file_is_no_model(tmp_path: Path) -> None:
    file = tmp_path / "weights.bin"
    file.write_bytes(b"x")
    done = run_cli("coordinator", "stage", str(file), "--hosts", "127.0.0.1:1")
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: model {file}: a file, not a model directory"


def test_a_directory_names_a_repository_with_as(tmp_path: Path) -> None:
    done = run_cli("coordinator", "stage", str(tmp_path), "--as", "no-slash", "--hosts", "h:1")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: --as 'no-slash': name the copy ORG/NAME"
