"""Shapes: checks of nested wire values, built from a few combinators, each naming the first
problem by its path (`record.tokens_per_sec is a str`). Pure: shared.agent_shapes spells what an
agent may send with them, so the coordinator can trust nothing it did not check."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""Every integer a store keeps is within SQLite's (and a C int64's) range."""

Check = Callable[[Any, str], None]
"""Raises Invalid naming `path` (the value's place in the message) when the value is wrong."""


class Invalid(ValueError):
    """A value a check refused; `path` is where it sits, `problem` what is wrong with it."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path} {problem}" if path else problem)
        self.path = path
        self.problem = problem


def kind_of(value: Any) -> str:
    """A value's wire kind, as a problem names it."""
    if value is None:
        return "nil"
    return {dict: "a map", list: "a list", str: "a str", bool: "a bool", bytes: "bytes"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _at(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def text(most: int | None = None, least: int = 0) -> Check:
    """A str of `least` to `most` characters."""

    def check(value: Any, path: str) -> None:
        if type(value) is not str:
            raise Invalid(path, f"is {kind_of(value)}, not a str")
        if len(value) < least or (most is not None and len(value) > most):
            bound = f"{least} to {most}" if most is not None else f"at least {least}"
            raise Invalid(path, f"has {len(value)} characters, not {bound}")

    return check


def integer(least: int = INT64_MIN, most: int = INT64_MAX) -> Check:
    """An int (never a bool or a float) within [least, most]."""

    def check(value: Any, path: str) -> None:
        if type(value) is not int:
            raise Invalid(path, f"is {kind_of(value)}, not an int")
        if not least <= value <= most:
            raise Invalid(path, f"is {value}, outside {least} to {most}")

    return check


def number(least: float | None = None, most: float | None = None) -> Check:
    """A finite int or float (never a bool), ints within int64, within [least, most]."""

    def check(value: Any, path: str) -> None:
        if type(value) is float:
            if not math.isfinite(value):
                raise Invalid(path, f"is {value}, not a finite number")
        elif type(value) is int:
            if not INT64_MIN <= value <= INT64_MAX:
                raise Invalid(path, f"is {value}, outside the 64-bit range")
        else:
            raise Invalid(path, f"is {kind_of(value)}, not a number")
        if least is not None and value < least:
            raise Invalid(path, f"is {value:g}, below {least:g}")
        if most is not None and value > most:
            raise Invalid(path, f"is {value:g}, above {most:g}")

    return check


def flag(value: Any, path: str) -> None:
    if type(value) is not bool:
        raise Invalid(path, f"is {kind_of(value)}, not a bool")


def one_of(values: Collection[str]) -> Check:
    """A str among `values`."""
    allowed = frozenset(values)

    def check(value: Any, path: str) -> None:
        if type(value) is not str:
            raise Invalid(path, f"is {kind_of(value)}, not a str")
        if value not in allowed:
            raise Invalid(path, f"is {value!r}, not one of {', '.join(sorted(allowed))}")

    return check


def nil_or(inner: Check) -> Check:
    def check(value: Any, path: str) -> None:
        if value is not None:
            inner(value, path)

    return check


def list_of(item: Check, most: int | None = None) -> Check:
    """A list of at most `most` items, each passing `item`."""

    def check(value: Any, path: str) -> None:
        if type(value) is not list:
            raise Invalid(path, f"is {kind_of(value)}, not a list")
        if most is not None and len(value) > most:
            raise Invalid(path, f"has {len(value)} items, more than {most}")
        for index, entry in enumerate(value):
            item(entry, f"{path}[{index}]")

    return check


def map_of(item: Check, most: int = 1024) -> Check:
    """A map of str keys (at most `most`), each value passing `item`."""

    def check(value: Any, path: str) -> None:
        if type(value) is not dict:
            raise Invalid(path, f"is {kind_of(value)}, not a map")
        if len(value) > most:
            raise Invalid(path, f"has {len(value)} keys, more than {most}")
        for key, entry in value.items():
            if type(key) is not str:
                raise Invalid(path, f"has a key that is {kind_of(key)}, not a str")
            item(entry, _at(path, key))

    return check


def fields(
    required: Mapping[str, Check],
    optional: Mapping[str, Check] | None = None,
    others: Check | None = None,
) -> Check:
    """A map with every `required` key, any `optional` one (nil or absent where its check
    allows nil), and no other key unless `others` checks its value (then at most 1024)."""
    optional = dict(optional or {})
    known = set(required) | set(optional)

    def check(value: Any, path: str) -> None:
        if type(value) is not dict:
            raise Invalid(path, f"is {kind_of(value)}, not a map")
        for key, inner in required.items():
            if key not in value:
                raise Invalid(_at(path, key), "is missing")
            inner(value[key], _at(path, key))
        for key, inner in optional.items():
            if key in value:
                inner(value[key], _at(path, key))
        unknown = [key for key in value if key not in known]
        if unknown and others is None:
            raise Invalid(path, f"has an unknown field {unknown[0]!r}")
        if len(unknown) > 1024:
            raise Invalid(path, f"has {len(unknown)} unknown fields")
        for key in unknown:
            if type(key) is not str:
                raise Invalid(path, f"has a key that is {kind_of(key)}, not a str")
            assert others is not None
            others(value[key], _at(path, key))

    return check


def either(*checks: Check) -> Check:
    """A value one of `checks` accepts; the first one's problem is named otherwise."""

    def check(value: Any, path: str) -> None:
        first: Invalid | None = None
        for inner in checks:
            try:
                inner(value, path)
                return
            except Invalid as exc:
                first = first or exc
        assert first is not None
        raise first

    return check
