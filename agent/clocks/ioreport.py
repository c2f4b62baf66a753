"""The clocks of an Apple Silicon Mac without root, as vladkens/macmon reads them: IOReport's
performance-state residencies (src_lib/sources.rs: `IOReportCopyChannelsInGroup`, merged and
subscribed; `IOReportCreateSamples` at each read; each channel's `IOReportStateGetCount`,
`IOReportStateGetNameForIndex`, `IOReportStateGetResidency`) and the DVFS tables of the `pmgr`
entry among the `AppleARMIODevice` services (`IORegistryEntryCreateCFProperties`). This is the
thin ctypes layer: the counters it reads are cumulative, and agent.clocks.decode turns two of
them into the interval's clocks, as it does for a capture's. Import-safe anywhere: nothing is
loaded until a source opens, and a missing library, symbol, service or channel makes it
unavailable with the reason, never an abort."""

from __future__ import annotations

import ctypes
import sys
from ctypes import POINTER, c_char_p, c_int, c_int32, c_int64, c_long, c_uint32, c_uint64, c_void_p
from typing import Any, Protocol

from agent.clocks.base import ClockSource
from agent.clocks.decode import (
    PMGR_KEYS,
    SUBSCRIBED,
    Channel,
    ClockTables,
    Residencies,
    clocks_between,
    ioreport_note,
    pmgr_tables,
)
from agent.sensors.base import SourceUnavailable
from agent.sensors.macos_libs import (
    CORE_FOUNDATION,
    IOKIT,
    apple_silicon,
    bind_or_unavailable,
    load,
    sysctl_text,
)
from shared.cooling.clocks import ClockReading

LIBIOREPORT = "/usr/lib/libIOReport.dylib"
SOURCE = "ioreport"
_UTF8 = 0x08000100  # kCFStringEncodingUTF8
_MAIN_PORT = 0  # kIOMainPortDefault


class StateReport(Protocol):
    """What the source needs: every subscribed channel's cumulative state residencies."""

    def sample(self) -> dict[Channel, Residencies]: ...

    def close(self) -> None: ...


class _CF:
    """The CoreFoundation calls both halves use."""

    def __init__(self) -> None:
        cf = load(CORE_FOUNDATION, SOURCE)
        self.release = bind_or_unavailable(cf, SOURCE, "CFRelease", None, c_void_p)
        self.string = bind_or_unavailable(
            cf, SOURCE, "CFStringCreateWithCString", c_void_p, c_void_p, c_char_p, c_uint32
        )
        self.text = bind_or_unavailable(
            cf, SOURCE, "CFStringGetCString", ctypes.c_bool, c_void_p, c_char_p, c_long, c_uint32
        )
        self.get = bind_or_unavailable(
            cf, SOURCE, "CFDictionaryGetValue", c_void_p, c_void_p, c_void_p
        )
        self.count = bind_or_unavailable(cf, SOURCE, "CFArrayGetCount", c_long, c_void_p)
        self.item = bind_or_unavailable(
            cf, SOURCE, "CFArrayGetValueAtIndex", c_void_p, c_void_p, c_long
        )
        self.type_of = bind_or_unavailable(cf, SOURCE, "CFGetTypeID", c_uint64, c_void_p)
        self.data_type = bind_or_unavailable(cf, SOURCE, "CFDataGetTypeID", c_uint64)
        self.data_length = bind_or_unavailable(cf, SOURCE, "CFDataGetLength", c_long, c_void_p)
        self.data_bytes = bind_or_unavailable(cf, SOURCE, "CFDataGetBytePtr", c_void_p, c_void_p)
        self.mutable_copy = bind_or_unavailable(
            cf, SOURCE, "CFDictionaryCreateMutableCopy", c_void_p, c_void_p, c_long, c_void_p
        )

    def cfstr(self, text: str) -> Any:
        return self.string(None, text.encode(), _UTF8)

    def str_of(self, ref: Any) -> str:
        if not ref:
            return ""
        buffer = ctypes.create_string_buffer(256)
        return buffer.value.decode("utf-8") if self.text(ref, buffer, 256, _UTF8) else ""

    def data_of(self, ref: Any) -> bytes | None:
        """A CFData's bytes; None for a value of any other type."""
        if not ref or self.type_of(ref) != self.data_type():
            return None
        length = self.data_length(ref)
        return ctypes.string_at(self.data_bytes(ref), length) if length > 0 else b""


