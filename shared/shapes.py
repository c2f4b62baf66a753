"""Shapes: checks of nested wire values, built from a few combinators, each naming the first problem
by its path (`record.tokens_per_sec is a str`). Pure: shared.wire.agent_shapes spells what an agent
may send with them, so the coordinator can trust nothing it did not check."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""Every integer a store keeps is within SQLite's (and a C int64's) range."""

Check = Callable[[Any], None]
"""Raises Invalid when the value is wrong. Paths are built only then, as the error rises
through the maps and lists that hold the value: a valid message (all but a hostile agent's)
costs no string."""


class Invalid(ValueError):
    """A value a check refused; `path` is where it sits, `problem` what is wrong with it."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path} {problem}" if path else problem)
        self.path = path
        self.problem = problem

    def within(self, key: object) -> Invalid:
        """The same problem, seen from the map or list that holds the value at `key`."""
        if isinstance(key, int):
            path = (
                f"[{key}]{self.path}"
                if self.path.startswith("[") or not self.path
                else (f"[{key}].{self.path}")
            )
        else:
            path = f"{key}{self.path}" if self.path.startswith("[") else _at(str(key), self.path)
        return Invalid(path, self.problem)


def unknown_keys(data: Mapping[Any, Any], known: Iterable[str]) -> list[str]:
    """The keys of `data` that are not `known`, as text and sorted (a peer's key may be
    anything): what a record's from_dict refuses, naming them all."""
    return sorted(map(str, set(data) - set(known)))


def kind_of(value: Any) -> str:
    """A value's wire kind, as a problem names it."""
    if value is None:
        return "nil"
    return {dict: "a map", list: "a list", str: "a str", bool: "a bool", bytes: "bytes"}.get(
        type(value), f"a {type(value).__name__}"
    )


def _at(head: str, rest: str) -> str:
    return f"{head}.{rest}" if rest else head


def text(most: int | None = None, least: int = 0) -> Check:
    """A str of `least` to `most` characters."""

    def check(value: Any) -> None:
        if type(value) is not str:
            raise Invalid("", f"is {kind_of(value)}, not a str")
        if len(value) < least or (most is not None and len(value) > most):
            bound = f"{least} to {most}" if most is not None else f"at least {least}"
            raise Invalid("", f"has {len(value)} characters, not {bound}")

    _fast[check] = (_TEXT, (False, least, INT64_MAX if most is None else most))
    return check


_TYPES, _FINITE, _INT, _MEMBER, _TEXT = 0, 1, 2, 3, 4
_fast: dict[Check, tuple[int, Any]] = {}
"""Checks that fields() can run inline, without a call: an exact type set (_TYPES), a finite
number or an int within bounds (_FINITE, _INT: nil allowed, least, most), a str among a set
(_MEMBER: nil allowed, the set) or of bounded length (_TEXT: nil allowed, least, most). Most
fields of a sample are such, and a lab's telemetry is checked sample by sample at one
coordinator."""


def integer(least: int = INT64_MIN, most: int = INT64_MAX) -> Check:
    """An int (never a bool or a float) within [least, most]."""

    def check(value: Any) -> None:
        if type(value) is not int:
            raise Invalid("", f"is {kind_of(value)}, not an int")
        if not least <= value <= most:
            raise Invalid("", f"is {value}, outside {least} to {most}")

    _fast[check] = (_INT, (False, least, most))
    return check


def number(least: float | None = None, most: float | None = None) -> Check:
    """A finite int or float (never a bool), ints within int64, within [least, most]."""

    def check(value: Any) -> None:
        if type(value) is float:
            if not math.isfinite(value):
                raise Invalid("", f"is {value}, not a finite number")
        elif type(value) is int:
            if not INT64_MIN <= value <= INT64_MAX:
                raise Invalid("", f"is {value}, outside the 64-bit range")
        else:
            raise Invalid("", f"is {kind_of(value)}, not a number")
        if least is not None and value < least:
            raise Invalid("", f"is {value:g}, below {least:g}")
        if most is not None and value > most:
            raise Invalid("", f"is {value:g}, above {most:g}")

    _fast[check] = (_FINITE, (False, least, most))
    return check


def flag(value: Any) -> None:
    if type(value) is not bool:
        raise Invalid("", f"is {kind_of(value)}, not a bool")


_fast[flag] = (_TYPES, frozenset({bool}))


