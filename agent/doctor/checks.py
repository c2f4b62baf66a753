"""`agent doctor`: everything a first run on this machine needs, each check passed or failed
with the fix. The report (plain data) is what `agent doctor --format json` prints, what the
`doctor` request returns (docs/protocol.md), and what a user attaches to a bug report.

A check is `required` when the agent cannot run without it: the exit code is 0 when every
required check passed. A macOS feature absent on another OS is a failed check saying so, never
a pass.
"""

from __future__ import annotations

import platform
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import psutil

from agent.doctor.check import Check
from agent.doctor.firewall import firewall_check
from agent.doctor.mac_setup import (
    filevault_check,
    login_items_check,
    service_folders_check,
    sleep_check,
)
from agent.profiling.device_probe import (
    MATMUL_SIZE,
    MIN_MLX,
    DeviceProbe,
    older_than_minimum,
    probe_device,
)
from agent.profiling.machine import machine_info, package_version
from shared.benchmark.bandwidth import probe_bytes
from shared.cooling.sources import auto_order
from shared.io.paths import DataDirError, check_folder, data_dir, unwritable
from shared.wire import protocol as p

BENCH_SECONDS = 1.0
SOURCE_READ_INTERVAL_S = 0.5


def python_check() -> Check:
    version = platform.python_version()  # >= 3.10: the package requires it
    if sys.platform != "darwin":
        return Check("python", True, f"{platform.machine()} Python {version}", required=True)
    translated = subprocess.run(
        ["sysctl", "-n", "sysctl.proc_translated"], capture_output=True, text=True, check=False
    ).stdout.strip()
    if translated == "1" or platform.machine() != "arm64":
        return Check(
            "python",
            False,
            f"{platform.machine()} Python {version}"
            + (", translated by Rosetta" if translated == "1" else ""),
            "MLX needs a native arm64 Python: e.g. /opt/homebrew/bin/python3.12 (not /usr/local's "
            "Intel Homebrew), then reinstall mlx-fleet with it",
            True,
        )
    return Check("python", True, f"arm64 Python {version}", required=True)


def mlx_checks(probe: DeviceProbe) -> list[Check]:
    """MLX's version against the floor that reports a missing Metal device instead of aborting,
    and its device as the probe child saw it (agent.profiling.device_probe): an abort, crash or
    hang there is a failed check with the fix, never the end of doctor."""
    version = (probe.facts or {}).get("mlx_version") or package_version("mlx")
    if version is None:
        return [Check("mlx", False, "MLX is not installed", "pip install mlx", True)]
    floor = ".".join(map(str, MIN_MLX))
    checks = [
        Check("mlx", True, f"MLX {version}", required=True)
        if not older_than_minimum(version)
        else Check(
            "mlx",
            False,
            f"MLX {version} is older than {floor}, the first that reports a Metal device list "
            "macOS left empty as an error instead of aborting (ml-explore/mlx#3397, #3428)",
            f"pip install -U 'mlx>={floor}'",
        )
    ]
    if probe.facts is None:
        failure = probe.failure or "no answer"
        return [*checks, Check("mlx device", False, failure, probe.fix, required=True)]
    facts = probe.facts
    checks.append(Check("mlx device", True, f"default device {facts['backend']}", required=True))
    if facts.get("metal"):
        working = (facts.get("metal_working_set_bytes") or 0) / 2**30
        return [*checks, Check("metal", True, f"Metal, recommended working set {working:.1f} GiB")]
    on_mac = sys.platform == "darwin"
    return [
        *checks,
        Check(
            "metal",
            False,
            "no Metal device: MLX runs on its CPU backend"
            + ("" if on_mac else f" (Metal is macOS only; this is {platform.system()})"),
            "MLX needs macOS >= 14 on Apple Silicon for Metal" if on_mac else None,
            required=on_mac,
        ),
    ]


def bench_check(probe: DeviceProbe, skip: str | None = None) -> Check:
    """The probe child's 1-second matmul (agent.profiling.device_probe.matmul_speed): MLX
    computes right and at what speed."""
    if skip:
        return Check("benchmark", True, f"skipped: {skip}")
    if probe.bench is None:
        return Check("benchmark", False, probe.failure or "not measured", probe.fix, True)
    gflops, error = probe.bench["gflops"], probe.bench["error"]
    # Relative to the largest entry: MLX's CUDA backend multiplies float32 at TF32 precision
    # (an H200 with MLX 0.32.4 read 1.4e-3 against numpy's product; Metal and the CPU ~1e-7);
    # wrong results read ~1.
    ok = error < 1e-2
    detail = (
        f"{MATMUL_SIZE}x{MATMUL_SIZE} fp32 matmul: {gflops:.1f} GFLOP/s, "
        f"max relative error {error:.1e}"
    )
    return Check("benchmark", ok, detail, None if ok else "MLX computes wrong results", True)


