"""The benchmark matrix: what to measure, expanded into cells. Pure data, pure functions.

A matrix is sequence lengths x batch sizes x modes x models x bit widths. Prefill cells are
labelled `pp<N>`; decode cells `tg<G> @ d<N>`, G new tokens after a prefilled context of N
tokens, as llama-bench labels depth.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

MAX_SEQ_LEN = 1_048_576
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
        unknown = sorted(set(data) - known)
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
    """Raise MatrixError naming the first problem; return quietly for a runnable matrix."""
    if not spec.seq_lengths:
        raise MatrixError("at least one sequence length is needed")
    for n in spec.seq_lengths:
        if not _is_int(n) or not 0 < n <= MAX_SEQ_LEN:
            raise MatrixError(f"sequence length {n!r} is outside 1..{MAX_SEQ_LEN}")
    if not spec.batch_sizes:
        raise MatrixError("at least one batch size is needed")
    for b in spec.batch_sizes:
        if not _is_int(b) or b <= 0:
            raise MatrixError(f"batch size {b!r} must be a positive integer")
    if not spec.models:
        raise MatrixError("at least one model is needed")
    for model in spec.models:
        if not isinstance(model, str) or not model:
            raise MatrixError(f"model {model!r} must be a config name or a directory")
    if not spec.bits:
        raise MatrixError("at least one bit width is needed")
    for bits in spec.bits:
        if bits is not None and bits not in SUPPORTED_BITS:
            raise MatrixError(f"bits {bits!r} not supported; choose from 4, 8, 16")
    if not _is_int(spec.decode_tokens) or spec.decode_tokens < 0:
        raise MatrixError(f"decode tokens {spec.decode_tokens!r} must be 0 or more")
    if not _is_int(spec.warmup) or spec.warmup < 0:
        raise MatrixError(f"warmup {spec.warmup!r} must be 0 or more")
    if not _is_int(spec.iterations) or spec.iterations < 1:
        raise MatrixError(f"iterations {spec.iterations!r} must be at least 1")


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
