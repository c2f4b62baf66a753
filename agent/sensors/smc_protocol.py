"""AppleSMC's request struct and its value types: pure, so the tests feed it captured bytes and
the ctypes shell (agent.sensors.smc) only moves structs.

The struct and commands follow context-labs/mactop internal/app/smc.h + smc.c and vladkens/macmon
src/sources.rs (`KeyData`, 80 bytes): `IOConnectCallStructMethod(conn, 2, ...)` with data8 = 9
(key info: size and type) then 5 (read the bytes); 8 reads the key at an index, `#KEY` holds the
key count. A result byte of 132 means "no such key" (macmon).

Value types (mactop SMCGetFloatValue, Stats and iSMC's decoders; byte layouts agree across them):
`flt ` float32 little-endian (Apple Silicon), `sp78` signed 16-bit big-endian / 256, `fpe2`
unsigned 16-bit big-endian / 4, `ioft` signed 64-bit little-endian / 65536 (48.16 fixed; iSMC
reads it signed, and M4 reports hold `TR1d` bytes ending `ff ff ff` that are -21.69 so and
2.8e14 unsigned: tests/fixtures/captures/ismc-m4-5.jsonl).
"""

from __future__ import annotations

import ctypes
import struct

SELECTOR = 2
"""IOConnectCallStructMethod selector of the SMC user client (KERNEL_INDEX_SMC)."""
READ_BYTES = 5
READ_INDEX = 8
READ_KEY_INFO = 9
KEY_NOT_FOUND = 132
KEY_COUNT = "#KEY"


class KeyDataVers(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint8),
        ("minor", ctypes.c_uint8),
        ("build", ctypes.c_uint8),
        ("reserved", ctypes.c_uint8),
        ("release", ctypes.c_uint16),
    ]


class KeyDataPLimit(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint16),
        ("length", ctypes.c_uint16),
        ("cpu_p_limit", ctypes.c_uint32),
        ("gpu_p_limit", ctypes.c_uint32),
        ("mem_p_limit", ctypes.c_uint32),
    ]


class KeyInfo(ctypes.Structure):
    _fields_ = [
        ("data_size", ctypes.c_uint32),
        ("data_type", ctypes.c_uint32),
        ("data_attributes", ctypes.c_uint8),
    ]


class KeyData(ctypes.Structure):
    """SMCKeyData_t: what goes in and comes out of every SMC call (80 bytes, C layout)."""

    _fields_ = [
        ("key", ctypes.c_uint32),
        ("vers", KeyDataVers),
        ("p_limit_data", KeyDataPLimit),
        ("key_info", KeyInfo),
        ("result", ctypes.c_uint8),
        ("status", ctypes.c_uint8),
        ("data8", ctypes.c_uint8),
        ("data32", ctypes.c_uint32),
        ("bytes", ctypes.c_uint8 * 32),
    ]


def fourcc(text: str) -> int:
    """A 4-character key or type as the SMC's big-endian integer (`TCMz` -> 0x54434D7A)."""
    if len(text) != 4:
        raise ValueError(f"SMC keys and types are 4 characters, got {text!r}")
    return int.from_bytes(text.encode("ascii"), "big")


def fourcc_text(value: int) -> str:
    return value.to_bytes(4, "big").decode("ascii", errors="replace")


def key_info_request(key: str) -> KeyData:
    request = KeyData()
    request.key = fourcc(key)
    request.data8 = READ_KEY_INFO
    return request


def read_request(key: str, info: KeyInfo) -> KeyData:
    request = KeyData()
    request.key = fourcc(key)
    request.key_info.data_size = info.data_size
    request.key_info.data_type = info.data_type
    request.data8 = READ_BYTES
    return request


def index_request(index: int) -> KeyData:
    request = KeyData()
    request.data8 = READ_INDEX
    request.data32 = index
    return request


def value_bytes(answer: KeyData, size: int) -> bytes:
    return bytes(answer.bytes)[:size]


VALUE_TYPES = ("flt ", "sp78", "fpe2", "ioft")
"""The types decode() knows; a key of any other type is not a temperature we can read."""


def decode(data_type: str, raw: bytes) -> float | None:
    """A value of one of the numeric types temperatures come in; None for any other type (or
    too few bytes), never a guess."""
    if data_type == "flt " and len(raw) >= 4:
        return struct.unpack("<f", raw[:4])[0]
    if data_type == "sp78" and len(raw) >= 2:
        return struct.unpack(">h", raw[:2])[0] / 256.0
    if data_type == "fpe2" and len(raw) >= 2:
        return struct.unpack(">H", raw[:2])[0] / 4.0
    if data_type == "ioft" and len(raw) >= 8:
        return struct.unpack("<q", raw[:8])[0] / 65536.0
    return None