class _LiveStates:
    """One subscription to SUBSCRIBED's channels; released on close."""

    def __init__(self) -> None:
        self._cf = cf = _CF()
        lib = load(LIBIOREPORT, SOURCE)
        copy_group = bind_or_unavailable(
            lib, SOURCE, "IOReportCopyChannelsInGroup", c_void_p, c_void_p, c_void_p, c_uint64,
            c_uint64, c_uint64,
        )  # fmt: skip
        merge = bind_or_unavailable(
            lib, SOURCE, "IOReportMergeChannels", None, c_void_p, c_void_p, c_void_p
        )
        subscribe = bind_or_unavailable(
            lib, SOURCE, "IOReportCreateSubscription", c_void_p, c_void_p, c_void_p,
            POINTER(c_void_p), c_uint64, c_void_p,
        )  # fmt: skip
        self._samples = bind_or_unavailable(
            lib, SOURCE, "IOReportCreateSamples", c_void_p, c_void_p, c_void_p, c_void_p
        )
        self._group = bind_or_unavailable(
            lib, SOURCE, "IOReportChannelGetGroup", c_void_p, c_void_p
        )
        self._subgroup = bind_or_unavailable(
            lib, SOURCE, "IOReportChannelGetSubGroup", c_void_p, c_void_p
        )
        self._name = bind_or_unavailable(
            lib, SOURCE, "IOReportChannelGetChannelName", c_void_p, c_void_p
        )
        self._state_count = bind_or_unavailable(
            lib, SOURCE, "IOReportStateGetCount", c_int32, c_void_p
        )
        self._state_name = bind_or_unavailable(
            lib, SOURCE, "IOReportStateGetNameForIndex", c_void_p, c_void_p, c_int32
        )
        self._residency = bind_or_unavailable(
            lib, SOURCE, "IOReportStateGetResidency", c_int64, c_void_p, c_int32
        )
        self._key = cf.cfstr("IOReportChannels")
        self._channels: Any = None
        self._subscription: Any = None
        found = []
        for group, subgroup in SUBSCRIBED:
            group_ref, subgroup_ref = cf.cfstr(group), cf.cfstr(subgroup)
            channels = copy_group(group_ref, subgroup_ref, 0, 0, 0)
            cf.release(group_ref)
            cf.release(subgroup_ref)
            if channels:
                found.append(channels)
        if not found:
            self.close()
            raise SourceUnavailable(
                f"{SOURCE}: no channel in IOReport's {', '.join(g for g, _ in SUBSCRIBED)} groups"
            )
        for more in found[1:]:
            merge(found[0], more, None)
            cf.release(more)
        self._channels = cf.mutable_copy(None, 0, found[0])
        cf.release(found[0])
        out = c_void_p()
        self._subscription = subscribe(None, self._channels, ctypes.byref(out), 0, None)
        if not self._subscription:
            self.close()
            raise SourceUnavailable(f"{SOURCE}: IOReportCreateSubscription failed")

    def sample(self) -> dict[Channel, Residencies]:
        cf = self._cf
        samples = self._samples(self._subscription, self._channels, None)
        if not samples:
            raise OSError("IOReportCreateSamples gave nothing")
        try:
            array = cf.get(samples, self._key)
            found: dict[Channel, Residencies] = {}
            for index in range(cf.count(array) if array else 0):
                item = cf.item(array, index)
                channel = (
                    cf.str_of(self._group(item)),
                    cf.str_of(self._subgroup(item)),
                    cf.str_of(self._name(item)),
                )
                found[channel] = [
                    (cf.str_of(self._state_name(item, state)) or f"S{state}",
                     int(self._residency(item, state)))
                    for state in range(self._state_count(item))
                ]  # fmt: skip
            return found
        finally:
            cf.release(samples)

    def close(self) -> None:
        for attribute in ("_subscription", "_channels", "_key"):
            ref = getattr(self, attribute, None)
            if ref:
                self._cf.release(ref)
            setattr(self, attribute, None)


