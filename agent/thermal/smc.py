"""The SMC temperature on macOS, without root: the keys agent.thermal.smc_die names, read through
an SMC connection (agent.sensors.smc's AppleSMC live, a capture's keys when replayed) and
decoded by agent.sensors.smc_protocol."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Protocol

from agent.sensors.base import SourceUnavailable
from agent.sensors.macos_libs import apple_silicon
from agent.sensors.smc import AppleSMC, SMCError
from agent.sensors.smc_protocol import VALUE_TYPES, decode
from agent.thermal.base import ThermalReading, ThermalSource
from agent.thermal.iohid import HIDClient, live_hid
from agent.thermal.parsers import select_gpu_sensors
from agent.thermal.smc_die import NOT_COVERED, GpuWatch, choose_die, die_keys


class SMCKeys(Protocol):
    """What the source needs of an SMC: its key list and one key's (type, bytes)."""

    def keys(self) -> list[str]: ...

    def read(self, key: str) -> tuple[str, bytes]: ...

    def close(self) -> None: ...


def apple_smc() -> AppleSMC:
    """The live SMC of this Mac; SourceUnavailable off Apple Silicon macOS."""
    if sys.platform != "darwin":
        raise SourceUnavailable(
            f"smc reads the AppleSMC through IOKit and needs macOS; this is {sys.platform}"
        )
    if not apple_silicon():
        raise SourceUnavailable(
            "smc: an Intel Mac (its SMC keys name other things): use powermetrics"
        )
    return AppleSMC()


class HIDGpu:
    """The HID GPU sensors (agent.thermal.parsers.select_gpu_sensors), the smc source's
    fallback: the client is made at the first need, and one that cannot be made is None with
    `why` kept."""

    def __init__(self, client: Callable[[], HIDClient]) -> None:
        self._make = client
        self._hid: HIDClient | None = None
        self.why: str | None = None

    def read(self) -> dict[str, float]:
        if self._hid is None and self.why is None:
            try:
                self._hid = self._make()
            except SourceUnavailable as exc:
                self.why = str(exc)
        return select_gpu_sensors(self._hid.read()) if self._hid else {}

    def close(self) -> None:
        if self._hid is not None:
            self._hid.close()


class SMCSource(ThermalSource):
    """The hotter of the CPU die and the GPU (agent.thermal.smc_die), both in `sensors`. The
    GPU keys are used only while GpuWatch finds them live; else the HID GPU sensors stand in
    (`hid`: this Mac's, or a capture's), and the reading's `note` says which, or that the GPU
    is not covered. A key of a type no decoder knows is dropped at its first read and named in
    `skipped`."""

    name = scale = "smc"

    def __init__(
        self, smc: SMCKeys | None = None, hid: Callable[[], HIDClient] | None = None
    ) -> None:
        super().__init__()
        self._smc = smc or apple_smc()
        self._gpu = GpuWatch()
        self._hid_gpu = HIDGpu(hid or (live_hid if smc is None else _no_hid))
        self.skipped: dict[str, str] = {}
        try:
            every_key = self._smc.keys()
        except SMCError as exc:
            self._smc.close()
            raise SourceUnavailable(f"smc: cannot list the SMC's keys: {exc}") from exc
        self._keys = die_keys(every_key)
        if not self._keys:
            self._smc.close()
            raise SourceUnavailable(
                f"smc: none of the {len(every_key)} SMC keys is a die temperature "
                "(TCMz, TCMb, Tp*, Te*, Tg*): not Apple Silicon?"
            )

    def read(self) -> ThermalReading | None:
        values: dict[str, float | None] = {}
        for key in self._keys:
            try:
                data_type, raw = self._smc.read(key)
            except SMCError:
                values[key] = None
                continue
            if data_type not in VALUE_TYPES:
                self.skipped[key] = data_type
                continue
            values[key] = decode(data_type, raw)
        self._keys = [key for key in self._keys if key not in self.skipped]
        gpu = self._gpu.check(values)
        stand_in: dict[str, float] = {}
        note = None
        if gpu.problem is not None:
            stand_in = self._hid_gpu.read()
            note = (
                f"GPU from HID ({', '.join(stand_in)}): {gpu.problem}"
                if stand_in
                else f"{NOT_COVERED}: {gpu.problem}; acting on the CPU die alone"
            )
        usable = {gpu.key: gpu.celsius} if gpu.key and gpu.celsius is not None else {}
        choice = choose_die(values, usable or stand_in)
        if choice is None:
            shown = ", ".join(f"{key}={value}" for key, value in values.items())
            return self._fail(f"smc: no plausible die temperature: {shown}")
        return self._reading(choice.celsius, choice.sensors, sensor=choice.sensor, note=note)

    def close(self) -> None:
        self._smc.close()
        self._hid_gpu.close()


def _no_hid() -> HIDClient:
    raise SourceUnavailable("no HID sensors in this capture")
