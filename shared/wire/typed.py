"""Checks spelt as msgspec types, refused in shared.shapes' words.

A wire shape written as a msgspec type (a Struct, or `list[...]`, `Annotated[float, Meta(...)]`,
`Literal[...]`) is checked in one pass in C: msgspec.msgpack.Decoder(T) on the hot path (bytes
to a checked value), check() on a value already decoded. What a type cannot say goes beside it:
a Struct's `__post_init__` raises ValueError with the problem (a policy's thresholds out of
order: "is not a policy: ..."); after() adds a hand-written check to a field, and open_map()
spells a map whose documented keys are typed and whose others may be any of a few kinds (a
machine's facts): check() runs those once msgspec accepts the value (a Decoder alone does not:
no hot-path type holds one). On a refusal, and only then, refusal() walks the value along the
path msgspec names and says the problem as shared.shapes would, `jobs[0].state is 'melting',
not one of ...`: a valid message costs no string, and a refused one gets a line naming its
field (docs/protocol.md §4).
"""

from __future__ import annotations

import functools
import math
import re
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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


MAX_OPEN_KEYS = 1024


@dataclass(frozen=True)
class _After:
    check: s.Check
    takes_nil: bool
    """Whether nil reaches the check: only where the type is Any (a check written whole by hand);
    elsewhere nil is the type's to allow (`| None`) and is never of the type checked after."""


def after(check: s.Check, type_: Any = Any) -> Any:
    """A `type_` that `check` (a shared.shapes check) also passes, run once msgspec accepts the
    whole value: what a type cannot say about a field, or a field whose check is still written
    by hand (type_ Any)."""
    return Annotated[type_, _After(check, type_ is Any)]


def struct(
    name: str, required: Mapping[str, Any], optional: Mapping[str, Any], module: str
) -> type[msgspec.Struct]:
    """A Struct of these fields (unknown ones refused; an optional one left out stays out),
    each a type, or a shared.shapes check in its place (run after()): a map whose fields
    several modules declare, some still by hand."""

    def typed(spec: Any) -> Any:
        return after(spec) if isinstance(spec, types.FunctionType) else spec

    fields = [(key, typed(spec)) for key, spec in required.items()]
    fields += [
        (key, typed(spec) | msgspec.UnsetType, msgspec.UNSET) for key, spec in optional.items()
    ]
    return msgspec.defstruct(
        name, fields, module=module, forbid_unknown_fields=True, omit_defaults=True
    )


def open_map(known: type[msgspec.Struct], other: Any) -> Any:
    """A map whose keys `known` names are checked as its fields and whose other keys (at most
    MAX_OPEN_KEYS) hold an `other`: what a newer agent may add."""
    names = frozenset(f.encode_name for f in msgspec.structs.fields(known))

    def open_check(value: dict[str, Any]) -> None:
        check({key: entry for key, entry in value.items() if key in names}, known)
        others = {key: entry for key, entry in value.items() if key not in names}
        if len(others) > MAX_OPEN_KEYS:
            raise s.Invalid("", f"has {len(others)} unknown fields")
        check(others, dict[str, other])

    return after(open_check, dict[str, Any])


def check(value: Any, type_: Any) -> None:
    """s.Invalid naming the first problem of `value` as a `type_`."""
    try:
        msgspec.convert(value, type_)
    except msgspec.ValidationError as exc:
        raise refusal(exc, value, type_) from None
    for path, later in _checks_after(type_):
        for keys, found in _reached(value, path, (), later.takes_nil):
            try:
                later.check(found)
            except s.Invalid as exc:
                for key in reversed(keys):
                    exc = exc.within(key)
                raise exc from None


Path = tuple[str | None, ...]
"""Field names from a type to a map within it; None: every item of a list."""


@functools.cache
def _checks_after(type_: Any) -> tuple[tuple[Path, _After], ...]:
    """Where fields checked after() sit in `type_`, those within one before it."""
    found: list[tuple[Path, _After]] = []
    if get_origin(type_) is Annotated:
        later = [((), meta) for meta in get_args(type_)[1:] if isinstance(meta, _After)]
        return (*_checks_after(get_args(type_)[0]), *later[:1])  # within first, then the whole
    if get_origin(type_) in (Union, types.UnionType):
        return tuple(spot for member in get_args(type_) for spot in _checks_after(member))
    if get_origin(type_) is list:
        return tuple(((None, *path), spec) for path, spec in _checks_after(get_args(type_)[0]))
    if isinstance(type_, type) and issubclass(type_, msgspec.Struct):
        for field in msgspec.structs.fields(type_):
            found += [
                ((field.encode_name, *path), spec) for path, spec in _checks_after(field.type)
            ]
    return tuple(found)


def _reached(
    value: Any, path: Path, keys: tuple[Any, ...], nil: bool
) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(keys, value) of each value at `path` in a checked `value` (`nil`: nil ones too); a
    field left out is none."""
    if not path:
        if value is not None or nil:
            yield keys, value
    elif path[0] is None:
        for index, item in enumerate(value if isinstance(value, list) else ()):
            yield from _reached(item, path[1:], (*keys, index), nil)
    elif isinstance(value, dict) and path[0] in value:
        yield from _reached(value[path[0]], path[1:], (*keys, path[0]), nil)


def shape(type_: Any) -> s.Check:
    """`type_` as a shared.shapes check, for a shape still written with shapes around it."""

    def checked(value: Any) -> None:
        check(value, type_)

    return checked


def field_checks(type_: type[msgspec.Struct]) -> dict[str, s.Check]:
    """Each of a Struct's fields as a check of its own (shared.wire.agent_shapes.salvaged: a
    stored map's fields kept or dropped one by one)."""
    return {f.encode_name: shape(f.type) for f in msgspec.structs.fields(type_)}


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
        words = found[1].replace("int | float", "float").split(" | ")  # number() is both
        nouns = [_NOUNS.get(word, word) for word in words]
        wanted = " or ".join(filter(None, (", ".join(nouns[:-1]), nouns[-1])))
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