def thermal_checks() -> list[Check]:
    """Every sensor this OS may have, side by side with its reading (the offsets between
    smc, iohid and macmon on this very Mac), and what `auto` picks."""
    from agent.sensors.base import SourceUnavailable
    from agent.thermal import open_source
    from agent.thermal.smc_die import NOT_COVERED

    checks = []
    picked: tuple[str | None, float | None, str | None] = (None, None, None)
    for name in (*auto_order(platform.system()), "auto"):
        try:
            with open_source(name, interval_s=SOURCE_READ_INTERVAL_S) as source:
                reading = source.read()
                reason = source.last_error
                chosen, scale = source.name, source.scale
                skipped = getattr(getattr(source, "inner", source), "skipped", {})
        except SourceUnavailable as exc:
            checks.append(Check(f"thermal: {name}", False, str(exc).split("; this machine")[0]))
            continue
        if reading is None or (reading.celsius is None and reading.pressure is None):
            checks.append(Check(f"thermal: {name}", False, f"no reading: {reason}"))
            continue
        degrees = "no degrees" if reading.celsius is None else f"{reading.celsius:.1f} °C"
        sensor = f" ({reading.sensor})" if reading.sensor else ""
        pressure = f", pressure {reading.pressure}" if reading.pressure else ""
        chose = f" -> {chosen}" if name == "auto" else ""
        odd = ", ".join(f"{key} ({kind.strip() or repr(kind)})" for key, kind in skipped.items())
        unknown = f"; skipped, of a type no decoder knows: {odd}" if odd else ""
        note = f"; {reading.note}" if reading.note else ""
        covered = not (reading.note or "").startswith(NOT_COVERED)  # the GPU unseen: a warning
        checks.append(
            Check(f"thermal: {name}", covered, f"{degrees}{sensor}{pressure}{chose}{unknown}{note}")
        )
        if name == "auto":
            picked = (scale, reading.celsius, chosen)
    return [*checks, policy_check(*picked)]


def policy_check(scale: str | None, idle_celsius: float | None, source: str | None = None) -> Check:
    """The policy the daemon will enforce here and where its numbers came from, with a warning
    when a threshold a coordinator set is at or below what the sensor reads now (at idle, in a
    doctor run): every job would be held back from its first poll."""
    from agent.cooling.calibration_file import policy_defaults
    from agent.cooling.policy_file import load_policy
    from shared.cooling.calibration import SET_BY_COORDINATOR, with_given

    saved = data_dir(create=False).is_dir()  # looking makes no data dir; `data dir` says why
    given = (load_policy() if saved else None) or {}
    defaults = policy_defaults(scale, source)
    try:
        in_force = with_given(scale, given, SET_BY_COORDINATOR, defaults)
    except ValueError as exc:
        fix = "coordinator policy with thresholds in order"
        return Check("policy", False, f"the saved policy cannot apply here: {exc}", fix)
    tiers = {"max_speed_temp": "reduce", "pause_temp": "pause", "stop_temp": "stop"}
    low = [
        f"{tier} ≥ {given[key]:g}"
        for key, tier in tiers.items()
        if key in given and idle_celsius is not None and given[key] <= idle_celsius
    ]
    if not low:
        return Check("policy", True, str(in_force))
    return Check(
        "policy",
        False,
        f"{in_force}: {', '.join(low)} °C is at or below the {idle_celsius:.1f} °C "
        f"{scale or 'the sensor'} reads now: every job is held back from its first poll",
        f"coordinator policy with thresholds above it; this source's own are {defaults}",
    )


def power_source_checks() -> list[Check]:
    """Every power source this OS may have, with what it reads (agent.doctor.power)."""
    from agent.doctor.power import power_checks

    return [
        Check(name, ok, detail, None if ok else "energy will be N/A with this source")
        for name, ok, detail in power_checks()
    ]


