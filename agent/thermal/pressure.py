"""macOS thermal pressure without root: the notify API's `com.apple.system.thermalpressurelevel`
(angristan/MacThrottle MacThrottle/Services/ThermalPressureReader.swift; the levels of
OSThermalNotification.h: 0 Nominal, 1 Moderate, 2 Heavy, 3 Trapping, 4 Sleeping), the same
five levels `powermetrics --samplers thermal` prints as root.

Every macOS reading carries it (`WithPressure`), whatever source gives the degrees: a level the
policy can act on even where the degrees read low.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable
from ctypes import POINTER, c_char_p, c_int, c_uint32, c_uint64

from agent.sensors.base import SourceUnavailable
from agent.sensors.macos_libs import LIBSYSTEM, bind, load
from agent.thermal.base import OverSource, ThermalReading, ThermalSource

NOTIFY_NAME = b"com.apple.system.thermalpressurelevel"
LEVELS = ("Nominal", "Moderate", "Heavy", "Trapping", "Sleeping")
NOTIFY_STATUS_OK = 0


def pressure_level(state: int) -> str | None:
    """The level's name, as powermetrics prints it; None for a state macOS did not define."""
    return LEVELS[state] if 0 <= state < len(LEVELS) else None


class PressureReader:
    """A registered notify token; read() asks its state (a syscall, no process)."""

    def __init__(self) -> None:
        if sys.platform != "darwin":
            raise SourceUnavailable(
                f"thermal pressure comes from macOS's notify API; this is {sys.platform}"
            )
        libsystem = load(LIBSYSTEM, "pressure")
        register = bind(libsystem, "notify_register_check", c_uint32, c_char_p, POINTER(c_int))
        self._get_state = bind(libsystem, "notify_get_state", c_uint32, c_int, POINTER(c_uint64))
        self._cancel = bind(libsystem, "notify_cancel", c_uint32, c_int)
        token = c_int()
        status = register(NOTIFY_NAME, ctypes.byref(token))
        if status != NOTIFY_STATUS_OK:
            raise SourceUnavailable(f"pressure: notify_register_check failed with {status}")
        self._token: int | None = token.value

    def read(self) -> str | None:
        state = self.state()
        return None if state is None else pressure_level(state)

    def state(self) -> int | None:
        """The notify state as macOS gives it (0 Nominal ... 4 Sleeping): what a capture keeps."""
        if self._token is None:
            return None
        state = c_uint64()
        if self._get_state(self._token, ctypes.byref(state)) != NOTIFY_STATUS_OK:
            return None
        return state.value

    def close(self) -> None:
        if self._token is not None:
            self._cancel(self._token)
            self._token = None


class WithPressure(OverSource):
    """A source whose readings also carry the pressure level (when they have none of their
    own): same name, same readings otherwise."""

    def __init__(
        self,
        inner: ThermalSource,
        read_pressure: Callable[[], str | None],
        close_pressure: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(inner)
        self.pushed = inner.pushed
        self._read_pressure = read_pressure
        self._close_pressure = close_pressure

    def read(self) -> ThermalReading | None:
        reading = self.inner.read()
        self.last_error = self.inner.last_error
        if reading is None or reading.pressure is not None:
            return reading
        return ThermalReading(
            celsius=reading.celsius,
            source=reading.source,
            time=reading.time,
            sensors=reading.sensors,
            pressure=self._read_pressure(),
            simulated=reading.simulated,
            sensor=reading.sensor,
        )

    def close(self) -> None:
        self.inner.close()
        self._close_pressure()


def with_pressure(source: ThermalSource) -> ThermalSource:
    """`source` with the notify API's level on its readings; as it is where there is none."""
    try:
        reader = PressureReader()
    except SourceUnavailable:
        return source
    return WithPressure(source, reader.read, reader.close)
