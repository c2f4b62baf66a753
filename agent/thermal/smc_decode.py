"""AppleSMC's request struct, its value types and which key is the die: pure, so the tests feed
it captured bytes and the ctypes shell (agent.thermal.smc) only moves structs.

The struct and commands follow context-labs/mactop internal/app/smc.h + smc.c and vladkens/macmon
src/sources.rs (`KeyData`, 80 bytes): `IOConnectCallStructMethod(conn, 2, ...)` with data8 = 9
(key info: size and type) then 5 (read the bytes); 8 reads the key at an index, `#KEY` holds the
key count. A result byte of 132 means "no such key" (macmon).

Value types (mactop SMCGetFloatValue, Stats and iSMC's decoders; byte layouts agree across them):
`flt ` float32 little-endian (Apple Silicon), `sp78` signed 16-bit big-endian / 256, `fpe2`
unsigned 16-bit big-endian / 4, `ioft` unsigned 64-bit little-endian / 65536 (48.16 fixed).

Which key is the die: `TCMz` (die maximum) and `TCMb` (die average) exist on every Apple Silicon
chip in the iSMC data set and stay live at idle, where per-core keys park at placeholder values
such as 6.7 or 4.633 °C (oshi/oshi#3535 on an M2 Max; macmon#12 saw 9.8). Without them, the
hottest plausible (>= 20 °C, oshi#3531) per-cluster key: `Tp*` (P-cores), `Te*` (E-cores),
`Tg*` (GPU).
"""

from __future__ import annotations

import ctypes
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeGuard

SELECTOR = 2
"""IOConnectCallStructMethod selector of the SMC user client (KERNEL_INDEX_SMC)."""
READ_BYTES = 5
READ_INDEX = 8
READ_KEY_INFO = 9
KEY_NOT_FOUND = 132
KEY_COUNT = "#KEY"

DIE_MAX, DIE_AVERAGE = "TCMz", "TCMb"
CLUSTER_PREFIXES = ("Tp", "Te", "Tg")
SMC_MIN_C = 20.0
"""Below this an SMC temperature key is a parked placeholder, not a die: across iSMC's dumps of
13 machines (M1 to M5, A18) every Tp*/Tg* reading was either <= 5.2 (sentinels -4, 0, 2.5, 4,
5.2) or >= 21.0 (oshi/oshi#3531, which set this floor); an idle M2 Max parks keys at 6.7 and
4.633 (oshi#3535), macmon#12 saw 9.8."""
SMC_MAX_C = 150.0


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
        return struct.unpack("<Q", raw[:8])[0] / 65536.0
    return None


def plausible_die(celsius: float | None) -> TypeGuard[float]:
    return celsius is not None and math.isfinite(celsius) and SMC_MIN_C < celsius <= SMC_MAX_C


def die_keys(keys: list[str]) -> list[str]:
    """The keys worth reading each poll: the die keys when the chip has them, else every
    per-cluster temperature key."""
    dies = [key for key in (DIE_MAX, DIE_AVERAGE) if key in keys]
    return dies or [key for key in keys if key.startswith(CLUSTER_PREFIXES)]


@dataclass(frozen=True)
class DieChoice:
    sensor: str
    celsius: float
    sensors: dict[str, float]


def choose_die(values: Mapping[str, float | None]) -> DieChoice | None:
    """TCMz when it reads plausibly (TCMb beside it), else TCMb, else the hottest plausible
    Tp*/Te*/Tg* key; None when nothing plausible was read."""
    kept = {key: value for key, value in values.items() if plausible_die(value)}
    for key in (DIE_MAX, DIE_AVERAGE):
        if key in kept:
            dies = {name: kept[name] for name in (DIE_MAX, DIE_AVERAGE) if name in kept}
            return DieChoice(key, kept[key], dies)
    clusters = {key: value for key, value in kept.items() if key.startswith(CLUSTER_PREFIXES)}
    if not clusters:
        return None
    hottest = max(clusters, key=lambda key: clusters[key])
    return DieChoice(hottest, clusters[hottest], clusters)
