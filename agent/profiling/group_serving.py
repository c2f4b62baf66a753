"""A group's serving cell (`--serve mlx_lm` on `--hosts A+B`): every rank's job starts its rank
of one distributed mlx_lm.server (mlx_lm/server.py, 0.32: `mx.distributed.init()`, the model
loaded by `sharded_load`, rank 0 answering HTTP, the others following each request through
`all_sum` broadcasts), and rank 0's job sends the cell's load to its own server's port.

The servers form a ring of their own, beside the job's: each rank binds a free port on each of
its ring addresses, the ranks share them over the job's ring, and every server rank starts
with MLX_RANK and an MLX_HOSTFILE of those ports (as mlx.launch would write them), under
agent.profiling.mlx_lm_server's lifeline. Every rank runs the cell's passes as the profiler's
iterations in lockstep: after each pass, rank 0's requests done, the ranks agree whether any
rank's server failed (one small all_sum); if one did, every rank fails the cell at the same
point, naming the rank whose server failed first, and the group goes on with its next cell.

No job process here holds the model: each rank's peak memory is its server's, which reports its
MLX peak as it stops (agent.profiling.mlx_lm_server); each rank's energy is its own Mac's over
the same passes. A following rank's
record carries rank 0's request counts, shared after each pass: its own meter's joules and
those counts make its part of the group's energy per token.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

from agent.cluster.launch_files import write_launch_files
from agent.profiling.http_serving import HttpServingCell, NoCache, RequestsFailed, ServedModel
from agent.profiling.mlx_lm_server import MlxLmServer, ServerDied
from agent.profiling.rank_group import RankGroup
from agent.profiling.serving import ServingCell, measure_serving
from agent.profiling.speed import Depth
from agent.profiling.units import to_gb
from shared.benchmark.matrix import Cell, MatrixSpec
from shared.benchmark.serving_figures import Slo, serving_figures
from shared.distributed.group import PIPELINE
from shared.distributed.rank_env import RankEnvError, RankLaunch, ring_hostfile_at
from shared.reports.group_cells import SERVER_PEER_FAILED
from shared.stats import rate_fields

JACCL_VARIABLES = ("MLX_IBV_DEVICES", "MLX_JACCL_COORDINATOR")
"""The job's own JACCL environment, left out of its server's: the servers' ring is a ring."""
COUNTS = ("requests", "completed", "failed", "good", "output_tokens")
"""What rank 0 shares of each timed pass (shared.benchmark.serving_figures)."""
READY_POLL_S = 0.25
"""How often a group's ranks look at their starting servers together."""
ENGINE = "mlx_lm.server's distributed mode, one rank on each member, started for this cell"


class GroupServingFailed(RuntimeError):
    """A rank's server failed: every rank of the group raises it at the same agreement, so the
    ranks stay in step and the group's next cell runs."""


def free_port_on(ip: str) -> int:
    """A port free now on `ip` (the kernel's pick for a bind to port 0)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family) as probe:
        probe.bind((ip, 0))
        return probe.getsockname()[1]


def shared_ports(rank_group: RankGroup) -> list[list[int]]:
    """Every rank's free ports (one per ring address), rank by rank, on every rank."""
    members = rank_group.spec.members
    widest = max(len(member.ips) for member in members)
    table = mx.zeros((rank_group.size, max(widest, 1)), dtype=mx.int32)
    mine = [free_port_on(ip) for ip in members[rank_group.rank].ips]
    if mine:
        table[rank_group.rank, : len(mine)] = mx.array(mine, dtype=mx.int32)
    summed = mx.distributed.all_sum(table, group=rank_group.group)
    mx.eval(summed)
    return [row[: len(member.ips)] for row, member in zip(summed.tolist(), members, strict=True)]


def server_env(rank_group: RankGroup, folder: Path) -> dict[str, str]:
    """This rank's server's whole environment: the job's, its ring's MLX_RANK and MLX_HOSTFILE
    those of the servers' own ring (GroupServingFailed, on every rank alike, for a member with
    no IP address: a ring needs one)."""
    ports = shared_ports(rank_group)
    try:
        hostfile = json.dumps(ring_hostfile_at(rank_group.spec.members, ports))
    except RankEnvError as exc:  # the same spec on every rank: each raises here alike
        raise GroupServingFailed(str(exc)) from None
    rank = rank_group.rank
    launch = RankLaunch(rank, {"MLX_RANK": str(rank)}, {"MLX_HOSTFILE": hostfile})
    env = {key: value for key, value in os.environ.items() if key not in JACCL_VARIABLES}
    env.update(write_launch_files(launch, folder))
    return env


def agree(rank_group: RankGroup, server: MlxLmServer, why: str | None) -> None:
    """Every rank says whether its server failed (`why`); if any did, every rank raises. A rank
    whose server's process is gone is a cause; another rank's failure (its requests failing, its
    server unhealthy: mlx_lm.server's generation ends when a peer's goes) is then said to follow
    from the first such rank's, as is a rank with nothing wrong, so the group's error names the
    cause first (shared.reports.group_cells.cause_first)."""
    failing = rank_group.which_say(why is not None)
    if not failing:
        return
    death = server.death()
    gone = death is not None
    why = why or death  # gone since it said
    dead = rank_group.which_say(gone)  # every rank asks, failing being the same on every rank
    if why is None or (dead and not gone):
        first = (dead or failing)[0]
        said = f"{SERVER_PEER_FAILED} rank {first} ({rank_group.spec.names[first]})"
        why = said if why is None else f"{said}; here: {why}"
    raise GroupServingFailed(why)


