"""Stragglers in a group cell across network namespaces (docs/distributed.md, Stragglers):
three ranks of MLX's ring, one per "Mac" (tests.netns_support), a tiny mlx-lm model split three
ways tensor-parallel. B's agent runs with MLX_FLEET_INJECT=step-delay on the first cell: the
coordinator names rank 1 (B) and says compute, as the cell lands and in the table and the
stored record. Then A's sends to C are slowed (`tc netem delay`, or an htb rate where the
kernel has no netem): the coordinator names the link C↔A.

A busy test machine can make a rank or a link look slow besides (docs/distributed.md says why:
at load 15 on this 2-core VM a second link, B↔C, read 5+ ms one way in two runs of two), so each
check asks that the injected fault be named, and be the slowest, not that nothing else is.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.distributed.stragglers import same_link
from tests.conftest import console_script, subprocess_env
from tests.fleet_support import AgentPool, AgentProcess, exchange_keys
from tests.netns_support import Lab, lab
from tests.test_model_shard import TINY, write_model_dir

pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("netns")]
"""One xdist worker runs the netns tests one after another (`--dist loadgroup`)."""

THREE_WAYS = {
    **TINY,
    "model_type": "llama",
    "hidden_size": 96,
    "num_attention_heads": 6,
    "num_key_value_heads": 3,
    "intermediate_size": 192,
}
"""TINY with heads and MLP units that split over three ranks."""
DELAY_S = 0.3
"""B's injected delay at each step of the first cell: far above a busy machine's noise."""
MATRIX = ["-p", "16", "-n", "4", "-r", "2", "-w", "1", "--connect-timeout", "60"]
"""Two cells: pp16 (cell 1, B delayed), tg4 (cell 2)."""
WAIT_S = 300.0


@pytest.fixture
def ring(agents: AgentPool, tmp_path: Path) -> Iterator[tuple[Lab, dict[str, AgentProcess], Path]]:
    pytest.importorskip("mlx_lm", reason="the `lm` extra (mlx-lm) is not installed")
    model = write_model_dir(tmp_path / "three-ways", THREE_WAYS)
    with lab(["a", "b", "c"]) as made:
        started = {}
        for host in "abc":
            inject = ["env", f"MLX_FLEET_INJECT=step-delay:{DELAY_S}@1"] if host == "b" else []
            started[host] = agents.start(
                host, netns=made.namespaces[host], bind_host=made.addresses[host], wrapper=inject
            )
            exchange_keys(started[host])
        yield made, started, model


def group_run(made: Lab, group: str, model: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    """`coordinator benchmark --hosts A+B+C` and the run as `show -o json` gives it back."""
    done = made.run(
        [console_script("coordinator"), "benchmark", "--hosts", group, "--model", str(model),
         *MATRIX],
        capture_output=True, text=True, timeout=WAIT_S, env=subprocess_env(COLUMNS="250"),
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr  # 1: a cell of two repetitions may be noisy
    run = re.search(r"run (r-\S+) stored", done.stderr)
    assert run, done.stderr
    shown = made.run(
        [console_script("coordinator"), "show", run.group(1), "-o", "json"],
        capture_output=True, text=True, timeout=60, env=subprocess_env(),
    )  # fmt: skip
    return done, json.loads(shown.stdout)


@pytest.mark.slow
def test_a_delayed_rank_is_named_compute_and_a_slowed_link_is_named(
    ring: tuple[Lab, dict[str, AgentProcess], Path],
) -> None:
    made, started, model = ring
    a, b, c = (started[host].address for host in "abc")
    group = f"{a}+{b}+{c}"

    done, report = group_run(made, group, model)
    delayed, after = (cell for cell in report["cells"] if cell["host"] == group)
    assert delayed["status"] == "ok", delayed.get("error")
    found = delayed["stragglers"]
    assert found["rank"] == 1 and found["host"] == b, found
    assert found["verdict"] in ("compute", "compute+link"), found["why"]
    assert f"rank 1 ({b}) computes" in found["why"] and "(injected: step-delay)" in found["why"]
    delayed_rank = found["ranks"][1]
    assert delayed_rank["compute_s"] >= DELAY_S and delayed_rank["relative"] < 0.7
    assert all(rank["wait_s"] >= DELAY_S / 2 for rank in found["ranks"] if rank["rank"] != 1)
    assert delayed["injected"] == ["step-delay"] and "injected" in delayed["flags"]
    assert "injected" not in after["flags"]
    named = f"{delayed['name']}: straggler rank 1 ({b}): compute"
    assert f"{group}: {named}" in done.stderr  # said as the cell landed
    assert f"straggler rank 1 ({b}): compute" in done.stdout  # and in the table's flags

    how = made.slow_link("a", "c")
    done, report = group_run(made, group, model)
    slowed = [cell for cell in report["cells"] if cell["host"] == group][1]  # B not delayed
    found = slowed["stragglers"]
    assert found["verdict"] in ("link", "compute+link"), (how, found["why"])
    named = [same_link(link) for link in found["link"].split(", ")]
    assert same_link(f"{c}↔{a}") in named, found["why"]
    slowest = max(found["links"], key=lambda link: link["one_way_s"])
    assert same_link(slowest["link"]) == same_link(f"{c}↔{a}"), found["links"]
    assert "netbench has no figure for it" in found["why"]
    assert f"slow link {found['link']}" in done.stdout
