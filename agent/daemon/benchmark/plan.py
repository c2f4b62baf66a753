"""What a bench.start (or a bench.check) would run, checked before anything starts: the matrix
as this agent can run it, its sustained windows, the group it is one rank of and how that group
splits each model. Its own module because checking a request is one thing and running the job
another (agent.daemon.benchmark.jobs): a check answers a coordinator without touching the job
that runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.cluster.ports import listen_problem
from agent.daemon.benchmark.deadline import too_long
from agent.model import BUILTIN_CONFIGS, DEFAULT_SEED
from agent.power.meter import EnergyMeter
from agent.profiling.hf_models import ModelNotFound, locate, names_a_repo, offline
from agent.profiling.model_dir import ModelLoadError, check_model_dir, require_mlx_lm
from agent.profiling.settings import config_digest, listing_digest
from agent.profiling.sharding import model_sharding_problem
from shared.benchmark.matrix import Cell, MatrixError, MatrixSpec, expand
from shared.benchmark.sustain import WIRE_NAMES, SustainError, SustainPlan
from shared.distributed.group import MAX_CHECK_TOKENS, BenchGroup
from shared.distributed.rank_env import RankEnvError, listens_on
from shared.shapes import Invalid
from shared.wire import protocol as p

PROGRESS_FIELDS = frozenset({"pause", "phase"})
"""bench.progress's optional fields a bench.start may ask for by name (its `progress`)."""


@dataclass(frozen=True)
class JobPlan:
    """A job about to start: its id, its spec and its cells in run order."""

    id: str
    spec: MatrixSpec
    cells: list[Cell]
    sustain: SustainPlan | None = None
    takes: frozenset[str] = frozenset()
    """bench.start's `progress`: the optional bench.progress fields it takes."""
    group: BenchGroup | None = None
    """The distributed group it is one rank of (bench.start's `group`), or None."""
    check_tokens: int = 0
    """Greedy tokens each model decodes as the correctness check (bench.start's `check_tokens`)."""


class JobPlanner:
    """plan() a request; `meter` is the daemon's power meter and `poll_interval` its thermal
    poll, which a sustained run's windows must each hold a new reading of."""

    def __init__(self, meter: Callable[[], EnergyMeter | None], poll_interval: float) -> None:
        self.meter = meter
        self.poll_interval = poll_interval

    def plan(self, request: p.Message) -> JobPlan:
        """What `request` (a bench.start or bench.check) would run, starting nothing.
        ProtocolError `bad-matrix` for a matrix this agent cannot run (or cannot split as its
        `group` asks), `bad-body` for a field out of range."""
        try:
            spec = check_matrix(request.body["matrix"])
        except (MatrixError, ModelLoadError) as exc:
            raise p.ProtocolError(p.BAD_MATRIX, f"matrix rejected: {exc}", re=request.id) from None
        try:
            sustain = self._sustain(request.body.get("sustain"))
        except SustainError as exc:
            raise p.ProtocolError(p.BAD_MATRIX, f"sustain rejected: {exc}", re=request.id) from None
        cells = expand(spec)
        if (why := too_long(len(cells), sustain)) is not None:
            raise p.ProtocolError(p.BAD_MATRIX, f"sustain rejected: {why}", re=request.id)
        group = self._group(request)
        if group is not None:
            self._check_split(spec, group, request)
        check_tokens = request.body.get("check_tokens") or 0
        if not 0 <= check_tokens <= MAX_CHECK_TOKENS:
            raise p.ProtocolError(
                p.BAD_BODY,
                f"check_tokens is {check_tokens}, not 0 to {MAX_CHECK_TOKENS}",
                re=request.id,
            )
        wanted = request.body.get("progress") or []
        takes = frozenset(name for name in wanted if name in PROGRESS_FIELDS)  # others: newer
        return JobPlan(f"j-{p.new_id()[:12]}", spec, cells, sustain, takes, group, check_tokens)

    @staticmethod
    def _check_split(spec: MatrixSpec, group: BenchGroup, request: p.Message) -> None:
        """Every model of the matrix splits as the group asks, at every bits: `bad-matrix`
        naming the first that does not (agent.profiling.sharding)."""
        for index, model in enumerate(spec.models):
            for bits in spec.bits:
                try:
                    why = model_sharding_problem(model, bits, len(group.members), group.sharding)
                except ModelNotFound:
                    continue  # a Hugging Face id not fetched yet: its load checks it
                except Exception as exc:  # a config.json mlx-lm cannot read, and the like
                    why = f"cannot tell how it splits: {type(exc).__name__}: {exc}"
                if why is not None:
                    raise p.ProtocolError(
                        p.BAD_MATRIX,
                        f"matrix rejected: models[{index}] {model}: {why}",
                        re=request.id,
                    )

    @staticmethod
    def _group(request: p.Message) -> BenchGroup | None:
        """bench.start's `group`, checked: `bad-body` naming the field, `cannot-listen` when
        its rank could not listen where the group says (agent.cluster.ports); a sustained run is
        refused for a group (its ranks would end their windows apart and part in a
        collective)."""
        raw = request.body.get("group")
        if raw is None:
            return None
        try:
            group = BenchGroup.from_wire(raw)
            group.launch()  # the ring's ports past 65535, JACCL without devices: refused now
        except Invalid as exc:
            raise p.ProtocolError(p.BAD_BODY, f"bench.start: {exc}", re=request.id) from None
        except RankEnvError as exc:
            why = f"bench.start: group: {exc}"
            raise p.ProtocolError(p.BAD_BODY, why, re=request.id) from None
        listening = listens_on(group.members, group.rank, group.backend, group.port)
        if (why := listen_problem(listening)) is not None:
            raise p.ProtocolError(p.CANNOT_LISTEN, f"bench.start: group: {why}", re=request.id)
        if request.body.get("sustain") is not None:
            raise p.ProtocolError(
                p.BAD_MATRIX,
                "sustain rejected: a group's cells do not run sustained",
                re=request.id,
            )
        return group

    def _sustain(self, wanted: Any) -> SustainPlan | None:
        """bench.start's `sustain` as a plan whose windows hold a new reading of this agent's
        power meter and thermal source; SustainError naming what does not."""
        if wanted is None:
            return None
        plan = SustainPlan.from_dict(wanted)
        meter = self.meter()
        if meter is not None and meter.present:
            plan.check(
                meter.info().resolution_s, f"the power meter {meter.source.name}", WIRE_NAMES
            )
        plan.check(self.poll_interval, "the agent's thermal poll", WIRE_NAMES)
        return plan