def read_pmgr() -> dict[str, bytes]:
    """The `pmgr` entry's DVFS properties (PMGR_KEYS it has) as bytes (macmon
    `load_soc_info`); SourceUnavailable when there is no such entry."""
    cf = _CF()
    iokit = load(IOKIT, SOURCE)
    matching = bind_or_unavailable(iokit, SOURCE, "IOServiceMatching", c_void_p, c_char_p)
    get_services = bind_or_unavailable(
        iokit, SOURCE, "IOServiceGetMatchingServices", c_int, c_uint32, c_void_p, POINTER(c_uint32)
    )
    next_entry = bind_or_unavailable(iokit, SOURCE, "IOIteratorNext", c_uint32, c_uint32)
    entry_name = bind_or_unavailable(
        iokit, SOURCE, "IORegistryEntryGetName", c_int, c_uint32, c_char_p
    )
    properties_of = bind_or_unavailable(
        iokit, SOURCE, "IORegistryEntryCreateCFProperties", c_int, c_uint32, POINTER(c_void_p),
        c_void_p, c_uint32,
    )  # fmt: skip
    release_object = bind_or_unavailable(iokit, SOURCE, "IOObjectRelease", c_int, c_uint32)
    iterator = c_uint32()
    if get_services(_MAIN_PORT, matching(b"AppleARMIODevice"), ctypes.byref(iterator)) != 0:
        raise SourceUnavailable(f"{SOURCE}: no AppleARMIODevice service")
    found: dict[str, bytes] | None = None
    try:
        while entry := next_entry(iterator.value):
            name = ctypes.create_string_buffer(128)
            entry_name(entry, name)
            if name.value == b"pmgr" and found is None:
                props = c_void_p()
                if properties_of(entry, ctypes.byref(props), None, 0) == 0 and props.value:
                    found = {}
                    for key in PMGR_KEYS:
                        key_ref = cf.cfstr(key)
                        blob = cf.data_of(cf.get(props, key_ref))
                        cf.release(key_ref)
                        if blob is not None:
                            found[key] = blob
                    cf.release(props)
            release_object(entry)
    finally:
        release_object(iterator.value)
    if found is None:
        raise SourceUnavailable(f"{SOURCE}: no readable pmgr entry among AppleARMIODevice")
    return found


def live_states() -> _LiveStates:
    if sys.platform != "darwin":
        raise SourceUnavailable(f"{SOURCE} clocks need macOS (libIOReport); this is {sys.platform}")
    if not apple_silicon():
        raise SourceUnavailable(f"{SOURCE}: an Intel Mac has no DVFS residency channels")
    return _LiveStates()


class IOReportClockSource(ClockSource):
    """The clocks over each interval between two reads: the residency counters' difference,
    weighted by the DVFS tables (agent.clocks.decode)."""

    name = SOURCE
    counts_intervals = True

    def __init__(
        self,
        states: StateReport | None = None,
        properties: dict[str, bytes] | None = None,
        chip: str | None = None,
    ) -> None:
        """`states`, `properties`, `chip`: a capture's; else this Mac's."""
        super().__init__()
        if states is None:
            states = live_states()
            try:
                properties = read_pmgr()
                chip = sysctl_text("machdep.cpu.brand_string")
            except SourceUnavailable:
                states.close()
                raise
        self._states = states
        self.tables: ClockTables = pmgr_tables(properties or {})
        self.chip = chip or ""
        self.note = ioreport_note(self.chip)
        if self.tables.gpu is None and self.tables.cpu_p is None and self.tables.cpu_e is None:
            states.close()
            raise SourceUnavailable(f"{SOURCE}: " + "; ".join(self.tables.problems))
        self._previous = self._sample()

    def _sample(self) -> dict[Channel, Residencies] | None:
        try:
            return self._states.sample()
        except OSError as exc:
            self.last_error = f"{SOURCE}: {exc}"
            return None

    def read(self) -> ClockReading | None:
        previous, now = self._previous, self._sample()
        self._previous = now
        if now is None:
            return None
        if previous is None:
            return self._fail(f"{SOURCE}: no earlier sample to count from yet")
        return self._from_clocks(clocks_between(previous, now, self.tables), SOURCE)

    def close(self) -> None:
        self._states.close()
