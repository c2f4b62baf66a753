"""IOKit HID temperature sensors on macOS: no root, no extra tool (what macmon and Stats read).

A thin ctypes layer: it only lists (sensor name, °C) pairs. Which of them are the die, and which
one the policy acts on, is decided by the pure functions in agent.thermal.parsers.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from ctypes import c_bool, c_char_p, c_double, c_int, c_int32, c_int64, c_long, c_uint32, c_ulong
from typing import Protocol

from agent.sensors.base import SourceUnavailable
from agent.sensors.macos_libs import CORE_FOUNDATION, IOKIT, bind, load, variable
from agent.thermal.base import ThermalReading, ThermalSource
from agent.thermal.parsers import NoDieStreak, hottest, select_die_sensors

_UTF8 = 0x08000100  # kCFStringEncodingUTF8
_SINT32 = 3  # kCFNumberSInt32Type
_VENDOR_USAGE_PAGE = 0xFF00
_TEMPERATURE_USAGE = 5
_EVENT_TEMPERATURE = 15  # kIOHIDEventTypeTemperature
_TEMPERATURE_FIELD = _EVENT_TEMPERATURE << 16

_P = ctypes.c_void_p


class _HIDTemperatures:
    """The HID event-system client matched to temperature services, and how to read them."""

    def __init__(self) -> None:
        cf, iokit = load(CORE_FOUNDATION, "iohid"), load(IOKIT, "iohid")
        self._release = bind(cf, "CFRelease", None, _P)
        self._string = bind(cf, "CFStringCreateWithCString", _P, _P, c_char_p, c_uint32)
        self._string_value = bind(cf, "CFStringGetCString", c_bool, _P, c_char_p, c_long, c_uint32)
        self._type_id = bind(cf, "CFGetTypeID", c_ulong, _P)
        self._string_type_id = bind(cf, "CFStringGetTypeID", c_ulong)()
        number = bind(cf, "CFNumberCreate", _P, _P, c_long, _P)
        dictionary = bind(
            cf,
            "CFDictionaryCreate",
            _P,
            _P,
            ctypes.POINTER(_P),
            ctypes.POINTER(_P),
            c_long,
            _P,
            _P,
        )
        self._count = bind(cf, "CFArrayGetCount", c_long, _P)
        self._item = bind(cf, "CFArrayGetValueAtIndex", _P, _P, c_long)
        create_client = bind(iokit, "IOHIDEventSystemClientCreate", _P, _P)
        set_matching = bind(iokit, "IOHIDEventSystemClientSetMatching", c_int, _P, _P)
        copy_services = bind(iokit, "IOHIDEventSystemClientCopyServices", _P, _P)
        self._copy_property = bind(iokit, "IOHIDServiceClientCopyProperty", _P, _P, _P)
        self._copy_event = bind(
            iokit, "IOHIDServiceClientCopyEvent", _P, _P, c_int64, c_int32, c_int64
        )
        self._float_value = bind(iokit, "IOHIDEventGetFloatValue", c_double, _P, c_int32)

        callbacks = {
            kind: variable(_P, cf, f"kCFTypeDictionary{kind}CallBacks", "iohid")
            for kind in ("Key", "Value")
        }
        self._client = create_client(None)
        if not self._client:
            raise SourceUnavailable("iohid: IOHIDEventSystemClientCreate returned NULL")
        keys = (_P * 2)(self._cfstring("PrimaryUsagePage"), self._cfstring("PrimaryUsage"))
        page, usage = c_int32(_VENDOR_USAGE_PAGE), c_int32(_TEMPERATURE_USAGE)
        values = (_P * 2)(
            number(None, _SINT32, ctypes.addressof(page)),
            number(None, _SINT32, ctypes.addressof(usage)),
        )
        matching = dictionary(
            None,
            keys,
            values,
            2,
            ctypes.addressof(callbacks["Key"]),
            ctypes.addressof(callbacks["Value"]),
        )
        set_matching(self._client, matching)
        for ref in (*keys, *values, matching):
            if ref:
                self._release(ref)
        self._services = copy_services(self._client)
        product = self._cfstring("Product")
        self.sensors: list[tuple[int, str]] = []
        for index in range(self._count(self._services) if self._services else 0):
            service = self._item(self._services, index)
            name = self._property_string(service, product)
            if name:
                self.sensors.append((service, name))
        self._release(product)

    def _cfstring(self, text: str) -> int:
        return self._string(None, text.encode(), _UTF8)

    def _property_string(self, service: int, key: int) -> str | None:
        ref = self._copy_property(service, key)
        if not ref:
            return None
        try:
            if self._type_id(ref) != self._string_type_id:
                return None
            buffer = ctypes.create_string_buffer(256)
            ok = self._string_value(ref, buffer, len(buffer), _UTF8)
            return buffer.value.decode(errors="replace") if ok else None
        finally:
            self._release(ref)

    def read(self) -> list[tuple[str, float]]:
        """(name, °C) for every matched service that answers now; names may repeat."""
        pairs = []
        for service, name in self.sensors:
            event = self._copy_event(service, _EVENT_TEMPERATURE, 0, 0)
            if not event:
                continue
            try:
                pairs.append((name, self._float_value(event, _TEMPERATURE_FIELD)))
            finally:
                self._release(event)
        return pairs

    def close(self) -> None:
        for ref in (self._services, self._client):
            if ref:
                self._release(ref)
        self._services = self._client = None
        self.sensors = []


class HIDClient(Protocol):
    """What the source needs of a HID client: its sensors' names, and (name, °C) now."""

    sensors: list[tuple[int, str]]

    def read(self) -> list[tuple[str, float]]: ...

    def close(self) -> None: ...


def live_hid() -> HIDClient:
    if sys.platform != "darwin":
        raise SourceUnavailable(
            f"iohid reads IOKit HID sensors and needs macOS; this is {sys.platform}"
        )
    return _HIDTemperatures()


class IOHIDSource(ThermalSource):
    """Die sensors from IOKit HID; the hottest die is the temperature, every die in the reading.
    The client is made again after reads that found no die sensor (NoDieStreak). `client`
    makes one: this Mac's, unless a capture stands in for it."""

    name = scale = "iohid"

    def __init__(self, client: Callable[[], HIDClient] = live_hid) -> None:
        super().__init__()
        self._client = client
        self._hid = client()
        self._no_die = NoDieStreak()
        if not self._hid.sensors:
            self._hid.close()
            raise SourceUnavailable("iohid: no HID temperature services (an Intel Mac has none)")

    def read(self) -> ThermalReading | None:
        pairs = self._hid.read()
        dies = select_die_sensors(pairs)
        if self._no_die.rebuild_after(len(dies)):
            self._hid.close()
            self._hid = self._client()
            pairs = self._hid.read()
            dies = select_die_sensors(pairs)
        if not dies:
            names = ", ".join(sorted({name for name, _ in pairs})) or "none answered"
            return self._fail(f"iohid: no plausible die sensor among: {names}")
        return self._reading(hottest(dies), dies)

    def close(self) -> None:
        self._hid.close()
