"""The benchmark matrix: what to measure, expanded into cells. Pure data, pure functions.

A matrix is sequence lengths x batch sizes x modes x models x bit widths. Prefill cells are
labelled `pp<N>`; decode cells `tg<G> @ d<N>`, G new tokens after a prefilled context of N
tokens, as llama-bench labels depth.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

# Limits per spec (docs/protocol.md §5, Limits): what one job may ask for. They keep a job, its
# bench.start.ok (every cell's name) and a job.get page that echoes the spec within one message,
# and refuse a request before it can make the agent do absurd work.
MAX_CELLS = 1024
"""Cells per job, after duplicates are dropped; also the most entries in any of the lists."""
MAX_SEQ_LEN = 1_048_576
MAX_BATCH_SIZE = 1024
MAX_CELL_TOKENS = 4_194_304
"""Tokens one iteration of a cell holds: batch x sequence length (+ decode tokens)."""
MAX_ITERATIONS = 1000
MAX_WARMUP = 100
MAX_DECODE_TOKENS = 8192
MAX_MODEL_LENGTH = 1024
"""Characters of a model's name or directory path (macOS's PATH_MAX)."""
SUPPORTED_BITS = (4, 8, 16)
BUILTIN_DEFAULT_BITS = {"small": 16, "full": 4}
"""Bits used when none are asked for: the seed docs quote Q4 figures for the full model; the
small model stays float16 so a smoke test is quick on MLX's CPU backend (slow quantized kernels)."""
DEFAULT_SEQ_LENGTHS = (128, 512, 1024, 2048)
DEFAULT_DECODE_TOKENS = 64
PREFILL = "prefill"
DECODE = "decode"


class MatrixError(ValueError):
    """A matrix that cannot run; the message names the offending value."""


