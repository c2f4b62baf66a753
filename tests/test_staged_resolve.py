"""A staged copy is what `--model ORG/NAME` loads, without asking the Hub (docs/staging.md,
Benchmarks on staged copies): the agent's resolution (agent/profiling/hf_models.py) in a real
process whose Hugging Face endpoint is a local server counting the requests it gets, next to a
copy huggingface_hub cached the ordinary way, which is checked with the Hub first."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import subprocess_env

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LOCATE = "from agent.profiling.hf_models import locate; import sys; print(locate(sys.argv[1]).path)"


class Hub(http.server.BaseHTTPRequestHandler):
    """Answers every request 404, as the Hub answers for a repository it does not have, and
    counts them."""

    asked: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.asked.append(self.path)
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.end_headers()

    do_HEAD = do_GET  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hub() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    Hub.asked = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def cached(cache: Path, repo: str, staged: bool) -> Path:
    """`repo` at COMMIT in `cache` (refs/main naming it), with a staging record or without."""
    entry = cache / f"models--{repo.replace('/', '--')}"
    snapshot = entry / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(COMMIT)
    if staged:
        (entry / ".mlx-fleet").mkdir()
        (entry / ".mlx-fleet" / f"{COMMIT}.json").write_text("{}")
    return snapshot


def locate(model: str, home: Path, hub: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LOCATE, model],
        capture_output=True, text=True, timeout=120,
        env=subprocess_env(HF_HOME=str(home), HF_ENDPOINT=hub, HF_HUB_OFFLINE="0"),
    )  # fmt: skip


@pytest.mark.slow
def test_a_staged_copy_is_loaded_without_asking_the_hub(tmp_path: Path, hub: str) -> None:
    snapshot = cached(tmp_path / "hub", "lab/staged", staged=True)
    found = locate("lab/staged", tmp_path, hub)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == str(snapshot)
    assert Hub.asked == []
    by_commit = locate(f"lab/staged@{COMMIT}", tmp_path, hub)
    assert by_commit.stdout.strip() == str(snapshot) and Hub.asked == []


@pytest.mark.slow
def test_a_copy_cached_the_ordinary_way_is_checked_with_the_hub(tmp_path: Path, hub: str) -> None:
    snapshot = cached(tmp_path / "hub", "lab/downloaded", staged=False)
    found = locate("lab/downloaded", tmp_path, hub)
    assert Hub.asked, found.stderr  # the Hub was asked first, as mlx-lm asks it
    assert found.stdout.strip() == str(snapshot)  # then its answer taken as "use the cache"
