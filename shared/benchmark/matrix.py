"""The benchmark matrix: what to measure, expanded into cells. Pure data, pure functions.

The matrix is llama-bench's (llama.cpp tools/llama-bench/llama-bench.cpp): prompt lengths
(`n_prompt`, tests `pp<P>`), generation lengths (`n_gen`, tests `tg<G>`), prompt-then-generation
pairs (`n_pg`, tests `pp<P>+tg<G>`), each at every depth of `n_depth` (tokens already in the KV
cache, ` @ d<D>` in the test's name), crossed with our batch sizes, models and bit widths. A 0 in
`n_prompt` or `n_gen` asks for no test, as in llama-bench.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from shared.benchmark.serving import SERVE, ServingError, ServingSpec, load_tag, validate_serving

# Limits per spec (docs/protocol.md §5, Limits), in shared.bounds with every other bound: what
# one job may ask for. They keep a job, its bench.start.ok (every cell's name) and a job.get page
# that echoes the spec within one message, and refuse a request before it can make the agent do
# absurd work.
from shared.bounds import (
    MAX_BATCH_SIZE,
    MAX_CELL_TOKENS,
    MAX_CELLS,
    MAX_COOL_START_S,
    MAX_DECODE_TOKENS,
    MAX_DELAY_S,
    MAX_ITERATIONS,
    MAX_SEQ_LEN,
    MAX_WARMUP,
)
from shared.shapes import unknown_keys
from shared.stats import MIN_AUTO_REPETITIONS

DEFAULT_MAX_REPETITIONS = 50
"""`-r auto`'s most timed iterations per cell unless --max-repetitions says otherwise: a cell
that has not reached its precision by then is noisy, and more would rarely change that."""
DEFAULT_COOL_START_S = 120.0
"""How long `agent bench` and `coordinator benchmark` let a cell wait to cool before it runs
flagged hot-start (--cool-start-limit): a fanless Mac loses 10-15 °C in a minute or two idle."""
MAX_MODEL_LENGTH = 1024
"""Characters of a model's name, directory path or Hugging Face id (macOS's PATH_MAX)."""
SUPPORTED_BITS = (4, 8, 16)
BUILTIN_DEFAULT_BITS = {"small": 16, "full": 4}
"""Bits used when none are asked for: the seed docs quote Q4 figures for the full model; the
small model stays float16 so a smoke test is quick on MLX's CPU backend (slow quantized kernels)."""
DEFAULT_SEQ_LENGTHS = (128, 512, 1024, 2048)
"""The seed's BenchmarkSuite lengths."""
DEFAULT_N_PROMPT = (512,)
DEFAULT_N_GEN = (128,)
"""llama-bench's defaults: pp512 and tg128 at depth 0."""
DEFAULT_PREFILL_STEP = 2048
"""Prompt tokens per forward pass while filling the KV cache: mlx-lm's prefill_step_size."""
PREFILL = "prefill"
DECODE = "decode"
PREFILL_DECODE = "prefill+decode"


class MatrixError(ValueError):
    """A matrix that cannot run; the message names the offending value."""


LIST_FIELDS = ("n_prompt", "n_gen", "n_depth", "batch_sizes", "models", "bits")


