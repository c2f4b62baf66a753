"""Every bench script still measures: each runs once in its quick mode (seconds) and must exit
0. No figure is asserted (docs/performance.md holds the figures, measured in full); a script
that cannot measure any more (the code it drives changed under it) exits non-zero, and this is
where that shows."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import subprocess_env

ROOT = Path(__file__).resolve().parent.parent
NEEDS_MLX_LM = pytest.mark.skipif(
    importlib.util.find_spec("mlx_lm") is None,
    reason="the script compares with mlx-lm, which is not installed (the `lm` extra)",
)
NEEDS_SERVER_BENCHMARK = pytest.mark.skipif(
    not os.path.isfile(os.environ.get("MLX_LM_SERVER_BENCHMARK", ""))
    or importlib.util.find_spec("aiohttp") is None
    or importlib.util.find_spec("mlx_lm") is None,
    reason="the script runs mlx-lm's benchmarks/server_benchmark.py, which the mlx-lm package "
    "does not ship: set MLX_LM_SERVER_BENCHMARK to its path and install aiohttp and tqdm",
)
SCRIPT_NEEDS = {
    "bench_mlx_lm": NEEDS_MLX_LM,
    "bench_distributed": NEEDS_MLX_LM,
    "bench_serve_http": NEEDS_SERVER_BENCHMARK,
}
"""What a script compares with, where that may be missing here."""
SCRIPTS = [
    pytest.param(path, marks=SCRIPT_NEEDS[path.stem]) if path.stem in SCRIPT_NEEDS else path
    for path in sorted((ROOT / "bench").glob("bench_*.py"))
]

pytestmark = pytest.mark.timeout(400)
TIED = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
"""A bench script as pid 1 of a PID namespace of its own (util-linux; root): when it ends, the
kernel ends every process it started (agents, `agent run`s, ranks), and unshare's child dies with
unshare, which tests/conftest.py ties to this test's process: a killed run leaves none of them."""


@functools.cache
def tied_where_possible() -> list[str]:
    """TIED where this machine lets us make a PID namespace, else nothing (the script as is)."""
    if shutil.which("unshare") is None:
        return []
    made = subprocess.run([*TIED, "true"], capture_output=True, timeout=60)
    return TIED if made.returncode == 0 else []


def test_every_bench_script_is_run_here() -> None:
    assert len(SCRIPTS) >= 9, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: path.stem)
@pytest.mark.slow
def test_a_bench_script_still_measures(script: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [*tied_where_possible(), sys.executable, str(script), "--quick"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=subprocess_env(MLX_FLEET_HOME=str(tmp_path)),
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "machine:" in result.stdout  # what it measured on is printed with the figures