@dataclass(frozen=True)
class MatrixSpec:
    """Everything a benchmark run varies. `bits=None` keeps a model's stored weights."""

    seq_lengths: tuple[int, ...] = DEFAULT_SEQ_LENGTHS
    batch_sizes: tuple[int, ...] = (1,)
    models: tuple[str, ...] = ("full",)
    bits: tuple[int | None, ...] = (None,)
    decode_tokens: int = DEFAULT_DECODE_TOKENS
    warmup: int = 2
    iterations: int = 5

    def to_dict(self) -> dict[str, Any]:
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in asdict(self).items()
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MatrixSpec:
        """Build and validate a spec from plain data (e.g. a decoded message body)."""
        if not isinstance(data, dict):
            raise MatrixError("a matrix must be a mapping")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(map(str, set(data) - known))  # a key may be anything on the wire
        if unknown:
            raise MatrixError(f"unknown matrix field(s): {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for key, value in data.items():
            if key in ("seq_lengths", "batch_sizes", "models", "bits"):
                if not isinstance(value, (list, tuple)):
                    raise MatrixError(f"{key} must be a list, got {value!r}")
                values[key] = tuple(value)
            else:
                values[key] = value
        spec = cls(**values)
        validate(spec)
        return spec


@dataclass(frozen=True)
class Cell:
    """One measurement of the matrix."""

    model: str
    bits: int | None
    mode: str
    seq_len: int
    batch_size: int
    decode_tokens: int = 0

    @property
    def test(self) -> str:
        if self.mode == PREFILL:
            return f"pp{self.seq_len}"
        return f"tg{self.decode_tokens} @ d{self.seq_len}"

    @property
    def tokens(self) -> int:
        """Tokens processed by one timed iteration."""
        per_row = self.seq_len if self.mode == PREFILL else self.decode_tokens
        return per_row * self.batch_size

    @property
    def held_tokens(self) -> int:
        """Tokens the model holds at once: the context and, decoding, what it generates."""
        per_row = self.seq_len + (self.decode_tokens if self.mode == DECODE else 0)
        return per_row * self.batch_size

    @property
    def name(self) -> str:
        """A unique, readable key within a run."""
        return f"{model_label(self.model, self.bits)} {self.test} b{self.batch_size}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"test": self.test, "name": self.name}


def bits_label(bits: int | None) -> str:
    if bits is None:
        return "stored"
    return "f16" if bits == 16 else f"q{bits}"


def model_label(model: str, bits: int | None) -> str:
    """'small/q4'; a model directory goes by its folder name: 'Llama-3.2-3B/f16'."""
    name = model.rstrip("/").rsplit("/", 1)[-1] if "/" in model else model
    return f"{name}/{bits_label(bits)}"


def parse_int_list(text: str, what: str) -> tuple[int, ...]:
    """'128,512' -> (128, 512); the error names `what` and the bad item."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or any(not item for item in items):
        raise MatrixError(f"{what}: expected a comma-separated list of integers, got {text!r}")
    try:
        return tuple(int(item) for item in items)
    except ValueError:
        raise MatrixError(f"{what}: {text!r} is not a list of integers") from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate(spec: MatrixSpec) -> None:
    """Raise MatrixError naming the first problem; return quietly for a runnable matrix within
    the limits above."""
    lists = (
        ("sequence length", spec.seq_lengths),
        ("batch size", spec.batch_sizes),
        ("model", spec.models),
        ("bit width", spec.bits),
    )
    for what, values in lists:
        if not values:
            raise MatrixError(f"at least one {what} is needed")
        if len(values) > MAX_CELLS:
            raise MatrixError(f"{len(values)} {what}s given; at most {MAX_CELLS}")
    for n in spec.seq_lengths:
        if not _is_int(n) or not 0 < n <= MAX_SEQ_LEN:
            raise MatrixError(f"sequence length {n!r} is outside 1..{MAX_SEQ_LEN}")
    for b in spec.batch_sizes:
        if not _is_int(b) or b <= 0:
            raise MatrixError(f"batch size {b!r} must be a positive integer")
        if b > MAX_BATCH_SIZE:
            raise MatrixError(f"batch size {b} is above the limit of {MAX_BATCH_SIZE}")
    for model in spec.models:
        check_model_name(model)
    for bits in spec.bits:
        if bits is not None and (not _is_int(bits) or bits not in SUPPORTED_BITS):
            raise MatrixError(f"bits {bits!r} not supported; choose from 4, 8, 16")
    _check_count("decode tokens", spec.decode_tokens, 0, MAX_DECODE_TOKENS)
    _check_count("warmup", spec.warmup, 0, MAX_WARMUP)
    _check_count("iterations", spec.iterations, 1, MAX_ITERATIONS)
    largest = max(spec.batch_sizes) * (max(spec.seq_lengths) + spec.decode_tokens)
    if largest > MAX_CELL_TOKENS:
        raise MatrixError(
            f"a cell would hold {largest} tokens (batch x (sequence length + decode tokens)); "
            f"the limit is {MAX_CELL_TOKENS} per cell"
        )
    cells = count_cells(spec)
    if cells > MAX_CELLS:
        raise MatrixError(f"the matrix has {cells} cells; the limit is {MAX_CELLS} per job")


def check_model_name(model: Any) -> None:
    """A config name or a directory path: text of 1 to MAX_MODEL_LENGTH characters, no NUL."""
    if not isinstance(model, str) or not model:
        raise MatrixError(f"model {model!r} must be a config name or a directory")
    if len(model) > MAX_MODEL_LENGTH:
        raise MatrixError(
            f"model {model[:40]!r}... is {len(model)} characters; the limit is {MAX_MODEL_LENGTH}"
        )
    if "\x00" in model:
        raise MatrixError(f"model {model!r} has a NUL character")


def _check_count(what: str, value: Any, least: int, most: int) -> None:
    if not _is_int(value) or value < least:
        floor = "0 or more" if least == 0 else f"at least {least}"
        raise MatrixError(f"{what} {value!r} must be {floor}")
    if value > most:
        raise MatrixError(f"{what} {value} is above the limit of {most}")


def count_cells(spec: MatrixSpec) -> int:
    """len(expand(spec)), without building the cells."""
    modes = 2 if spec.decode_tokens else 1
    per_bits = len(set(spec.batch_sizes)) * len(set(spec.seq_lengths)) * modes
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
    """All cells, grouped by (model, bits) so each model is built once, prefill before decode."""
    validate(spec)
    cells: list[Cell] = []
    for model in _unique(spec.models):
        for bits in _unique(resolve_bits(model, b) for b in spec.bits):
            for batch in _unique(spec.batch_sizes):
                for n in _unique(spec.seq_lengths):
                    cells.append(Cell(model, bits, PREFILL, n, batch))
                if spec.decode_tokens:
                    for n in _unique(spec.seq_lengths):
                        cells.append(Cell(model, bits, DECODE, n, batch, spec.decode_tokens))
    return cells


@dataclass
class ModelGroup:
    """Cells that share one built model."""

    model: str
    bits: int | None
    cells: list[Cell] = field(default_factory=list)


def group_by_model(cells: Iterable[Cell]) -> list[ModelGroup]:
    groups: dict[tuple[str, int | None], ModelGroup] = {}
    for cell in cells:
        key = (cell.model, cell.bits)
        groups.setdefault(key, ModelGroup(cell.model, cell.bits)).cells.append(cell)
    return list(groups.values())
