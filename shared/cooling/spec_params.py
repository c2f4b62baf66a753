"""`k=v,k=v` parameters of a simulated source's name (`sim:tau_s=5`, `sim:plant:air,speed=60`),
read one way for every simulated source."""

from __future__ import annotations

from collections.abc import Collection

from shared.bounds import NotFinite, finite_float


def spec_numbers(
    text: str, known: Collection[str], label: str, error: type[ValueError]
) -> dict[str, float]:
    """Each `key=value` of comma-separated `text` as a finite number; `error` names an unknown
    key, a missing `=`, or a value that is not a finite number, prefixed by `label`."""
    values: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = (piece.strip() for piece in item.partition("="))
        if not sep or key not in known:
            raise error(
                f"{label}: bad parameter {item!r}; known: {', '.join(known)} (as key=value)"
            )
        try:
            values[key] = finite_float(value)
        except NotFinite as exc:
            raise error(f"{label}: {key} must be {exc}, got {value!r}") from None
    return values