def wait_ready(rank_group: RankGroup, server: MlxLmServer) -> None:
    """Every rank, in rounds, until rank 0's server answers: each round the ranks agree whether
    any server failed (a rank's that exits leaves the others' ring unformed, blocked in MLX's
    init, so only its own rank can say so) and whether rank 0's answers; rank 0's clock bounds
    the wait (READY_TIMEOUT_S)."""
    deadline = time.monotonic() + server.ready_timeout_s
    while True:
        why, ready = server.death(), False
        if why is None and server.answers:
            try:
                ready = server.ready()
            except ServerDied as exc:
                why = str(exc)
            if not ready and why is None and time.monotonic() > deadline:
                why = server.not_ready()
        agree(rank_group, server, why)
        if rank_group.leader_says(ready):
            return
        time.sleep(READY_POLL_S)


class RankServingCell(ServingCell):
    """One rank's part of a group's serving cell: rank 0's the requests over HTTP
    (agent.profiling.http_serving); every rank's the agreement after each pass, and rank 0's
    counts of each timed pass shared, so a following rank's record says what the group served
    over its own pass windows."""

    def __init__(
        self,
        rank_group: RankGroup,
        server: MlxLmServer,
        sender: HttpServingCell | None,
        cell: Cell,
        spec: MatrixSpec,
    ) -> None:
        assert spec.serving is not None
        self.rank_group, self.server, self.sender = rank_group, server, sender
        self.cell, self.serving = cell, spec.serving
        self.counted: list[list[int]] = []
        """Rank 0's COUNTS of each timed pass."""

    def depth(self) -> Depth:
        return NoCache()

    def run_pass(self, timed: bool) -> None:
        why = None
        if self.sender is not None:
            try:
                self.sender.run_pass(timed)
            except (ServerDied, RequestsFailed) as exc:
                why = str(exc)
        agree(self.rank_group, self.server, why or self.server.failure())
        if timed:
            self.counted.append(self.rank_group.leader_counts(self._counts()))

    def _counts(self) -> list[int]:
        """This pass's COUNTS as rank 0 made them (zeros on a following rank)."""
        if self.sender is None or not self.sender.passes:
            return [0] * len(COUNTS)
        slo = Slo(self.serving.slo_ttft_ms, self.serving.slo_tpot_ms)
        made = serving_figures(self.sender.passes[-1], slo)
        return [getattr(made, name) for name in COUNTS]

    def close(self) -> None:
        """The passes done: this rank's server stopped, so it reports its peak memory."""
        if self.sender is not None:
            self.sender.close()
        self.server.__exit__(None, None, None)

    def result(self, profiled: dict[str, Any]) -> dict[str, Any]:
        if self.sender is not None:
            result = self.sender.result(profiled)
            result["serving"]["engine"] = f"over HTTP: {ENGINE}"
            return result
        peak = self.server.peak_memory_bytes
        seconds = [ms / 1000 for ms in profiled["samples_ms"]]
        tokens = [counts[COUNTS.index("output_tokens")] for counts in self.counted]
        rates = [made / s for made, s in zip(tokens, seconds, strict=True) if s > 0]
        profiled.update(
            rate_fields(rates),
            peak_memory_gb=None if peak is None else to_gb(peak),
            active_memory_gb=None,
        )
        figures = {name: sum(c[i] for c in self.counted) for i, name in enumerate(COUNTS)}
        figures.update(slo_ttft_ms=self.serving.slo_ttft_ms, slo_tpot_ms=self.serving.slo_tpot_ms)
        profiled["serving"] = {
            "engine": ENGINE,
            "model_impl": "this rank's share, in its server's process: it follows rank 0's "
            "requests through the servers' ring; rank 0's counts, its tok/s over this rank's "
            "own pass windows",
            "loop": "open" if self.cell.request_rate else "closed",
            "passes": len(self.counted),
            "requests_per_pass": self.serving.requests,
            "figures": figures,
        }
        return profiled


def measure_group_serving(
    profiler: Any,
    served: ServedModel,
    cell: Cell,
    spec: MatrixSpec,
    late_share: float,
    rank_group: RankGroup,
) -> dict[str, Any]:
    """This rank's record metrics of a group's serving cell (agent.profiling.serving's passes,
    run in step on every rank); GroupServingFailed when a rank's server did not start or failed."""
    profiler.probe = None  # a straggler probe's steps would be more serving passes
    options = ("--pipeline",) if rank_group.spec.sharding == PIPELINE else ()
    with tempfile.TemporaryDirectory(prefix="mlx-fleet-serve-") as folder:
        env = server_env(rank_group, Path(folder) / "ring")
        lead = rank_group.rank == 0
        server = MlxLmServer(served.name, env=env, options=options, answers=lead)
        try:
            server.start()
            wait_ready(rank_group, server)
            sender = HttpServingCell(served, cell, spec, late_share, server) if lead else None
            rank_cell = RankServingCell(rank_group, server, sender, cell, spec)
            return measure_serving(profiler, None, cell, spec, serving=rank_cell)
        finally:
            server.__exit__(None, None, None)
