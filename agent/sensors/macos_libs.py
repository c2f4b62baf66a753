"""The macOS libraries the in-process sources call through ctypes, and one way to bind them."""

from __future__ import annotations

import ctypes
from typing import Any

from agent.sensors.base import SourceUnavailable

CORE_FOUNDATION = "/System/Library/Frameworks/CoreFoundation.framework/CoreFoundation"
IOKIT = "/System/Library/Frameworks/IOKit.framework/IOKit"
LIBSYSTEM = "/usr/lib/libSystem.B.dylib"


def load(path: str, source: str) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(path)
    except OSError as exc:
        raise SourceUnavailable(f"{source}: cannot load {path}: {exc}") from exc


def bind(lib: ctypes.CDLL, name: str, restype: Any, *argtypes: Any, source: str = "") -> Any:
    """`lib`'s function `name`, typed. A symbol this macOS lacks (a private framework's IOKit,
    IOReport or SMC call renamed or gone) is SourceUnavailable, "source unavailable: NAME
    missing", prefixed by `source`: never the AttributeError ctypes raises, which no source's
    caller catches (docs/thermal.md, Never abort)."""
    try:
        function = getattr(lib, name)
    except AttributeError:
        raise _missing(lib, name, source) from None
    # Every pointer restype must be c_void_p: the default int truncates 64-bit pointers.
    function.restype = restype
    function.argtypes = list(argtypes)
    return function


def variable(ctype: Any, lib: ctypes.CDLL, name: str, source: str = "") -> Any:
    """`lib`'s global `name` (`mach_task_self_`, `kCFTypeDictionaryKeyCallBacks`) as `ctype`;
    a missing one is SourceUnavailable as bind() says it, not in_dll's ValueError."""
    try:
        return ctype.in_dll(lib, name)
    except ValueError:
        raise _missing(lib, name, source) from None


def _missing(lib: ctypes.CDLL, name: str, source: str) -> SourceUnavailable:
    said = f"source unavailable: {name} missing from {lib._name}"
    return SourceUnavailable(f"{source}: {said}" if source else said)


def _sysctlbyname() -> Any:
    """libSystem's sysctlbyname(3), bound."""
    return bind(
        load(LIBSYSTEM, "sysctl"),
        "sysctlbyname",
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_void_p,
        ctypes.c_size_t,
    )


def apple_silicon() -> bool:
    """`hw.optional.arm64` is 1: Apple Silicon, even for a Python that Rosetta translates."""
    sysctlbyname = _sysctlbyname()
    value, size = ctypes.c_int(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_int))
    found = sysctlbyname(b"hw.optional.arm64", ctypes.byref(value), ctypes.byref(size), None, 0)
    return found == 0 and value.value == 1


def bind_or_unavailable(
    lib: ctypes.CDLL, source: str, name: str, restype: Any, *argtypes: Any
) -> Any:
    """bind(), its unavailability prefixed by `source`."""
    return bind(lib, name, restype, *argtypes, source=source)


def sysctl_text(name: str) -> str | None:
    """A string sysctl (`machdep.cpu.brand_string`: `Apple M4 Pro`); None when it has none."""
    sysctlbyname = _sysctlbyname()
    size = ctypes.c_size_t(0)
    if sysctlbyname(name.encode(), None, ctypes.byref(size), None, 0) != 0 or not size.value:
        return None
    buffer = ctypes.create_string_buffer(size.value)
    if sysctlbyname(name.encode(), buffer, ctypes.byref(size), None, 0) != 0:
        return None
    return buffer.value.decode("utf-8", "replace")