def pressure_check() -> Check:
    from agent.sensors.base import SourceUnavailable
    from agent.thermal.pressure import PressureReader

    try:
        reader = PressureReader()
    except SourceUnavailable as exc:
        return Check("thermal pressure", False, str(exc))
    try:
        level = reader.read()
    finally:
        reader.close()
    if level is None:
        return Check("thermal pressure", False, "notify_get_state gave no known level")
    return Check("thermal pressure", True, f"{level} (notify API, no root)")


CLOCK_WINDOW_S = 0.5
"""How long doctor reads the clocks over when its source counts intervals (IOReport)."""


def clock_check() -> Check:
    """This machine's clocks (agent.clocks.registry) as the agent's samples carry them: the
    figures and what they mean on this chip (requested or granted state), or why there are
    none. Not required: without a clock the throttle rule reads the jobs' work rate."""
    from agent.clocks.registry import open_clock_source
    from shared.cooling.clocks import clock_summary, sample_fields

    with open_clock_source() as clock:
        if clock.counts_intervals:
            time.sleep(CLOCK_WINDOW_S)
        reading = clock.read()
        fields = sample_fields(reading, clock.name, clock.simulated, clock.last_error)
    summary = clock_summary(fields)
    if summary.startswith("unavailable"):
        return Check("clocks", False, summary, "throttling is then seen by the work rate alone")
    return Check("clocks", True, f"{summary} ({fields['clock_source']}); {fields['clock_note']}")


def data_checks() -> list[Check]:
    """The data directory is writable and the secret key is this user's alone; nothing is
    created by looking."""
    home = data_dir(create=False)
    existing = next((path for path in (home, *home.parents) if path.exists()), Path("/"))
    try:
        if existing == home:
            check_folder(home, write=True)
        elif unwritable(existing) is not None or not existing.is_dir():
            raise DataDirError(f"data dir {home}: {existing} cannot hold it")
    except DataDirError as exc:
        fix = f"fix {home} (a directory of this user's, writable, 0700), or set MLX_FLEET_HOME"
        return [Check("data dir", False, str(exc), fix, True)]
    mode = stat.S_IMODE(home.stat().st_mode) if home.exists() else 0o700
    private = not mode & 0o077
    shown = (
        f"{home} mode {mode:04o}"
        if home.exists()
        else f"{home} missing: `agent serve` makes it (0700) in {existing}"
    )
    checks = [
        Check(
            "data dir",
            private,
            shown + ("" if private else ": others can read it"),
            None if private else f"chmod 700 {home}",
            private,  # too open is worth fixing, but the agent runs
        )
    ]
    secret = home / "keys" / "self.key_secret"
    if secret.exists():
        mode = stat.S_IMODE(secret.stat().st_mode)
        private = not mode & 0o077
        checks.append(
            Check(
                "agent key",
                private,
                f"{secret} mode {mode:o}",
                None if private else f"chmod 600 {secret}",
                True,
            )
        )
    else:
        checks.append(Check("agent key", True, "made on the first `agent serve`"))
    trusted = sorted((home / "keys" / "trusted").glob("*.key"))
    checks.append(
        Check(
            "trusted coordinators",
            bool(trusted),
            f"{len(trusted)} trusted: {', '.join(path.stem for path in trusted) or 'none'}",
            None if trusted else "agent keys trust KEY (the key `coordinator keys show` prints)",
        )
    )
    return checks


def port_checks(ports: tuple[int, int], serving: bool) -> list[Check]:
    """The command and telemetry ports can be bound (or this agent is the one holding them)."""
    from agent.daemon_address import find_daemon

    # find_daemon reads the state file under the data dir, which making its path would create
    daemon = find_daemon() if data_dir(create=False).is_dir() else None
    checks = []
    for port, role in zip(ports, ("command", "telemetry"), strict=True):
        name = f"port {port} ({role})"
        if serving:
            checks.append(Check(name, True, "bound by this agent", required=True))
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("0.0.0.0", port))
            except OSError as exc:
                if daemon is not None:
                    checks.append(
                        Check(name, True, f"in use by agent serve (pid {daemon.pid})", None, True)
                    )
                    continue
                fix = "stop what listens there, or agent serve --bind 0.0.0.0:OTHER_PORT"
                checks.append(Check(name, False, f"cannot bind: {exc.strerror}", fix, True))
                continue
        checks.append(Check(name, True, "free", required=True))
    return checks