@dataclass(frozen=True)
class MatrixSpec:
    """Everything a benchmark run varies. `bits=None` keeps a model's stored weights; `n_pg`
    holds (prompt, generated) pairs; `delay_s` is slept between two cells (to let a fanless Mac
    cool, as llama-bench's --delay). With a `precision` (`-r auto`) a cell's timed iterations
    stop once the 95 % half-width of its mean tok/s is within that share of the mean
    (shared.stats.precise_enough), `iterations` being then the most it runs. With a
    `cool_start_s` each cell first waits, that long at most, until the machine is below the
    policy's reduce threshold and its pressure nominal (agent.cooling.scheduler.ThermalGuard)."""

    n_prompt: tuple[int, ...] = DEFAULT_N_PROMPT
    n_gen: tuple[int, ...] = DEFAULT_N_GEN
    n_pg: tuple[tuple[int, int], ...] = ()
    n_depth: tuple[int, ...] = (0,)
    batch_sizes: tuple[int, ...] = (1,)
    models: tuple[str, ...] = ("full",)
    bits: tuple[int | None, ...] = (None,)
    warmup: int = 2
    iterations: int = 5
    prefill_step_size: int = DEFAULT_PREFILL_STEP
    delay_s: float = 0.0
    precision: float | None = None
    cool_start_s: float = 0.0
    serving: ServingSpec | None = None
    """The serving axis (shared.benchmark.serving): with it, every cell is a serving cell."""

    def to_dict(self) -> dict[str, Any]:
        """Plain data; `precision` and `cool_start_s` only when set, so a spec without them
        still reaches an agent that predates them (one that refuses a field refuses only a job
        that uses it)."""
        data = asdict(self) | {"serving": self.serving}
        for key, value in data.items():
            if isinstance(value, tuple):
                data[key] = [list(v) if isinstance(v, tuple) else v for v in value]
        if data["precision"] is None:
            del data["precision"]
        if not data["cool_start_s"]:
            del data["cool_start_s"]
        if self.serving is None:
            del data["serving"]
        else:
            data["serving"] = self.serving.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MatrixSpec:
        """Build and validate a spec from plain data (e.g. a decoded message body)."""
        if not isinstance(data, dict):
            raise MatrixError("a matrix must be a mapping")
        if unknown := unknown_keys(data, cls.__dataclass_fields__):
            raise MatrixError(f"unknown matrix field(s): {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key in LIST_FIELDS or key == "n_pg":
                if not isinstance(value, (list, tuple)):
                    raise MatrixError(f"{key}: {value!r} is not a list")
                values[key] = tuple(value)
            else:
                values[key] = value
        if "n_pg" in values:
            values["n_pg"] = tuple(_pair(i, pair) for i, pair in enumerate(values["n_pg"]))
        if values.get("serving") is not None:
            try:
                values["serving"] = ServingSpec.from_dict(values["serving"])
            except ServingError as exc:
                raise MatrixError(str(exc)) from None
        spec = cls(**values)
        validate(spec)
        return spec


def _pair(index: int, value: Any) -> tuple[int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise MatrixError(f"n_pg[{index}]: {value!r} is not a [prompt, generated] pair")
    return (value[0], value[1])


@dataclass(frozen=True)
class Cell:
    """One measurement of the matrix: `n_prompt` prompt tokens processed and `n_gen` tokens
    generated, after `n_depth` tokens already in the KV cache (untimed)."""

    model: str
    bits: int | None
    n_prompt: int
    n_gen: int
    n_depth: int
    batch_size: int
    label: str = field(default="", compare=False)
    """The model's label in the cell's name, unique within its matrix (model_names): expand()
    gives it; a cell made without one takes model_label() of its model alone."""
    concurrency: int = 0
    request_rate: float = 0.0
    """A serving cell's load: clients of a closed loop, or requests/s of an open loop."""
    workload: str = field(default="", compare=False)
    """A serving test's lengths (`pp32+tg16`) where its matrix has several, else empty."""

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", model_label(self.model, self.bits))

    @property
    def serves(self) -> bool:
        return bool(self.concurrency or self.request_rate)

    @property
    def mode(self) -> str:
        if self.serves:
            return SERVE
        if not self.n_gen:
            return PREFILL
        return DECODE if not self.n_prompt else PREFILL_DECODE

    @property
    def test(self) -> str:
        """llama-bench's test name: pp512, tg128, pp512+tg128, each ' @ d<D>' at a depth; a
        serving cell's `serve c4` or `serve r2.0`, with its lengths where they vary."""
        if self.serves:
            load = f"{SERVE} {load_tag(self.concurrency, self.request_rate)}"
            return f"{load} {self.workload}" if self.workload else load
        parts = [f"pp{self.n_prompt}"] if self.n_prompt else []
        parts += [f"tg{self.n_gen}"] if self.n_gen else []
        depth = f" @ d{self.n_depth}" if self.n_depth else ""
        return "+".join(parts) + depth

    @property
    def tokens(self) -> int:
        """Tokens processed by one timed iteration (what tok/s counts, as llama-bench's t/s)."""
        return (self.n_prompt + self.n_gen) * self.batch_size

    @property
    def held_tokens(self) -> int:
        """Tokens the KV cache holds at the end: the depth, the prompt and what is generated."""
        return (self.n_depth + self.n_prompt + self.n_gen) * self.batch_size

    @property
    def name(self) -> str:
        """A unique, readable key within a run (a serving cell's load is its batch)."""
        if self.serves:
            return f"{self.label} {self.test}"
        return f"{self.label} {self.test} b{self.batch_size}"

    def to_dict(self) -> dict[str, Any]:
        """The cell's coordinates as a record holds them (its label only within its name)."""
        data = asdict(self)
        del data["label"], data["workload"]
        if not self.serves:
            del data["concurrency"], data["request_rate"]
        return data | {"mode": self.mode, "test": self.test, "name": self.name}


def named_label(record: dict[str, Any]) -> str | None:
    """The model label a cell record's name holds (`<label> <test> b<batch>`, Cell.name: unique
    within its matrix), None for a record whose name is not so made. Reports label a record so,
    and a record stored before labels were made unique keeps the label it was named with."""
    name, test, batch = record.get("name"), record.get("test"), record.get("batch_size")
    if not isinstance(name, str) or test is None or batch is None:
        return None
    tail = f" {test}" if record.get("mode") == SERVE else f" {test} b{batch}"
    label, sep, rest = name.rpartition(tail)
    return label if sep and not rest and label else None


def bits_label(bits: int | None) -> str:
    if bits is None:
        return "stored"
    return "f16" if bits == 16 else f"q{bits}"


HF_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?$")
"""ORG/NAME[@REVISION]: a Hugging Face repository id as mlx-lm takes it, with the revision
(a branch, a tag or a commit) after an @."""
MODEL_FILE_PATTERNS = [
    "*.json",
    "model*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]
"""The files of a Hugging Face model that mlx-lm needs, nothing more: its DEFAULT_ALLOW_PATTERNS
(mlx_lm/utils.py, 0.32). The agent downloads these; the coordinator reads its own cache for them."""


@dataclass(frozen=True)
class ModelId:
    repo: str
    revision: str | None = None


def hf_model_id(model: str) -> ModelId | None:
    """The Hugging Face id `model` spells, None for a config name or a path (absolute, or
    starting with '.' or '~': as `agent bench` sends every directory). A relative `a/b` that is
    a directory on the agent is a directory there: the agent looks before it downloads, as
    mlx-lm does."""
    match = HF_ID.match(model)
    if match is None or model.startswith((".", "~")):
        return None
    return ModelId(match["repo"], match["revision"])


def model_label(model: str, bits: int | None, names: dict[str, str] | None = None) -> str:
    """'small/q4'; a directory goes by its folder name: 'Llama-3.2-3B/f16'; a Hugging Face id
    by the id and the revision asked for: 'mlx-community/Llama-3.2-1B-4bit@main/stored'.
    With `names` (model_names() of the matrix), the model's name unique within it."""
    name = names[model] if names is not None else model_names([model])[model]
    return f"{name}/{bits_label(bits)}"


def model_names(models: Iterable[str]) -> dict[str, str]:
    """Each model's name in labels, unique within `models`, as an editor names same-named tabs:
    a built-in config or a Hugging Face id is named as given; a directory by its folder name,
    and directories whose names clash (with each other or with any other name) each take one
    more parent folder, again until none clashes (`a/mlx`, `b/mlx`); one whose whole path
    still clashes is named as given (`/m/a/` and `/m/a`, told apart by the slash)."""
    distinct = list(dict.fromkeys(models))
    folders = {
        model: [part for part in model.split("/") if part]
        for model in distinct
        if "/" in model and hf_model_id(model) is None
    }
    depth = dict.fromkeys(folders, 1)

    def named(model: str) -> str:
        parts = folders.get(model)
        if parts is None or depth[model] > len(parts):
            return model
        return "/".join(parts[-depth[model] :])

    while True:
        names = {model: named(model) for model in distinct}
        holders: dict[str, list[str]] = {}
        for model, name in names.items():
            holders.setdefault(name, []).append(model)
        growing = [
            model
            for clash in holders.values()
            if len(clash) > 1
            for model in clash
            if model in folders and depth[model] <= len(folders[model])
        ]
        if not growing:
            return names
        for model in growing:
            depth[model] += 1


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """'128,512' -> (128, 512); the error names `what` and the bad item."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise MatrixError(f"{what}: expected a comma-separated list of integers, got {text!r}")
    try:
        return tuple(int(item) for item in items)
    except ValueError:
        raise MatrixError(f"{what}: {text!r} is not a list of integers") from None


def parse_pair(text: str, what: str) -> tuple[int, int]:
    """'512,128' -> (512, 128): llama-bench's -pg PROMPT,GENERATED."""
    values = parse_int_list(text, what)
    if len(values) != 2:
        raise MatrixError(f"{what}: expected PROMPT,GENERATED (two integers), got {text!r}")
    return values[0], values[1]


def parse_precision(text: str) -> float:
    """'0.02' or '2%' as a share of the mean, strictly between 0 and 1 (0 would never stop,
    1 would stop on any two figures); MatrixError naming --precision otherwise."""
    number = text.strip()
    percent = number.endswith("%")
    try:
        share = float(number.removesuffix("%")) / (100 if percent else 1)
    except ValueError:
        raise MatrixError(
            f"--precision: {text!r} is not a share of the mean (0.02) or a percentage (2%)"
        ) from None
    if not (math.isfinite(share) and 0 < share < 1):
        raise MatrixError(f"--precision must be above 0 and below 1 (100%), got {text}")
    return share


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate(spec: MatrixSpec) -> None:
    """Raise MatrixError naming the first problem; return quietly for a runnable matrix within
    the limits above. Every message starts with the wire field it is about (`n_gen[0]: ...`,
    docs/protocol.md §5, The matrix), then says in words what is wrong: a peer and a CLI user
    (whose options are spelled the same: --n-gen, --batch-sizes, --iterations) read it alike."""
    lists = (
        ("n_prompt", "prompt length", spec.n_prompt, False),
        ("n_gen", "generation length", spec.n_gen, False),
        ("n_pg", "prompt+generation pair", spec.n_pg, False),
        ("n_depth", "depth", spec.n_depth, True),
        ("batch_sizes", "batch size", spec.batch_sizes, True),
        ("models", "model", spec.models, True),
        ("bits", "bit width", spec.bits, True),
    )
    for key, what, values, needed in lists:
        if needed and not values:
            raise MatrixError(f"{key}: empty; at least one {what} is needed")
        if len(values) > MAX_CELLS:
            raise MatrixError(f"{key}: {len(values)} {what}s given; at most {MAX_CELLS}")
    for i, n in enumerate(spec.n_prompt):
        _check_count(f"n_prompt[{i}]", "prompt length", n, 0, MAX_SEQ_LEN)
    for i, n in enumerate(spec.n_gen):
        _check_count(f"n_gen[{i}]", "generation length", n, 0, MAX_DECODE_TOKENS)
    for i, (prompt, generated) in enumerate(spec.n_pg):
        _check_count(f"n_pg[{i}][0]", "prompt length", prompt, 1, MAX_SEQ_LEN)
        _check_count(f"n_pg[{i}][1]", "generation length", generated, 1, MAX_DECODE_TOKENS)
    for i, n in enumerate(spec.n_depth):
        _check_count(f"n_depth[{i}]", "depth", n, 0, MAX_SEQ_LEN)
    if spec.serving is not None:
        _check_serving(spec)
    if not _tests(spec):
        raise MatrixError(
            "n_prompt, n_gen, n_pg: nothing to measure; give a prompt length or a generation "
            "length above 0, or a prompt+generation pair"
        )
    for i, b in enumerate(spec.batch_sizes):
        _check_count(f"batch_sizes[{i}]", "batch size", b, 1, MAX_BATCH_SIZE)
    for i, model in enumerate(spec.models):
        check_model_name(model, f"models[{i}]")
    for i, bits in enumerate(spec.bits):
        if bits is not None and (not _is_int(bits) or bits not in SUPPORTED_BITS):
            raise MatrixError(
                f"bits[{i}]: {bits!r} is not supported; choose from 4, 8, 16 (or none given: "
                "the model's own)"
            )
    _check_count("warmup", "", spec.warmup, 0, MAX_WARMUP)
    _check_count("iterations", "", spec.iterations, 1, MAX_ITERATIONS)
    _check_precision(spec.precision, spec.iterations)
    _check_count("prefill_step_size", "", spec.prefill_step_size, 1, MAX_SEQ_LEN)
    _check_seconds("delay_s", spec.delay_s, MAX_DELAY_S)
    _check_seconds("cool_start_s", spec.cool_start_s, MAX_COOL_START_S)
    depth = max(spec.n_depth)
    prompt, generated = max(_tests(spec), key=sum)
    batch = max(spec.serving.concurrency or (1,)) if spec.serving else max(spec.batch_sizes)
    largest = batch * (depth + prompt + generated)
    if largest > MAX_CELL_TOKENS:
        raise MatrixError(
            f"batch_sizes, n_depth, n_prompt, n_gen, n_pg: a cell would hold {largest} tokens "
            f"(batch {batch} x (depth {depth} + prompt {prompt} + generated "
            f"{generated})); the limit is {MAX_CELL_TOKENS} per cell"
        )
    cells = count_cells(spec)
    if cells > MAX_CELLS:
        raise MatrixError(
            f"models, bits, batch_sizes, n_depth, n_prompt, n_gen, n_pg: the matrix has {cells} "
            f"cells; the limit is {MAX_CELLS} per job"
        )


def _check_serving(spec: MatrixSpec) -> None:
    """A serving axis (shared.benchmark.serving) and what its cells cannot take: pairs, depths
    and batch sizes (a serving cell's batch is its load)."""
    assert spec.serving is not None
    try:
        validate_serving(spec.serving)
    except ServingError as exc:
        raise MatrixError(str(exc)) from None
    if spec.n_pg:
        raise MatrixError("n_pg: serving cells take prompt and output lengths, not pairs")
    if set(spec.n_depth) != {0}:
        raise MatrixError("n_depth: a serving cell's requests start from an empty cache")
    if set(spec.batch_sizes) != {1}:
        raise MatrixError("batch_sizes: a serving cell's batch is its load, not a batch size")
    serving = spec.serving
    longest = max((len(p.text.encode()) for p in serving.prompts), default=max(spec.n_prompt))
    if serving.requests * longest > MAX_CELL_TOKENS:  # each pass's prompts are made up front
        raise MatrixError(
            f"serving.requests, n_prompt: a pass would send {serving.requests * longest} prompt "
            f"tokens ({serving.requests} requests of up to {longest}); the limit is "
            f"{MAX_CELL_TOKENS} a pass"
        )


def _check_seconds(key: str, value: Any, most: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MatrixError(f"{key}: {value!r} is not a number of seconds")
    if not 0 <= value <= most:
        raise MatrixError(f"{key}: {value:g} s is outside 0..{most:g} s")


def _check_precision(precision: Any, iterations: int) -> None:
    """None (a fixed count), or a share of the mean strictly between 0 and 1 with room for
    the MIN_AUTO_REPETITIONS iterations `-r auto` always runs."""
    if precision is None:
        return
    if (
        isinstance(precision, bool)
        or not isinstance(precision, (int, float))
        or not math.isfinite(precision)
    ):
        raise MatrixError(f"precision: {precision!r} is not a number (a share of the mean)")
    if not 0 < precision < 1:
        raise MatrixError(f"precision: {precision:g} must be above 0 and below 1")
    if iterations < MIN_AUTO_REPETITIONS:
        raise MatrixError(
            f"iterations: {iterations} must be at least {MIN_AUTO_REPETITIONS} with a precision"
        )


def check_model_name(model: Any, where: str = "models") -> None:
    """A config name, a directory path or a Hugging Face id: text of 1 to MAX_MODEL_LENGTH
    characters, no NUL; `where` is the wire field the message names (`models[2]`)."""
    if not isinstance(model, str) or not model:
        raise MatrixError(
            f"{where}: model {model!r} must be a config name, a directory or ORG/NAME"
        )
    if len(model) > MAX_MODEL_LENGTH:
        raise MatrixError(
            f"{where}: model {model[:40]!r}... is {len(model)} characters; the limit is "
            f"{MAX_MODEL_LENGTH}"
        )
    if "\x00" in model:
        raise MatrixError(f"{where}: model {model!r} has a NUL character")


def _check_count(where: str, what: str, value: Any, least: int, most: int) -> None:
    """`where` is the wire field (`n_gen[0]`), `what` the same in words ("" when the field's
    name says it)."""
    said = f"{where}: {what} " if what else f"{where}: "
    if not _is_int(value):
        raise MatrixError(f"{said}{value!r} is not an integer")
    if value < least:
        floor = "0 or more" if least == 0 else f"at least {least}"
        raise MatrixError(f"{said}{value} must be {floor}")
    if value > most:
        raise MatrixError(f"{said}{value} is above the limit of {most}")


def _tests(spec: MatrixSpec) -> list[tuple[int, int]]:
    """(prompt, generated) of every test at one depth, in llama-bench's order: the pp tests,
    the tg tests, the pairs; zeros skipped, duplicates once. A serving matrix's: every prompt
    length with every output length (prompt 0 with a prompt file: its prompts are its own)."""
    if spec.serving is not None:
        prompts = [0] if spec.serving.prompts else [n for n in spec.n_prompt if n]
        return _unique((p, g) for p in prompts for g in spec.n_gen if g)
    tests = [(n, 0) for n in spec.n_prompt if n]
    tests += [(0, n) for n in spec.n_gen if n]
    tests += [tuple(pair) for pair in spec.n_pg]
    return _unique(tests)


def count_cells(spec: MatrixSpec) -> int:
    """len(expand(spec)), without building the cells."""
    per_bits = len(set(spec.batch_sizes)) * len(set(spec.n_depth)) * len(_tests(spec))
    if spec.serving is not None:
        per_bits = len(_tests(spec)) * len(_loads(spec.serving))
    return sum(
        len({resolve_bits(model, b) for b in spec.bits}) * per_bits
        for model in dict.fromkeys(spec.models)
    )


def _unique(values: Iterable[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def resolve_bits(model: str, bits: int | None) -> int | None:
    """A built-in model's default bits when none are given; None keeps a directory's weights."""
    return BUILTIN_DEFAULT_BITS.get(model) if bits is None else bits


def expand(spec: MatrixSpec) -> list[Cell]:
    """All cells, grouped by (model, bits) so each model is built once; within a batch size,
    by depth, then llama-bench's test order (pp, tg, pp+tg)."""
    validate(spec)
    names = model_names(spec.models)
    if spec.serving is not None:
        return _serving_cells(spec, names)
    return [
        Cell(model, bits, prompt, generated, depth, batch, model_label(model, bits, names))
        for model in _unique(spec.models)
        for bits in _unique(resolve_bits(model, b) for b in spec.bits)
        for batch in _unique(spec.batch_sizes)
        for depth in _unique(spec.n_depth)
        for prompt, generated in _tests(spec)
    ]


def _loads(serving: ServingSpec) -> list[tuple[int, float]]:
    """(clients, rate) of each load point: the closed loops, then the open ones."""
    return _unique(
        [(c, 0.0) for c in serving.concurrency] + [(0, r) for r in serving.request_rates]
    )


def _serving_cells(spec: MatrixSpec, names: dict[str, str]) -> list[Cell]:
    """A serving matrix's cells: per model and bits, per lengths, each load point."""
    assert spec.serving is not None
    lengths = _tests(spec)

    def workload(prompt: int, generated: int) -> str:
        if len(lengths) == 1:
            return ""
        return f"pp{prompt}+tg{generated}" if prompt else f"tg{generated}"

    return [
        Cell(
            model,
            bits,
            prompt,
            generated,
            0,
            1,
            model_label(model, bits, names),
            clients,
            rate,
            workload(prompt, generated),
        )
        for model in _unique(spec.models)
        for bits in _unique(resolve_bits(model, b) for b in spec.bits)
        for prompt, generated in lengths
        for clients, rate in _loads(spec.serving)
    ]


def planned_cells(data: dict[str, Any]) -> list[Cell]:
    """The cells a stored spec planned. A spec stored by protocol 3 (`seq_lengths`,
    `decode_tokens`: a pp cell per length, then a decode of that many tokens after each
    length) expands as it did then, so a run recorded before still lists what it missed."""
    if "seq_lengths" not in data:
        return expand(MatrixSpec.from_dict(data))
    lengths = _unique(data["seq_lengths"])
    generated = data.get("decode_tokens", 64)
    models = _unique(data.get("models", ["full"]))
    names = model_names(models)
    return [
        cell
        for model in models
        for bits in _unique(resolve_bits(model, b) for b in data.get("bits", [None]))
        for label in [model_label(model, bits, names)]
        for batch in _unique(data.get("batch_sizes", [1]))
        for cell in [Cell(model, bits, n, 0, 0, batch, label) for n in lengths]
        + [Cell(model, bits, 0, generated, n, batch, label) for n in lengths if generated]
    ]


@dataclass
class ModelGroup:
    """Cells that share one built model; `label` is theirs (Cell.label)."""

    model: str
    bits: int | None
    cells: list[Cell] = field(default_factory=list)
    label: str = ""


def group_by_model(cells: Iterable[Cell]) -> list[ModelGroup]:
    groups: dict[tuple[str, int | None], ModelGroup] = {}
    for cell in cells:
        key = (cell.model, cell.bits)
        group = groups.setdefault(key, ModelGroup(cell.model, cell.bits, label=cell.label))
        group.cells.append(cell)
    return list(groups.values())
