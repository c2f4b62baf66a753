"""A symbol a macOS lacks (a private IOKit, IOReport or SMC call renamed or gone in an update)
is the source being unavailable, never an AttributeError or ValueError out of ctypes: shown
with this machine's real C library, where those macOS symbols are as missing as on a Mac that
dropped them."""

from __future__ import annotations

import ctypes

import pytest

from agent.sensors.base import SourceUnavailable
from agent.sensors.macos_libs import bind, bind_or_unavailable, variable

LIBC = ctypes.CDLL(None)


def test_a_missing_function_is_source_unavailable_naming_it() -> None:
    with pytest.raises(SourceUnavailable, match="^source unavailable: IOReportCopyAllChannels "):
        bind(LIBC, "IOReportCopyAllChannels", ctypes.c_void_p, ctypes.c_uint64)
    with pytest.raises(SourceUnavailable, match="^smc: source unavailable: IOConnectCall"):
        bind_or_unavailable(LIBC, "smc", "IOConnectCallStructMethod", ctypes.c_int)


def test_a_missing_global_is_source_unavailable_naming_it() -> None:
    with pytest.raises(SourceUnavailable, match="^iohid: source unavailable: kCFTypeDict"):
        variable(ctypes.c_void_p, LIBC, "kCFTypeDictionaryKeyCallBacks", "iohid")


def test_a_present_symbol_binds_and_works() -> None:
    strlen = bind(LIBC, "strlen", ctypes.c_size_t, ctypes.c_char_p)
    assert strlen(b"mlx-fleet") == 9
