"""Energy per rail on Apple Silicon, without root: IOReport's "Energy Model" channels through
/usr/lib/libIOReport.dylib (ctypes).

The calls follow the tools that read it daily (mac-desk-check.md): vladkens/macmon
src_lib/sources.rs (src/sources.rs before v0.8.1; up to v0.7 it asks per group, v0.8 copies every
channel and keeps the group's), context-labs/mactop internal/app/ioreport, and
ml-energy/zeus-apple-silicon apple_energy/apple_energy.hpp: `IOReportCopyChannelsInGroup("Energy
Model", NULL, 0, 0, 0)`, a mutable copy of it, `IOReportCreateSubscription(NULL, copy, &out, 0,
NULL)`, `IOReportCreateSamples` at each read and `IOReportCreateSamplesDelta(previous, now,
NULL)`, whose `IOReportChannels` array holds one dictionary per channel: its name
(`IOReportChannelGetChannelName`), its unit (`IOReportChannelGetUnitLabel`: mJ, uJ or nJ, read
and trimmed every time) and its value (`IOReportSimpleGetIntegerValue(item, 0)`). Which channel
is which rail, and the unit arithmetic, are agent.power.decode's pure functions.

The counters are the energy model's estimates and are published in batches: the mJ channels
about every 1.7 to 2.2 s on an M1 Ultra and an M5 Max (lablup/all-smi#410, #424), `GPU Energy`
(nJ) about every 120 ms; hence RESOLUTION_S.
"""

from __future__ import annotations

import ctypes
import sys
import time
from ctypes import c_bool, c_char_p, c_int32, c_int64, c_long, c_uint32, c_uint64, c_void_p
from typing import Any, Protocol

from agent.power.base import Integrator, PowerReading, PowerSource
from agent.power.decode import ioreport_energy, ioreport_rails
from agent.sensors.base import SourceUnavailable
from agent.sensors.macos_libs import CORE_FOUNDATION, apple_silicon, bind, load

LIBIOREPORT = "/usr/lib/libIOReport.dylib"
GROUPS = (b"Energy Model", b"PMP")
"""Where the energy channels are: "Energy Model"; a base M1 may keep them under "PMP"
(mac-desk-check.md)."""
RESOLUTION_S = 2.3
"""The slowest publication interval seen (all-smi#410: 2.03-2.23 s on an M5 Max): a window
shorter than this may hold no update of the mJ rails, or one that covers more than the window."""
_UTF8 = 0x08000100  # kCFStringEncodingUTF8
_CHANNELS = b"IOReportChannels"


