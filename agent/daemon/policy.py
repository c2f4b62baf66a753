"""The policy the daemon enforces: the thresholds a coordinator set (policy.set), over this
Mac's calibration (`agent calibrate`, calibration.json) made with the thermal source read, else
the defaults for the source's scale; the thresholds kept in policy.json so that a restart
enforces what was pushed. Its own module because how the policy in force is made and kept is
one thing, and what the telemetry hub does with it (judge each reading, announce a change,
agent.daemon.hub) another."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.cooling.calibration_file import calibration_stamp, load_calibration
from agent.cooling.policy_file import load_policy, policy_path, save_policy
from agent.daemon.history import TelemetryHistory, throttle_polls
from agent.daemon.storage import POLICY, StorageHealth
from agent.thermal.base import ThermalSource
from shared.cooling.calibration import (
    SET_BY_COORDINATOR,
    PolicyInForce,
    calibrated_defaults,
    merged_changes,
    policy_event_detail,
    with_given,
)
from shared.cooling.policy import ThermalPolicy, check_changes, given_numbers
from shared.cooling.throttle_point import ThrottlePoint, passive_onsets, stale_note
from shared.wire.telemetry import Event

log = logging.getLogger("agent.hub")  # the name its log lines have always carried


class SavedPolicy:
    """policy.json (the thresholds a coordinator set), written whenever they change; one the
    disk refused is reported and written again at the next retry(): the policy is enforced all
    the same."""

    def __init__(self, storage: StorageHealth, path: Path | None = None) -> None:
        self.storage = storage
        self.path = path or policy_path()
        self._unsaved: dict[str, float | None] | None = None

    def save(self, given: Mapping[str, float]) -> None:
        self._unsaved = dict(given)
        self.retry()

    def retry(self) -> None:
        if self._unsaved is None:
            return
        try:
            save_policy(self._unsaved, self.path)
        except OSError as exc:
            self.storage.failed(POLICY, self.path, exc)
            return
        self._unsaved = None
        self.storage.written(POLICY)


class EnforcedPolicy:
    """The policy in force and where its numbers came from; the saved thresholds are read at
    construction, and the source and its scale are known once the daemon opens it (on_scale),
    when the calibration is read."""

    def __init__(self, storage: StorageHealth) -> None:
        self._given = load_policy() or {}
        """The thresholds a coordinator set: the rest are the defaults under them."""
        self._scale: str | None = None
        self._source: str | None = None
        self._stamp = calibration_stamp()
        self._calibrated: ThrottlePoint | None = None
        """This Mac's calibration, when made with the source read."""
        self._seen: list[float] = []
        """Where throttling began in ordinary work since the calibration (passive_onsets)."""
        self._throttling = False
        self._defaults = calibrated_defaults(None, None, None)
        self.in_force = self._resolve(loud=False)  # on_scale() knows the scale, and says
        self.saved = SavedPolicy(storage)

    @property
    def policy(self) -> ThermalPolicy:
        return self.in_force.policy

    @property
    def origin(self) -> str:
        """Where the numbers in force came from: a coordinator, a calibration, or the source's
        defaults."""
        return self.in_force.origin

    def on_scale(self, scale: str | None, source: str | None = None) -> None:
        """The thermal source is open: its calibration or its scale's defaults under the
        coordinator's numbers."""
        self._scale = scale
        self._source = source
        self._stamp = calibration_stamp()
        point = load_calibration()
        self._calibrated = point if point is not None and point.source == source else None
        self._seen = []
        self._defaults = calibrated_defaults(scale, source, self._calibrated)
        self.in_force = self._resolve()

    def learn_from(self, history: TelemetryHistory) -> None:
        """Where throttling began in the samples since the calibration (shared.cooling.
        throttle_point.passive_onsets), read once its source is known and at each new one."""
        if self._calibrated is None or self._source is None:
            return
        polls = throttle_polls(history, self._source, self._calibrated.calibrated_at)
        self._seen = passive_onsets(polls)
        self._throttling = bool(polls and polls[-1][1])
        self.in_force = self._resolve()

    def observe(self, celsius: float | None, throttling: bool | None) -> bool:
        """One sample's reading and throttle verdict: a beginning of throttling is learned;
        whether the policy's origin changed with it (the calibration now looks stale)."""
        began = bool(throttling) and not self._throttling and celsius is not None
        self._throttling = bool(throttling)
        if not began or self._calibrated is None:
            return False
        self._seen.append(celsius)  # type: ignore[arg-type]  # began: a number
        previous = self.in_force
        self.in_force = self._resolve()
        return self.in_force != previous

    def recalibrated(self) -> bool:
        """Read the calibration again when its file changed since it was read (`agent
        calibrate` wrote one, here or in its own process); whether the policy in force
        changed. A stat per call: the daemon asks at each poll it wakes for."""
        stamp = calibration_stamp()
        if stamp == self._stamp:
            return False
        previous = self.in_force
        self.on_scale(self._scale, self._source)
        return self.in_force != previous

    def _resolve(self, loud: bool = True) -> PolicyInForce:
        """The coordinator's thresholds over the defaults; the defaults alone, logged, when the
        saved ones are out of order with them (saved on another source's scale)."""
        defaults = self._defaults
        note = self._calibrated and stale_note(self._calibrated.onset_c, self._seen)
        if note:
            defaults = replace(defaults, origin=f"{defaults.origin}; {note}")
        try:
            return with_given(self._scale, self._given, SET_BY_COORDINATOR, defaults)
        except ValueError as exc:
            if loud:
                log.error("cannot use the saved policy (%s): enforcing the defaults", exc)
            return defaults

    def change(self, changes: dict[str, Any]) -> bool:
        """Validate, persist and apply; whether the policy in force changed. ValueError naming
        the problem leaves the old policy in force."""
        check_changes(changes)
        given = merged_changes(self._given, given_numbers(changes))
        in_force = with_given(self._scale, given, SET_BY_COORDINATOR, self._defaults)
        if given != self._given:
            self.saved.save(given)  # enforced even when the disk refuses it
            self._given = given
        if in_force == self.in_force:
            return False
        self.in_force = in_force
        return True

    def retry(self) -> None:
        """Write the thresholds again if the disk refused them."""
        self.saved.retry()


def policy_event(in_force: PolicyInForce, source: ThermalSource) -> Event:
    """The `policy` event announcing a new policy in force, its origin ending its detail."""
    return Event(
        time=time.time(),
        job=None,
        pid=None,
        action="policy",
        source=source.name,
        simulated=source.simulated,
        detail=policy_event_detail(in_force),
        policy=in_force.policy.to_dict(),
    )
