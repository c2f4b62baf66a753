"""Checks spelt as msgspec types, refused in shared.shapes' words.

A wire shape written as a msgspec type (a Struct, or `list[...]`, `Annotated[float, Meta(...)]`,
`Literal[...]`) is checked in one pass in C: msgspec.msgpack.Decoder(T) on the hot path (bytes
to a checked value), check() on a value already decoded. What a type cannot say (a policy's
thresholds in order, say) goes in the Struct's `__post_init__`, raising ValueError with the
problem ("is not a policy: ..."). On a refusal, and only then, refusal() walks the value along
the path msgspec names and says the problem as shared.shapes would, `jobs[0].state is 'melting',
not one of ...`, so a valid message costs no string and a refused one gets a line naming its
field (docs/protocol.md §4).
"""

from __future__ import annotations

import math
import re
import types
from collections.abc import Iterator
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

from shared import shapes as s

_AT = re.compile(r"^(?P<what>.*?)(?: - at `(?P<key>key` in `)?\$(?P<path>[^`]*)`)?$", re.S)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_NOUNS = {
    "int": "an int",
    "float": "a number",
    "str": "a str",
    "bool": "a bool",
    "object": "a map",
    "array": "a list",
    "null": "nil",
}


def check(value: Any, type_: Any) -> None:
    """s.Invalid naming the first problem of `value` as a `type_`."""
    try:
        msgspec.convert(value, type_)
    except msgspec.ValidationError as exc:
        raise refusal(exc, value, type_) from None


def shape(type_: Any) -> s.Check:
    """`type_` as a shared.shapes check, for a shape still written with shapes around it."""

    def checked(value: Any) -> None:
        check(value, type_)

    return checked


def refusal(error: msgspec.ValidationError, value: Any, type_: Any) -> s.Invalid:
    """The problem msgspec found in `value` (checked as a `type_`), named by its path."""
    match = _AT.match(str(error))
    assert match is not None  # the pattern matches any text
    what, path = match["what"], match["path"] or ""
    keys: list[Any] = []
    for name, index in _STEP.findall(path):
        type_ = _narrowed(type_, value)
        if name:
            value, type_ = _field(value, type_, name)
            keys.append(name)
        elif index == "...":  # a map's value: msgspec does not say which
            key, value, type_ = _failing_entry(value, _args(type_)[-1])
            keys.append(key)
        else:
            value = value[int(index)] if isinstance(value, list) else None
            type_ = _args(type_)[0]
            keys.append(int(index))
    if match["key"]:
        bad = next((key for key in value if type(key) is not str), None)
        problem = s.Invalid("", f"has a key that is {s.kind_of(bad)}, not a str")
    else:
        problem = _problem(what, value, _narrowed(type_, value))
    for key in reversed(keys):
        problem = problem.within(key)
    return problem


def _problem(what: str, value: Any, type_: Any) -> s.Invalid:
    if found := re.fullmatch(r"Object missing required field `(.+)`", what):
        return s.Invalid(found[1], "is missing")
    if found := re.fullmatch(r"Object contains unknown field `(.+)`", what):
        return s.Invalid("", f"has an unknown field {found[1]!r}")
    if found := re.fullmatch(r"Expected `(.+?)`, got `.+`", what):
        wanted = " or ".join(_NOUNS.get(word, word) for word in found[1].split(" | "))
        return s.Invalid("", f"is {s.kind_of(value)}, not {wanted}")
    if what.startswith("Invalid enum value"):
        allowed = ", ".join(sorted(map(str, _args(type_))))
        return s.Invalid("", f"is {value!r}, not one of {allowed}")
    if found := re.fullmatch(r"Expected `(?:int|float)` ([<>]=?) (\S+)", what):
        if isinstance(value, float) and not math.isfinite(value):
            return s.Invalid("", f"is {value}, not a finite number")
        side = "below" if found[1].startswith(">") else "above"
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        return s.Invalid("", f"is {shown}, {side} {found[2]}")
    if found := re.fullmatch(r"Expected `(str|array|object)` of length ([<>]=?) (\d+)", what):
        unit = {"str": "characters", "array": "items", "object": "keys"}[found[1]]
        side = "fewer than" if found[2].startswith(">") else "more than"
        return s.Invalid("", f"has {len(value)} {unit}, {side} {found[3]}")
    return s.Invalid("", what)  # a __post_init__'s own words


def _narrowed(type_: Any, value: Any) -> Any:
    """`type_` without Annotated, and of a union the member `value` was checked against."""
    while True:
        origin = get_origin(type_)
        if origin is Annotated:
            type_ = get_args(type_)[0]
        elif origin in (Union, types.UnionType):
            members = [t for t in get_args(type_) if t not in (type(None), msgspec.UnsetType)]
            type_ = next((t for t in members if _fits(t, value)), members[0])
        else:
            return type_


def _fits(type_: Any, value: Any) -> bool:
    """Whether `value` is of `type_`'s kind (a map for a Struct or dict, a list for a list):
    which member of a union msgspec went on to check."""
    bare = _narrowed(type_, value)
    origin = get_origin(bare) or bare
    if isinstance(bare, type) and issubclass(bare, msgspec.Struct) or origin is dict:
        return isinstance(value, dict)
    if origin is list:
        return isinstance(value, list)
    if origin is Literal:
        return isinstance(value, str)
    return isinstance(origin, type) and isinstance(value, origin)


def _field(value: Any, type_: Any, name: str) -> tuple[Any, Any]:
    """The value and the type of a Struct's field called `name` on the wire."""
    found = next(f for f in msgspec.structs.fields(type_) if f.encode_name == name)
    return (value.get(name) if isinstance(value, dict) else None), found.type


def _failing_entry(value: dict[Any, Any], type_: Any) -> tuple[Any, Any, Any]:
    for key, entry in _items(value):
        try:
            msgspec.convert(entry, type_)
        except msgspec.ValidationError:
            return key, entry, type_
    raise AssertionError("msgspec refused an entry that each check alone accepts")


def _items(value: Any) -> Iterator[tuple[Any, Any]]:
    return iter(value.items()) if isinstance(value, dict) else iter(())


def _args(type_: Any) -> tuple[Any, ...]:
    return get_args(_narrowed(type_, None))