def one_of(values: Collection[str]) -> Check:
    """A str among `values`."""
    allowed = frozenset(values)

    def check(value: Any) -> None:
        if type(value) is not str:
            raise Invalid("", f"is {kind_of(value)}, not a str")
        if value not in allowed:
            raise Invalid("", f"is {value!r}, not one of {', '.join(sorted(allowed))}")

    _fast[check] = (_MEMBER, (False, allowed))
    return check


def nil_or(inner: Check) -> Check:
    def check(value: Any) -> None:
        if value is not None:
            inner(value)

    fast = _fast.get(inner)
    if fast is not None:
        kind, arg = fast
        _fast[check] = (kind, arg | {type(None)} if kind == _TYPES else (True, *arg[1:]))
    return check


def list_of(item: Check, most: int | None = None) -> Check:
    """A list of at most `most` items, each passing `item`."""

    def check(value: Any) -> None:
        if type(value) is not list:
            raise Invalid("", f"is {kind_of(value)}, not a list")
        if most is not None and len(value) > most:
            raise Invalid("", f"has {len(value)} items, more than {most}")
        for index, entry in enumerate(value):
            try:
                item(entry)
            except Invalid as exc:
                raise exc.within(index) from None

    return check


def map_of(item: Check, most: int = 1024) -> Check:
    """A map of str keys (at most `most`), each value passing `item`."""

    def check(value: Any) -> None:
        if type(value) is not dict:
            raise Invalid("", f"is {kind_of(value)}, not a map")
        if len(value) > most:
            raise Invalid("", f"has {len(value)} keys, more than {most}")
        for key, entry in value.items():
            if type(key) is not str:
                raise Invalid("", f"has a key that is {kind_of(key)}, not a str")
            try:
                item(entry)
            except Invalid as exc:
                raise exc.within(key) from None

    return check


def fields(
    required: Mapping[str, Check],
    optional: Mapping[str, Check] | None = None,
    others: Check | None = None,
) -> Check:
    """A map with every `required` key, any `optional` one (nil or absent where its check
    allows nil), and no other key unless `others` checks its value (then at most 1024)."""
    optional = dict(optional or {})
    known = frozenset(required) | frozenset(optional)
    plan = [(key, True, *_fast.get(inner, (None, inner))) for key, inner in required.items()]
    plan += [(key, False, *_fast.get(inner, (None, inner))) for key, inner in optional.items()]
    everything = {**required, **optional}

    def check(value: Any) -> None:
        if type(value) is not dict:
            raise Invalid("", f"is {kind_of(value)}, not a map")
        for key, needed, kind, arg in plan:
            if key not in value:
                if needed:
                    raise Invalid(key, "is missing")
                continue
            entry = value[key]
            if kind == _TYPES:
                if type(entry) in arg:
                    continue
            elif kind is None:
                pass
            elif entry is None:
                if arg[0]:
                    continue
            elif kind == _FINITE:
                kind_ = type(entry)
                if (kind_ is float and math.isfinite(entry)) or (
                    kind_ is int and INT64_MIN <= entry <= INT64_MAX
                ):
                    least, most = arg[1], arg[2]
                    if (least is None or entry >= least) and (most is None or entry <= most):
                        continue
            elif kind == _INT:
                if type(entry) is int and arg[1] <= entry <= arg[2]:
                    continue
            elif kind == _TEXT:
                if type(entry) is str and arg[1] <= len(entry) <= arg[2]:
                    continue
            elif type(entry) is str and entry in arg[1]:  # _MEMBER
                continue
            try:
                everything[key](entry)  # the full check: it names the problem
            except Invalid as exc:
                raise exc.within(key) from None
        if known.issuperset(value):
            return
        unknown = [key for key in value if key not in known]
        if others is None:
            raise Invalid("", f"has an unknown field {unknown[0]!r}")
        if len(unknown) > 1024:
            raise Invalid("", f"has {len(unknown)} unknown fields")
        for key in unknown:
            if type(key) is not str:
                raise Invalid("", f"has a key that is {kind_of(key)}, not a str")
            try:
                others(value[key])
            except Invalid as exc:
                raise exc.within(key) from None

    return check


def either(*checks: Check) -> Check:
    """A value one of `checks` accepts; the first one's problem is named otherwise."""

    def check(value: Any) -> None:
        first: Invalid | None = None
        for inner in checks:
            try:
                inner(value)
                return
            except Invalid as exc:
                first = first or exc
        assert first is not None
        raise first

    return check