def service_check() -> Check:
    from agent.service.control import status
    from agent.service.plan import make_plan

    reports = []
    for system in (False, True):
        try:
            report = status(make_plan(not system, system, False, False))
        except Exception as exc:  # a manager that cannot be asked is reported, not raised
            return Check("service", False, f"cannot ask the service manager: {exc}")
        reports.append(report)
        if report["installed"]:
            break
    report = reports[-1]
    if not report["installed"]:
        return Check("service", False, "not installed", "agent install (or coordinator deploy)")
    where = report.get("domain") or report["flavour"]
    detail = (
        f"{report['scope']} {report['flavour']} service, loaded: {report['loaded']}, "
        f"in {where}, running: {report['running']}, pid {report['pid']}, "
        f"last exit code {report['last_exit']}"
    )
    ok = report["running"] is True
    return Check("service", ok, detail, None if ok else f"see {', '.join(report['logs'])}")


UNREADABLE_PANICS_FIX = (
    "this account cannot list the panic reports: look by hand (sudo ls -l "
    "/Library/Logs/DiagnosticReports), or run the agent as an account that may list them"
)


def panic_check(directories: Sequence[Path] | None = None, now: float | None = None) -> Check:
    """The kernel panics of the last week (agent.awake.panics): a warning, never required
    (the agent runs), since a Mac that panicked under MLX is likely to again and a run's cells
    after a panic are of another boot. `directories`: where to look instead of a Mac's own."""
    from agent.awake.panics import RECENT_S, scan
    from shared.benchmark.reboots import MAX_PANICS

    name = f"kernel panics (last {RECENT_S / 86400:g} days)"
    if directories is None and sys.platform != "darwin":
        return Check(
            name,
            False,
            f"not applicable: not a Mac ({platform.system()}); macOS alone writes kernel panic "
            "reports (/Library/Logs/DiagnosticReports/*.panic)",
        )
    scanned = scan((time.time() if now is None else now) - RECENT_S, directories)
    found, cannot_tell = scanned.reports, scanned.cannot_tell()
    if not found:
        if cannot_tell:
            return Check(name, False, cannot_tell, UNREADABLE_PANICS_FIX)
        return Check(name, True, "none")
    latest = found[-1]
    many = f"at least {len(found)}" if len(found) == MAX_PANICS or cannot_tell else str(len(found))
    said = latest["panic_string"] or "no panic string read"
    return Check(
        name,
        False,
        f"{many}; the latest {latest['file']}: {said}"
        + (f" ({cannot_tell})" if cannot_tell else ""),
        "see docs/reliability.md (GPU errors and reboots); the reports are in "
        "/Library/Logs/DiagnosticReports",
    )


def report(
    ports: tuple[int, int] = (p.DEFAULT_PORT, p.DEFAULT_PORT + p.TELEMETRY_PORT_OFFSET),
    serving: bool = False,
    skip_bench: str | None = None,
    bandwidth: bool = False,
) -> dict[str, Any]:
    """Every check, in the order a first run meets them, with this machine's facts; with
    `bandwidth` also the memory probe's raw timings (level 2), skipped as the benchmark is."""
    size, too_little = probe_bytes(psutil.virtual_memory().available)
    measure = bandwidth and not skip_bench and size is not None
    probe = probe_device(
        None if skip_bench else BENCH_SECONDS, bandwidth_bytes=size if measure else None
    )
    steps: list[Callable[[], Check | list[Check]]] = [
        python_check,
        lambda: mlx_checks(probe),
        lambda: bench_check(probe, skip_bench),
        thermal_checks,
        pressure_check,
        clock_check,
        power_source_checks,
        data_checks,
        lambda: port_checks(ports, serving),
        service_check,
        panic_check,
        firewall_check,
        filevault_check,
        login_items_check,
        sleep_check,
        service_folders_check,
    ]
    checks: list[Check] = []
    for step in steps:
        found = step()
        checks.extend(found if isinstance(found, list) else [found])
    machine = machine_info(probe)
    found = {
        "host": socket.gethostname(),
        "ok": all(check.ok for check in checks if check.required),
        "checks": [asdict(check) for check in checks],
        "machine": machine,
    }
    if bandwidth:
        why = f"skipped: {skip_bench}" if skip_bench else too_little or probe.failure
        found["bandwidth"] = probe.bandwidth or {"error": why or "not measured"}
    return found
