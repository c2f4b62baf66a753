"""The AppleSMC user client over IOKit (ctypes): keys listed and read by name, no root. Both the
thermal source and the power meter read through it.

A thin layer moving 80-byte KeyData structs (agent.sensors.smc_protocol builds and reads them and
decodes values). The service is the `AppleSMCKeysEndpoint` entry among `AppleSMC` matches where
there is one (vladkens/macmon src/sources.rs `SMC::new`), else the first (context-labs/mactop
internal/app/smc.c `SMCOpen`); `IOServiceOpen` on it needs no root.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_uint32, c_void_p

from agent.sensors.base import SourceUnavailable
from agent.sensors.macos_libs import IOKIT, LIBSYSTEM, bind, load, variable
from agent.sensors.smc_protocol import (
    KEY_COUNT,
    KEY_NOT_FOUND,
    SELECTOR,
    KeyData,
    KeyInfo,
    fourcc_text,
    index_request,
    key_info_request,
    read_request,
    value_bytes,
)

_MAIN_PORT = 0  # kIOMainPortDefault


_KEYS_ENDPOINT = b"AppleSMCKeysEndpoint"


class SMCError(RuntimeError):
    """One SMC call that failed (no such key, or the user client refused)."""


class AppleSMC:
    """An open connection to the SMC and its key reads (key info cached: it never changes)."""

    def __init__(self) -> None:
        iokit = load(IOKIT, "smc")
        libsystem = load(LIBSYSTEM, "smc")
        matching = bind(iokit, "IOServiceMatching", c_void_p, c_char_p)
        get_services = bind(
            iokit, "IOServiceGetMatchingServices", c_int, c_uint32, c_void_p, POINTER(c_uint32)
        )
        next_entry = bind(iokit, "IOIteratorNext", c_uint32, c_uint32)
        entry_name = bind(iokit, "IORegistryEntryGetName", c_int, c_uint32, c_char_p)
        service_open = bind(
            iokit, "IOServiceOpen", c_int, c_uint32, c_uint32, c_uint32, POINTER(c_uint32)
        )
        self._release = bind(iokit, "IOObjectRelease", c_int, c_uint32)
        self._close = bind(iokit, "IOServiceClose", c_int, c_uint32)
        self._call = bind(
            iokit,
            "IOConnectCallStructMethod",
            c_int,
            c_uint32,
            c_uint32,
            c_void_p,
            c_size_t,
            c_void_p,
            POINTER(c_size_t),
        )
        task = variable(c_uint32, libsystem, "mach_task_self_", "smc").value  # mach_task_self()
        iterator = c_uint32()
        if get_services(_MAIN_PORT, matching(b"AppleSMC"), ctypes.byref(iterator)) != 0:
            raise SourceUnavailable("smc: no AppleSMC service")
        chosen = 0
        while entry := next_entry(iterator.value):
            name = ctypes.create_string_buffer(128)
            entry_name(entry, name)
            if not chosen or name.value == _KEYS_ENDPOINT:
                if chosen:
                    self._release(chosen)
                chosen = entry
            else:
                self._release(entry)
        self._release(iterator.value)
        if not chosen:
            raise SourceUnavailable("smc: no AppleSMC service")
        connection = c_uint32()
        status = service_open(chosen, task, 0, ctypes.byref(connection))
        self._release(chosen)
        if status != 0:
            raise SourceUnavailable(f"smc: IOServiceOpen(AppleSMC) failed with 0x{status:x}")
        self._connection: int | None = connection.value
        self._info: dict[str, KeyInfo] = {}

    def _send(self, request: KeyData) -> KeyData:
        if self._connection is None:
            raise SMCError("closed")
        answer = KeyData()
        size = c_size_t(ctypes.sizeof(KeyData))
        status = self._call(
            self._connection,
            SELECTOR,
            ctypes.byref(request),
            ctypes.sizeof(KeyData),
            ctypes.byref(answer),
            ctypes.byref(size),
        )
        if status != 0:
            raise SMCError(f"IOConnectCallStructMethod returned 0x{status & 0xFFFFFFFF:x}")
        if answer.result == KEY_NOT_FOUND:
            raise SMCError("no such key")
        if answer.result != 0:
            raise SMCError(f"SMC result {answer.result}")
        return answer

    def read(self, key: str) -> tuple[str, bytes]:
        """(data type, value bytes) of one key: key info (9), then the bytes (5)."""
        info = self._info.get(key)
        if info is None:
            info = self._info[key] = self._send(key_info_request(key)).key_info
        answer = self._send(read_request(key, info))
        return fourcc_text(info.data_type), value_bytes(answer, info.data_size)

    def keys(self) -> list[str]:
        """Every key the SMC has (`#KEY` is their count, big-endian)."""
        _, raw = self.read(KEY_COUNT)
        found = []
        for index in range(int.from_bytes(raw[:4], "big")):
            try:
                found.append(fourcc_text(self._send(index_request(index)).key))
            except SMCError:
                continue
        return found

    def close(self) -> None:
        if self._connection is not None:
            self._close(self._connection)
            self._connection = None
