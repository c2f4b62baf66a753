"""`--model ORG/NAME[@REVISION]`: a real Hugging Face cache layout (models--ORG--NAME/refs and
snapshots/COMMIT/, as huggingface_hub writes it) holding a tiny mlx-lm model, benchmarked with
HF_HUB_OFFLINE=1, by `agent bench` and by `agent serve`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import zmq

from shared.io.transport import AgentError
from shared.wire import protocol as p
from tests.conftest import subprocess_env
from tests.fleet_support import AgentPool, connect, trusted_agent
from tests.test_model_dir import TINY_LLAMA, write_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "test-org/tiny-llama"


@pytest.fixture
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HOME with REPO cached at COMMIT (refs/main and a tag v1 point at it); offline."""
    home = tmp_path / "hf"
    repo = home / "hub" / f"models--{REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    write_model(snapshot, TINY_LLAMA)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "refs" / "v1").write_text(COMMIT)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return home


def bench(agent_cli: str, model: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [agent_cli, "bench", "--model", model, "-p", "8", "-n", "2", "-r", "1", "-w", "0", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=subprocess_env(COLUMNS="200"),
    )


@pytest.mark.slow
def test_an_id_runs_offline_from_the_cache(agent_cli: str, hf_home: Path) -> None:
    result = bench(agent_cli, REPO, "-o", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (model,) = report["models"]
    assert model["revision"] == COMMIT and model["kind"] == "mlx-lm"
    assert model["label"] == f"{REPO}@{COMMIT[:7]}/stored (f16)"
    assert [c["status"] for c in report["cells"]] == ["ok", "ok"]
    assert all(c["model"] == REPO and c["model_revision"] == COMMIT for c in report["cells"])
    table = bench(agent_cli, REPO)
    assert f"{REPO}@{COMMIT[:7]}/stored" in table.stdout, table.stdout


@pytest.mark.parametrize("revision", ["main", "v1", COMMIT])
@pytest.mark.slow
def test_a_revision_names_a_branch_a_tag_or_a_commit(
    agent_cli: str, hf_home: Path, revision: str
) -> None:
    result = bench(agent_cli, f"{REPO}@{revision}", "-o", "csv")
    assert result.returncode == 0, result.stderr
    assert f"{REPO}@{revision}/stored" in result.stdout


@pytest.mark.parametrize(
    ("model", "needles"),
    [
        (
            "test-org/missing",
            ["test-org/missing", "HF_HUB_OFFLINE=1", "hf download test-org/missing"],
        ),
        (f"{REPO}@v9", [f"{REPO}@v9", "--revision v9", "not in the Hugging Face cache"]),
    ],
)
@pytest.mark.slow
def test_a_model_missing_offline_is_one_line_naming_it(
    agent_cli: str, hf_home: Path, model: str, needles: list[str]
) -> None:
    result = bench(agent_cli, model)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(needle in lines[0] for needle in needles), result.stderr


@pytest.mark.slow
def test_the_agent_resolves_an_id_on_its_own_machine(
    ctx: zmq.Context, agents: AgentPool, hf_home: Path
) -> None:
    client = connect(ctx, trusted_agent(agents))
    matrix = {"models": [REPO], "n_prompt": [8], "n_gen": [2], "warmup": 0, "iterations": 1}
    stream = list(client.stream(client.send("bench.start", {"matrix": matrix})))
    cells = [m.body["record"] for m in stream if m.type == "bench.cell"]
    assert [c["status"] for c in cells] == ["ok", "ok"], cells
    assert cells[0]["model_revision"] == COMMIT
    with pytest.raises(AgentError) as refused:
        client.request("bench.start", {"matrix": dict(matrix, models=["test-org/missing"])})
    assert refused.value.code == p.BAD_MATRIX
    assert "test-org/missing is not in the Hugging Face cache" in str(refused.value)
    client.close()