class _IOReport:
    """One subscription to the energy channels and the previous sample, released on close."""

    def __init__(self) -> None:
        cf = load(CORE_FOUNDATION, "ioreport")
        lib = load(LIBIOREPORT, "ioreport")
        self._release = bind(cf, "CFRelease", None, c_void_p)
        self._string = bind(cf, "CFStringCreateWithCString", c_void_p, c_void_p, c_char_p, c_uint32)
        self._text = bind(cf, "CFStringGetCString", c_bool, c_void_p, c_char_p, c_long, c_uint32)
        self._get = bind(cf, "CFDictionaryGetValue", c_void_p, c_void_p, c_void_p)
        self._count = bind(cf, "CFArrayGetCount", c_long, c_void_p)
        self._item = bind(cf, "CFArrayGetValueAtIndex", c_void_p, c_void_p, c_long)
        mutable_copy = bind(
            cf, "CFDictionaryCreateMutableCopy", c_void_p, c_void_p, c_long, c_void_p
        )
        copy_group = bind(
            lib, "IOReportCopyChannelsInGroup", c_void_p, c_void_p, c_void_p, c_uint64, c_uint64,
            c_uint64,
        )  # fmt: skip
        subscribe = bind(
            lib, "IOReportCreateSubscription", c_void_p, c_void_p, c_void_p,
            ctypes.POINTER(c_void_p), c_uint64, c_void_p,
        )  # fmt: skip
        self._samples = bind(lib, "IOReportCreateSamples", c_void_p, c_void_p, c_void_p, c_void_p)
        self._delta = bind(
            lib, "IOReportCreateSamplesDelta", c_void_p, c_void_p, c_void_p, c_void_p
        )
        self._channel_name = bind(lib, "IOReportChannelGetChannelName", c_void_p, c_void_p)
        self._unit = bind(lib, "IOReportChannelGetUnitLabel", c_void_p, c_void_p)
        self._value = bind(lib, "IOReportSimpleGetIntegerValue", c_int64, c_void_p, c_int32)
        self._key = self._string(None, _CHANNELS, _UTF8)
        self._channels: Any = None
        self._subscription: Any = None
        self._previous: Any = None
        self.names: list[str] = []
        self.group = ""
        """The IOReport group the channels are in (what a capture records beside them)."""
        for group in GROUPS:
            name = self._string(None, group, _UTF8)
            found = copy_group(name, None, 0, 0, 0)
            self._release(name)
            if not found:
                continue
            names = self._names(found)
            if ioreport_rails(names):
                self._channels = mutable_copy(None, 0, found)
                self._release(found)
                self.names = names
                self.group = group.decode() if isinstance(group, bytes) else str(group)
                break
            self._release(found)
        if self._channels is None:
            self.close()
            raise SourceUnavailable(
                "ioreport: no CPU/GPU/ANE/DRAM channel in IOReport's Energy Model or PMP group"
            )
        out = c_void_p()
        self._subscription = subscribe(None, self._channels, ctypes.byref(out), 0, None)
        if not self._subscription:
            self.close()
            raise SourceUnavailable("ioreport: IOReportCreateSubscription failed")
        self._previous = self._samples(self._subscription, self._channels, None)
        if not self._previous:
            self.close()
            raise SourceUnavailable("ioreport: IOReportCreateSamples gave nothing")

    def _str(self, ref: Any) -> str:
        if not ref:
            return ""
        buffer = ctypes.create_string_buffer(256)
        return buffer.value.decode("utf-8") if self._text(ref, buffer, 256, _UTF8) else ""

    def _items(self, dictionary: Any) -> list[Any]:
        array = self._get(dictionary, self._key)
        if not array:
            return []
        return [self._item(array, index) for index in range(self._count(array))]

    def _names(self, dictionary: Any) -> list[str]:
        return [self._str(self._channel_name(item)) for item in self._items(dictionary)]

    def delta(self) -> list[tuple[str, str, int]]:
        """(name, unit, value) of every channel since the previous call (or the subscription)."""
        now = self._samples(self._subscription, self._channels, None)
        if not now:
            raise OSError("IOReportCreateSamples gave nothing")
        delta = self._delta(self._previous, now, None)
        self._release(self._previous)
        self._previous = now
        if not delta:
            raise OSError("IOReportCreateSamplesDelta gave nothing")
        try:
            return [
                (
                    self._str(self._channel_name(item)),
                    self._str(self._unit(item)),
                    int(self._value(item, 0)),
                )
                for item in self._items(delta)
            ]
        finally:
            self._release(delta)

    def close(self) -> None:
        for attribute in ("_previous", "_subscription", "_channels", "_key"):
            ref = getattr(self, attribute, None)
            if ref:
                self._release(ref)
            setattr(self, attribute, None)


class EnergyReport(Protocol):
    """What the source needs of IOReport: the channels' names, and each one's delta since the
    previous call as (name, unit, value)."""

    names: list[str]

    def delta(self) -> list[tuple[str, str, int]]: ...

    def close(self) -> None: ...


def live_report() -> _IOReport:
    if sys.platform != "darwin":
        raise SourceUnavailable(f"ioreport needs macOS (libIOReport); this is {sys.platform}")
    if not apple_silicon():
        raise SourceUnavailable("ioreport: an Intel Mac has no Energy Model channels")
    return _IOReport()


class IOReportSource(PowerSource):
    """Cumulative joules of the cpu, gpu, ane and dram rails from IOReport's deltas."""

    name = "ioreport"
    resolution_s = RESOLUTION_S

    def __init__(self, report: EnergyReport | None = None) -> None:
        """`report`: the Energy Model channels to read (a capture's); else this Mac's."""
        super().__init__()
        self._report = report or live_report()
        self.rails = ioreport_rails(self._report.names)
        self._energy = Integrator()
        self._last = time.monotonic()

    def read(self) -> PowerReading | None:
        try:
            channels = self._report.delta()
        except OSError as exc:
            return self._fail(f"ioreport: {exc}")
        now = time.monotonic()
        counted = ioreport_energy(channels)
        self._energy.add(counted.joules, now - self._last)
        self._last = now
        if counted.problems:
            self.last_error = "ioreport: " + "; ".join(counted.problems)
            joules, watts = dict(self._energy.joules), dict(self._energy.watts)
            return PowerReading(joules, watts, self.name, monotonic=now)
        return self._reading(self._energy.joules, self._energy.watts, at=now)

    def close(self) -> None:
        self._report.close()
