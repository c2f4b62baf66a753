"""What an option was given, refused before it means anything: an empty value is an error (one
line, exit 2), never a default or the current folder (issue 42: `--bits ''` ran the default bits,
`--output ''` was reported as `.`); an option that only means something beside another is
refused without it, and two that contradict each other are refused together; and the callbacks
that bound a number or a choice (shared/io/options.py declares every option with them)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

from shared.bounds import BoundError, check_count, duration_text
from shared.io.cli import usage_error

T = TypeVar("T")


def empty_refused(flag: str) -> str:
    return f"{flag} is empty: give a value, or leave {flag} out"


def not_empty(flag: str) -> Callable[[T], T]:
    """An option callback refusing an empty (or blank) string, or one in a repeated option."""

    def check(value: T) -> T:
        values = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(item, str) and not item.strip() for item in values):
            raise usage_error(empty_refused(flag))
        return value

    return check


def path_given(flag: str, suffix: str | None = None) -> Callable[[str], Path]:
    """A Path option's parser (it sees the text before Path('') turns it into `.`): refuses
    an empty one, and with `suffix` a file that would not be named for what is written in it."""

    def parse(text: str) -> Path:
        if not text.strip():
            raise usage_error(empty_refused(flag))
        path = Path(text)
        if suffix is not None and path.suffix.lower() != suffix:
            raise usage_error(
                f"{flag} {text}: the file is written as {suffix[1:].upper()}, so its name "
                f"must end in {suffix}"
            )
        return path

    return parse


def needs(flag: str, given: Any, other: str, present: bool) -> None:
    """`flag` means something only beside `other`: refused when given without it."""
    if given is not None and given is not False and not present:
        raise usage_error(
            f"{flag} applies with {other} only: give {other} too, or leave {flag} out"
        )


def conflict(flag: str, given: Any, other: str, present: bool) -> None:
    """`flag` and `other` contradict each other: refused together."""
    if given is not None and given is not False and present:
        raise usage_error(f"{flag} and {other} conflict: give one of them")


def on_command_line(ctx: typer.Context, name: str) -> bool:
    """Whether parameter `name`'s option was given on the command line (not its default)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def apart_from(
    flag: str, other: str, then: Callable[[Any], Any] | None = None
) -> Callable[[typer.Context, typer.CallbackParam, Any], Any]:
    """An option callback refusing `flag` beside `other` (whose parameter is named after it),
    whichever of the two comes first on the command line (the second one's callback sees the
    first); `then` checks the value further."""
    other_name = other.lstrip("-").replace("-", "_")

    def check(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        mine = on_command_line(ctx, param.name or "")
        if mine and value is not False and on_command_line(ctx, other_name):
            raise usage_error(f"{flag} and {other} conflict: give one of them")
        return then(value) if then is not None else value

    return check


def one_of(choices: tuple[str, ...], what: str = "format") -> Callable[[str], str]:
    """An option callback refusing anything but `choices`, as one line, exit 2."""

    def check(value: str) -> str:
        if value not in choices:
            raise usage_error(f"unknown {what} {value!r}; choose from {', '.join(choices)}")
        return value

    return check


def positive(flag: str, unit: str = "", most: float | None = None) -> Callable[[float], float]:
    """An option callback refusing a number that is not finite and > 0 (and <= `most`, a bound
    of shared.bounds, when given)."""
    return _finite(flag, unit, "> 0", lambda value: value > 0, most)


def at_least_zero(flag: str, unit: str = "", most: float | None = None) -> Callable[[float], float]:
    """An option callback refusing a number that is not finite and >= 0 (and <= `most`)."""
    return _finite(flag, unit, ">= 0", lambda value: value >= 0, most)


def finite_number(flag: str) -> Callable[[float | None], float | None]:
    """An option callback refusing NaN and the infinities by name (None, not given, passes)."""

    def check(value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise usage_error(f"{flag} must be a finite number, got {value}")
        return value

    return check


def count(flag: str, least: int, most: int) -> Callable[[int | None], int | None]:
    """An option callback refusing a whole number outside `least`..`most` (shared.bounds)."""

    def check(value: int | None) -> int | None:
        if value is None:
            return None
        try:
            return check_count(flag, value, least, most)
        except BoundError as exc:
            raise usage_error(str(exc)) from None

    return check


def _finite(
    flag: str, unit: str, bound: str, within: Callable[[float], bool], most: float | None = None
) -> Callable[[float], float]:
    shown = f" {unit}" if unit else ""

    def check(value: float) -> float:
        if not math.isfinite(value):
            raise usage_error(f"{flag} must be a finite number, got {value}")
        if not within(value):
            raise usage_error(f"{flag} must be {bound}{shown}, got {value:g}")
        if most is not None and value > most:
            limit = (
                f"{duration_text(most)} ({most:g} s)" if unit == "seconds" else f"{most:g}{shown}"
            )
            raise usage_error(f"{flag} must be at most {limit}, got {value:g}")
        return value

    return check
