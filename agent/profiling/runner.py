"""Runs a benchmark matrix on this machine, one cell at a time, yielding each record at once.

The model is built once per (model, bits); a cell that fails is recorded with its error and the
run goes on; a guard (see agent.cooling.guard) gates every iteration and annotates every cell.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import psutil
from mlx.utils import tree_flatten

from agent.awake.boot import boot_time
from agent.awake.panics import since_boot
from agent.cooling.guard import CellGuard, NullGuard, RunStopped
from agent.model import (
    BUILTIN_CONFIGS,
    DEFAULT_SEED,
    QUANT_GROUP_SIZE,
    Model,
    ModelArgs,
    build_model,
)
from agent.power.meter import EnergyMeter
from agent.profiling import straggler_probe
from agent.profiling.footprint import HALF, cell_footprint, model_shape, rank_share, refusal
from agent.profiling.greedy import greedy_tokens
from agent.profiling.group_serving import GroupServingFailed, measure_group_serving
from agent.profiling.hf_models import ModelNotFound, locate
from agent.profiling.http_serving import ServedModel, measure_over_http
from agent.profiling.memory import MemoryProfiler
from agent.profiling.model_dir import (
    ModelLoadError,
    check_bits_for_dir,
    check_model_dir,
    require_mlx_lm,
    stored_bits,
)
from agent.profiling.rank_group import RankGroup
from agent.profiling.serving import measure_serving
from agent.profiling.settings import (
    config_digest,
    mark_injected,
    run_settings,
    weights_digest,
    with_faults,
)
from agent.profiling.sharding import build_sharded, load_sharded_dir
from agent.profiling.speed import SpeedProfiler
from agent.profiling.watch import CellWatch
from shared.benchmark import faults as injection
from shared.benchmark.matrix import (
    DECODE,
    PREFILL,
    SERVE,
    Cell,
    MatrixSpec,
    bits_label,
    expand,
    group_by_model,
)
from shared.benchmark.results import cell_record
from shared.benchmark.serving import per_output_token
from shared.benchmark.sustain import SustainPlan
from shared.clock import now_iso
from shared.reports.benchmark import record_model_label


class GroupBroken(RuntimeError):
    """A cell failed on this rank of a group: its peers cannot meet it in the next collective,
    so the run ends here (each peer's cell fails as its link to this rank goes)."""


@dataclass
class LoadedModel:
    model: nn.Module | ServedModel
    """The model, or what a server is given of it for serving cells over HTTP."""
    info: dict[str, Any]
    digest: str | None = None
    """settings' weights_digest (agent.profiling.settings); None for an in-memory model."""


def load_model_dir(path: Path, bits: int | None) -> nn.Module:
    """An mlx-lm model from a local directory, offline; quantized when `bits` asks for it."""
    check_model_dir(path)
    require_mlx_lm()
    from mlx_lm.utils import load_model

    check_bits_for_dir(path, [bits])
    model, _ = load_model(path)
    if bits is None or bits == stored_bits(path):
        return model
    model.set_dtype(mx.float16)
    if bits != 16:
        nn.quantize(model, group_size=QUANT_GROUP_SIZE, bits=bits)
    mx.eval(model.parameters())
    return model


def load_benchmark_model(
    name: str,
    bits: int | None,
    prebuilt: dict[str, nn.Module] | None = None,
    label: str | None = None,
    rank_group: RankGroup | None = None,
) -> LoadedModel:
    """A model by name: one of `prebuilt`, a built-in config, an mlx-lm directory, or a Hugging
    Face id (agent.profiling.hf_models: fetched into the cache first when the network allows).
    `label` is its cells' (Cell.label: unique within their matrix), model_label()'s without.
    A rank of a group gets its share of the model, split as the group's sharding says
    (agent.profiling.sharding); its info then counts only what this rank holds."""
    revision, digest = None, None
    if prebuilt and name in prebuilt:
        if rank_group is not None:
            raise ModelLoadError(f"{name} is built in memory: a group cannot split it")
        model = prebuilt[name]
        kind = "in-memory"
    elif name in BUILTIN_CONFIGS:
        args = BUILTIN_CONFIGS[name]()
        model = build_builtin(args, 16 if bits is None else bits, rank_group)
        kind, digest = "builtin", config_digest(args, DEFAULT_SEED)
    else:
        try:
            location = locate(name)
        except ModelNotFound as exc:
            raise ModelLoadError(str(exc)) from None
        if rank_group is None:
            model = load_model_dir(location.path, bits)
        else:
            model = load_dir_share(location.path, bits, rank_group)
        kind, revision = "mlx-lm", location.revision
        digest = weights_digest(location.path)
    info = MemoryProfiler().profile_model(model)
    shape = model_shape(model)
    if shape is not None:  # what one decode step reads of the cache per position (roofline)
        info["kv_bytes_per_position"] = shape.layers * 2 * shape.kv_heads * shape.head_dim * HALF
    label = record_model_label(
        {"model": name, "bits": bits, "model_revision": revision}, label=label
    )
    if kind == "mlx-lm" and bits is None:
        label += f" ({bits_label(stored_bits(location.path) or 16)})"
    info.update(
        model=name,
        bits=bits,
        label=label,
        kind=kind,
        model_type=getattr(model, "model_type", type(model).__name__),
        revision=revision,
    )
    return LoadedModel(model, info, digest)


def served_model(name: str, bits: int | None, label: str, serve: str | None) -> LoadedModel:
    """A model that serving cells reach over HTTP: not loaded here. For a server we start
    (--serve) a directory or a Hugging Face id is found as ours are (fetched into the cache when
    the network allows) and the server given its directory; for --serve-url it is a name."""
    target, revision = name, None
    if serve is not None and name not in BUILTIN_CONFIGS:
        try:
            location = locate(name)
        except ModelNotFound as exc:
            raise ModelLoadError(str(exc)) from None
        target, revision = str(location.path), location.revision
    label = record_model_label(
        {"model": name, "bits": bits, "model_revision": revision}, label=label
    )
    info = {
        "model": name,
        "bits": bits,
        "label": label,
        "kind": "served",
        "model_type": None,
        "revision": revision,
        "param_count": None,
        "weight_memory_bytes": None,
        "weight_memory_gb": None,
    }
    return LoadedModel(ServedModel(target), info)


def build_builtin(args: ModelArgs, bits: int, rank_group: RankGroup | None) -> nn.Module:
    """A built-in config, whole, or this rank's share of it (its split checked first: a config
    that cannot split fails its cells on every rank alike)."""
    if rank_group is None:
        return build_model(args, bits=bits)
    sharding = rank_group.spec.sharding
    try:
        return build_sharded(args, bits, rank_group.group, sharding)
    except ValueError as exc:
        raise ModelLoadError(f"cannot split it {sharding}-parallel: {exc}") from None


def load_dir_share(path: Path, bits: int | None, rank_group: RankGroup) -> nn.Module:
    """This rank's share of an mlx-lm model directory, through mlx_lm's own sharded_load."""
    check_model_dir(path)
    require_mlx_lm()
    check_bits_for_dir(path, [bits])
    return load_sharded_dir(path, bits, rank_group.group, rank_group.spec.sharding)


PhaseSink = Callable[[dict[str, Any]], None]
"""Told what the run does between cells, as bench.progress's `phase` carries it (docs/protocol.md
§5): {"kind": "build", "model", "label", "bits", "param_count"} as a model starts building,
{"kind": "baseline", "seconds"} as the idle-power baseline starts."""


def builtin_param_count(name: str) -> int | None:
    """A built-in config's parameter count, before it is built: its arrays are lazy, so making
    the module costs nothing; None for a model that is not built in."""
    if name not in BUILTIN_CONFIGS:
        return None
    return sum(leaf.size for _, leaf in tree_flatten(Model(BUILTIN_CONFIGS[name]()).parameters()))


def build_phase(model: str, bits: int | None, label: str) -> dict[str, Any]:
    """The `phase` of a model about to be built."""
    return {
        "kind": "build",
        "model": model,
        "label": label,
        "bits": bits,
        "param_count": builtin_param_count(model),
    }


BUILDS: list[threading.Thread] = []
"""The builds interruptible() started and has not seen end: those an interrupt abandoned."""


def exit_beside_an_abandoned_build(code: int) -> None:
    """End the process at once with `code` (its output flushed) while a build an interrupt
    abandoned still runs: a normal exit tears MLX down under that thread, and the C++ runtime
    aborts ("terminate called without an active exception": SIGABRT, not `code`). Else return."""
    if any(thread.is_alive() for thread in BUILDS):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def interruptible(work: Callable[[], Any]) -> Any:
    """`work()` (a model build: one array of it can take half a minute on a CPU) on a thread of
    its own while this one waits in steps of 0.1 s, so Ctrl-C or a job's SIGTERM lands at once
    (MLX lets go of the GIL while it computes); an abandoned build ends with the process."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the waiting thread as it was
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="model-build", daemon=True)
    BUILDS.append(thread)  # before start(): an interrupt may land while start() waits for it
    thread.start()
    while thread.is_alive():
        thread.join(0.1)
    BUILDS.remove(thread)  # not reached when interrupted: the build is left running
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def measure_cell(
    model: nn.Module | ServedModel,
    cell: Cell,
    spec: MatrixSpec,
    guard: CellGuard,
    watch: CellWatch | None = None,
    sleep_s: float = 0.0,
    rank_group: RankGroup | None = None,
    slow: float = 1.0,
    step_delay_s: float = 0.0,
    late: float = 0.0,
) -> dict[str, Any]:
    """One cell, as its mode says: pp, tg, or pp+tg, each after its depth, or a serving cell
    (agent.profiling.serving); `watch` hears each timed region (energy) and may plan the
    steps (a sustained run, whose duration and not the spec's precision ends it); `sleep_s` is
    an injected sleep inside the first timed window (MLX_FLEET_INJECT=sleep), `slow` the share
    of its speed it is held to (=slow), `step_delay_s` a sleep at each iteration's start
    (=step-delay), `late` the share of a serving cell's requests held past its TTFT SLO
    (=late); a rank of `rank_group` takes its group's choices and probes for stragglers after
    its timed iterations."""
    agree = rank_group.leader_says if rank_group is not None else None
    injected = {"injected_sleep_s": sleep_s, "slow": slow, "step_delay_s": step_delay_s}
    straggler = None if rank_group is None else partial(straggler_probe.probe, rank_group)
    if watch is None:
        profiler = SpeedProfiler(
            before_iteration=guard.before_iteration,
            precision=spec.precision,
            agree=agree,
            probe=straggler,
            **injected,
        )
    else:
        profiler = SpeedProfiler(
            guard.before_iteration,
            timing=watch,
            steps=watch.steps,
            precision=None if watch.sustain is not None else spec.precision,
            agree=agree,
            probe=None if watch.sustain is not None else straggler,
            **injected,
        )
    common = {
        "num_warmup": spec.warmup,
        "num_iterations": spec.iterations,
        "batch_size": cell.batch_size,
        "prefill_step_size": spec.prefill_step_size,
    }
    if cell.mode == SERVE:
        if rank_group is not None:
            if not isinstance(model, ServedModel) or spec.serving.serve is None:
                raise ValueError("a group's serving cell runs through --serve mlx_lm only")
            return measure_group_serving(profiler, model, cell, spec, late, rank_group)
        if isinstance(model, ServedModel):
            return measure_over_http(profiler, model, cell, spec, late)
        return measure_serving(profiler, model, cell, spec, late_share=late)
    if cell.mode == PREFILL:
        return profiler.benchmark_tokens_per_sec(
            model, seq_len=cell.n_prompt, depth=cell.n_depth, **common
        )
    if cell.mode == DECODE:
        return profiler.benchmark_autoregressive(
            model, total_tokens=cell.n_gen, context_len=cell.n_depth, **common
        )
    return profiler.benchmark_prompt_gen(
        model, cell.n_prompt, cell.n_gen, depth=cell.n_depth, **common
    )


@contextmanager
def recommended_wired_limit() -> Iterator[int | None]:
    """Metal's recommended working set wired for the run, the old limit restored after: what
    mlx-lm does around every generation (mlx_lm/generate.py `wired_limit`, utils.py
    `maybe_set_recommended_wired_limit`), so large-model figures compare with mlx-lm's.
    Yields the limit set (bytes), None where there is no Metal or it could not be set."""
    size = (
        mx.device_info().get("max_recommended_working_set_size")
        if mx.metal.is_available()
        else None
    )
    try:
        previous = mx.set_wired_limit(size) if size else None
    except (RuntimeError, ValueError):  # above the system's wired limit (iogpu.wired_limit_mb)
        previous = None
    if previous is None:
        yield None
        return
    try:
        yield size
    finally:
        mx.synchronize()
        mx.set_wired_limit(previous)


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def run_matrix(
    spec: MatrixSpec,
    guard: CellGuard | None = None,
    on_model: Callable[[dict[str, Any]], None] | None = None,
    models: dict[str, nn.Module] | None = None,
    *,
    first: int = 0,
    on_begin: Callable[[int], None] | None = None,
    memory_bytes: int | None = None,
    energy: EnergyMeter | None = None,
    sustain: SustainPlan | None = None,
    on_phase: PhaseSink | None = None,
    rank_group: RankGroup | None = None,
    check_tokens: int = 0,
) -> Iterator[dict[str, Any]]:
    """Yield one record per cell as it finishes, failed cells included.

    `models` supplies already-built models by name (their bits are whatever they hold). Cells
    before index `first` (in expand(spec) order) are skipped, their models not built;
    `on_begin(index)` is called as each cell starts. A cell whose estimated memory
    (agent.profiling.footprint) exceeds `memory_bytes` (by default this machine's) is not run:
    its record says why, and the run goes on.

    A guard's RunStopped ends the run after recording the cell it interrupted; a
    KeyboardInterrupt propagates, and the records already yielded stay the caller's (a
    sustained cell's is yielded first, failed `interrupted` with the windows it finished). On Metal
    the run is wired as mlx-lm wires generation; every record says so (`wired_limit_bytes`).

    With an `energy` meter its idle baseline is measured first, then every cell's timed iterations
    (shared.benchmark.energy); with a `sustain` plan each cell runs for its duration, in windows
    (shared.benchmark.sustain), and a stop keeps the windows it measured. `on_phase` hears the
    baseline and each model build as they start (PhaseSink).

    As a rank of `rank_group` the run holds its share of each model and keeps in lockstep with
    its peers (agent.profiling.rank_group); a cell that fails on it ends the run (GroupBroken),
    as its peers can no longer meet it. With `check_tokens` each model first decodes that many
    greedy tokens (agent.profiling.greedy), in its info and its every record.
    """
    guard = guard or NullGuard()
    memory = machine_memory() if memory_bytes is None else memory_bytes
    if energy is not None:
        if on_phase is not None and energy.present and energy.baseline_s > 0:
            on_phase({"kind": "baseline", "seconds": energy.baseline_s})
        energy.measure_idle()
    with recommended_wired_limit() as wired:
        watching = Watching(
            energy, sustain, run_settings(guard, wired), _faults(), rank_group, check_tokens
        )
        groups = _run_groups(
            spec, guard, on_model, models, first, on_begin, memory, watching, on_phase
        )
        for record in groups:
            record["wired_limit_bytes"] = wired
            yield record


def _run_groups(
    spec: MatrixSpec,
    guard: CellGuard,
    on_model: Callable[[dict[str, Any]], None] | None,
    models: dict[str, nn.Module] | None,
    first: int,
    on_begin: Callable[[int], None] | None,
    memory: int,
    watching: Watching,
    on_phase: PhaseSink | None = None,
) -> Iterator[dict[str, Any]]:
    scores_materialized = mx.default_device().type == mx.DeviceType.cpu  # no fused attention
    index = 0
    measured = False
    for group in group_by_model(expand(spec)):
        indices = range(index, index + len(group.cells))
        index += len(group.cells)
        if indices[-1] < first:
            continue
        cells = [(i, cell) for i, cell in zip(indices, group.cells, strict=True) if i >= first]
        if on_phase is not None and not (models and group.model in models):
            on_phase(build_phase(group.model, group.bits, group.label))
        loaded, failed = None, None
        served = spec.serving is not None and spec.serving.over_http
        try:
            loaded = interruptible(
                lambda group=group, served=served: (
                    served_model(group.model, group.bits, group.label, spec.serving.serve)
                    if served
                    else load_benchmark_model(
                        group.model, group.bits, models, group.label, watching.rank_group
                    )
                )
            )
        except Exception as exc:  # any load failure fails its cells, not the run
            failed = f"model load failed: {error_text(exc)}"
        if failed is None:
            failed = watching.ranks_unlike(loaded)
        if loaded is None or failed is not None:
            for i, cell in cells:
                yield watching.settle(cell_record(cell, error=failed), i, None)
            if loaded is None and watching.rank_group is not None:
                raise GroupBroken(f"{failed}: this rank cannot go on with its group")
            continue
        if watching.check_tokens and not served:  # a served model is not held here
            loaded.info["greedy_tokens"] = greedy_tokens(loaded.model, watching.check_tokens)
        if on_model is not None:
            on_model(loaded.info)
        shape = model_shape(loaded.model)  # its config's: the whole model
        if shape is not None and watching.rank_group is not None:
            shape = rank_share(shape, watching.rank_group.size, watching.rank_group.spec.sharding)
        for i, cell in cells:
            if on_begin is not None:
                on_begin(i)
            why = None
            if shape is not None:
                footprint = cell_footprint(
                    shape,
                    loaded.info["weight_memory_bytes"],
                    cell,
                    spec.prefill_step_size,
                    scores_materialized,
                )
                why = refusal(footprint, memory)
            why = watching.group_refusal(why)
            if why is not None:
                yield watching.settle(cell_record(cell, error=why), i, loaded)
                continue
            if measured and spec.delay_s:
                time.sleep(spec.delay_s)  # llama-bench's --delay: the machine cools between tests
            measured = True
            injected = injection.for_cell(watching.faults, i + 1)
            hot_c = float(injected["hot-start"] or 0) if "hot-start" in injected else None
            guard.begin_cell(spec.cool_start_s, hot_c)  # may wait for the machine to cool
            began = now_iso()
            watch = CellWatch(cell, spec.warmup, guard, watching.energy, watching.sustain)
            metrics, error, stopped, together = None, None, None, False
            sleep_s = float(injected.get("sleep") or 0.0)
            slow = float(injected.get("slow") or 1.0)
            delay_s = float(injected.get("step-delay") or 0.0)
            late = float(injected.get("late") or 0.0) if cell.mode == SERVE else 0.0
            try:
                metrics = measure_cell(
                    loaded.model, cell, spec, guard, watch, sleep_s, watching.rank_group, slow,
                    delay_s, late,
                )  # fmt: skip
            except RunStopped as exc:
                error, stopped = error_text(exc), exc
            except KeyboardInterrupt as exc:
                if watching.sustain is None:
                    raise  # an ordinary cell's iterations are worth nothing cut short
                error, stopped = INTERRUPTED_SUSTAIN, exc  # its finished windows are kept
            except Exception as exc:  # out of memory and the like fail one cell
                error = error_text(exc)
                together = isinstance(exc, GroupServingFailed)  # every rank, in step
            report = guard.end_cell()
            watched = watch.fields(error if stopped is not None else None)
            record = cell_record(cell, metrics, error, vars(report), watched)
            if sleep_s and record.get("sleep_clock"):
                mark_injected(record, ["sleep"])
            if slow < 1.0:
                mark_injected(record, ["slow"])
            if delay_s:
                mark_injected(record, ["step-delay"])
            if late:
                mark_injected(record, ["late"])
            if cell.mode == SERVE:
                per_output_token(record)
            if hot_c is not None and spec.cool_start_s:
                mark_injected(record, ["hot-start"])
            record["test_time"] = began
            if loaded.info.get("revision"):
                record["model_revision"] = loaded.info["revision"]
            yield watching.settle(record, i, loaded)
            if stopped is not None:
                raise stopped
            if error is not None and watching.rank_group is not None and not together:
                raise GroupBroken(f"cell {cell.name} failed on this rank: {error}")
        del loaded
        gc.collect()
        mx.clear_cache()


INTERRUPTED_SUSTAIN = "interrupted: the windows finished before it are kept"
"""A sustained cell cut by Ctrl-C or SIGTERM: issue 42's loss (every finished window dropped)."""
REBOOT_INJECTED_S = 3600.0
"""How far an injected reboot (MLX_FLEET_INJECT=reboot) moves a cell's boot time on."""


@dataclass(frozen=True)
class Watching:
    """What a run measures around every cell's iterations besides their seconds."""

    energy: EnergyMeter | None = None
    sustain: SustainPlan | None = None
    settings: dict[str, Any] | None = None
    """The run's settings (agent.profiling.settings), given to every record."""
    faults: tuple[injection.Fault, ...] = ()
    rank_group: RankGroup | None = None
    check_tokens: int = 0

    def ranks_unlike(self, loaded: LoadedModel | None) -> str | None:
        """For a rank of a group that loaded its model: why the ranks cannot run it together,
        their weights differing (a model directory not the same on every member, another
        MLX's random weights), or None. A rank whose load failed never comes here: its peers
        may be inside the load's own collective (mlx_lm's sharded_load ends in a barrier), where
        no agreement can meet them, so it ends its job (GroupBroken) and the coordinator
        cancels theirs."""
        group = self.rank_group
        if group is None or loaded is None:
            return None
        digests = group.digests_differ(loaded.digest)
        if digests is None:
            return None
        names = group.spec.names
        held = ", ".join(f"{name} {digest}" for name, digest in zip(names, digests, strict=True))
        return f"the ranks hold different weights (digests: {held})"

    def group_refusal(self, why: str | None) -> str | None:
        """A cell this rank cannot hold (`why`) is refused by every rank of its group."""
        if self.rank_group is None:
            return why
        refusing = self.rank_group.which_say(why is not None)
        if why is None and refusing:
            names = self.rank_group.spec.names
            return f"rank {refusing[0]} ({names[refusing[0]]}) cannot hold this cell"
        return why

    def settle(self, record: dict[str, Any], index: int, loaded: LoadedModel | None) -> Any:
        """The record with its `settings` (its model's, its cell's injected faults applied)
        and, when any was injected, its `injected` list; and the machine's `boot_time`
        (agent.awake.boot; an injected reboot moves it on by REBOOT_INJECTED_S) with, on a Mac,
        the `panics` reports written since that boot (agent.awake.panics)."""
        boot = boot_time()
        panics = since_boot(boot)  # the real boot's: an injected reboot leaves no report
        if panics is not None:
            record["panics"] = panics
        if boot is not None and "reboot" in injection.for_cell(self.faults, index + 1):
            boot += REBOOT_INJECTED_S
            mark_injected(record, ["reboot"])
        record["boot_time"] = boot
        if self.rank_group is not None:
            spec = self.rank_group.spec
            record["rank"] = {
                "rank": spec.rank,
                "host": spec.host,
                "members": spec.names,
                "backend": spec.backend,
                "sharding": spec.sharding,
            }
        if loaded is not None and "greedy_tokens" in loaded.info:
            record["greedy_tokens"] = loaded.info["greedy_tokens"]
        if self.settings is None:
            return record
        settings, injected = with_faults(self.settings, self.faults, index + 1)
        if loaded is not None:
            settings.update(
                model_revision=loaded.info.get("revision"), weights_digest=loaded.digest
            )
        record["settings"] = settings
        mark_injected(record, injected)
        return record


def _faults() -> tuple[injection.Fault, ...]:
    """MLX_FLEET_INJECT's faults; a bad value injects nothing here (its reader says why)."""
    try:
        return injection.from_environ()
    except ValueError:
        return ()


def machine_memory() -> int:
    """This machine's memory in bytes: what a cell may need at most."""
    return int(psutil.virtual_memory().total)