def check_matrix(matrix: dict[str, Any]) -> MatrixSpec:
    """The matrix as this agent would run it: the models named (a bench.start never falls back
    to the default model), model directories are paths on THIS machine, Hugging Face ids are
    resolved here (the job fetches one not cached yet; offline, one not cached is refused now).
    Raises MatrixError or ModelLoadError naming the problem, and the wire field first
    (`models[1]: ...`)."""
    if "models" not in matrix:
        raise MatrixError(
            "models: missing; name the models to run (a config such as small or full, a "
            "model directory on the agent, or a Hugging Face id ORG/NAME)"
        )
    spec = MatrixSpec.from_dict(matrix)
    if spec.serving is not None and spec.serving.serve_url is not None:
        return spec  # the server's model, named as the server knows it: nothing on this disk
    directories = [(i, m) for i, m in enumerate(spec.models) if m not in BUILTIN_CONFIGS]
    if directories:
        require_mlx_lm()
    for i, directory in directories:
        try:
            check_model_on_disk(directory)
        except ModelLoadError as exc:
            raise ModelLoadError(f"models[{i}]: {exc}") from None
    return spec


def model_identity(name: str) -> str | None:
    """What names a model's weights, cheap enough for a request (bench.check): a built-in
    config's digest, a directory's listing (agent.profiling.settings.listing_digest); None for
    a Hugging Face id not fetched yet, or a directory with no weights to list."""
    if name in BUILTIN_CONFIGS:
        return config_digest(BUILTIN_CONFIGS[name](), DEFAULT_SEED)
    try:
        return listing_digest(locate(name, download=False).path)
    except (ModelNotFound, RuntimeError):  # RuntimeError: ~user for a user this Mac lacks
        return None


def check_model_on_disk(directory: str) -> None:
    """A model directory of this machine, or a Hugging Face id it can fetch (or holds, offline);
    ModelLoadError naming the problem."""
    try:
        path = Path(directory).expanduser()
    except RuntimeError as exc:  # ~user for a user this machine does not have
        raise ModelLoadError(f"model directory {directory}: {exc}") from None
    if names_a_repo(directory):
        if not offline():
            return  # the job process downloads it
        try:
            path = locate(directory, download=False).path
        except ModelNotFound as exc:
            raise ModelLoadError(str(exc)) from None
    check_model_dir(path)
