"""calibration.json: this Mac's throttle point as `agent calibrate` learned it (shared.cooling.
throttle_point), kept beside policy.json. Its own module in cooling/, below its readers: the
daemon (the policy it enforces), `agent doctor`, `agent temp` and `agent bench` (the policy they
show), and `agent calibrate`, which writes it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from shared.cooling.calibration import PolicyInForce, calibrated_defaults
from shared.cooling.throttle_point import ThrottlePoint
from shared.io.files import replace_atomically
from shared.io.paths import data_dir

log = logging.getLogger("agent.calibration")


def calibration_path() -> Path:
    return data_dir() / "calibration.json"


def load_calibration(path: Path | None = None) -> ThrottlePoint | None:
    """This Mac's calibration, else None. A file that cannot be used is reported and the
    source's defaults apply: a calibration half written or edited by hand is none."""
    path = path or calibration_path()
    try:
        return ThrottlePoint.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        log.error("cannot use the calibration %s (%s): the source's defaults apply", path, exc)
        return None


def save_calibration(point: ThrottlePoint, path: Path | None = None) -> None:
    """Replace the calibration atomically (the previous one stays whole until then); raises
    OSError."""
    replace_atomically(path or calibration_path(), json.dumps(point.to_dict(), indent=1))


def calibration_stamp() -> int | None:
    """When the calibration was last written (ns), None without one: cheap enough to ask at
    every poll, so a daemon sees a calibration `agent calibrate` made in its own process."""
    try:
        return calibration_path().stat().st_mtime_ns
    except OSError:
        return None


def policy_defaults(scale: str | None, source: str | None) -> PolicyInForce:
    """What applies under an operator's thresholds for a source: this Mac's calibration made
    with it, else the source's table (shared.cooling.calibration.calibrated_defaults)."""
    calibrated = load_calibration() if data_dir(create=False).is_dir() else None
    return calibrated_defaults(scale, source, calibrated)
