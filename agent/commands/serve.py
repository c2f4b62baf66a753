"""`agent serve`: the daemon coordinators drive."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Annotated

import typer

from agent.commands.models import ModelsDir
from agent.daemon.endpoints import DEFAULT_BIND, PortHeld, ServeError
from agent.daemon.loop import DEFAULT_RETENTION_DAYS, AgentDaemon, serve
from agent.daemon_address import DaemonAddress, find_daemon, pid_alive
from agent.staging.tasks import DEFAULT_BUSY_RATE
from shared.bounds import MAX_PID
from shared.io.address import host_port
from shared.io.cli import err, usage_error
from shared.io.files import make_private
from shared.io.options import (
    PowerOptions,
    RetentionDays,
    ThermalOptions,
    with_options,
)

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s: %(message)s"
LOG_ROTATE_BYTES = 10 * 1024 * 1024
LOG_BACKUPS = 5

PrometheusAddress = Annotated[
    str | None,
    typer.Option(
        "--prometheus",
        help="Also serve Prometheus metrics at http://HOST:PORT/metrics (port 0 picks a free one).",
    ),
]
AgentName = Annotated[
    str | None,
    typer.Option(
        "--name",
        help="This agent's name: the `host` of its telemetry and of every Prometheus series "
        "(default: the hostname).",
    ),
]


class LogFile(RotatingFileHandler):
    """The daemon's --log-file. A line the disk refuses is lost (the daemon goes on), and costs
    one line on stderr a minute at most, never logging's traceback for every record."""

    quiet_s = 60.0
    _lost = 0
    _quiet_until = 0.0

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        self._lost += 1
        now = time.monotonic()
        if now < self._quiet_until:
            return
        self._quiet_until = now + self.quiet_s
        error = sys.exc_info()[1]
        print(
            f"agent serve: cannot write {self.baseFilename}: {error}; "
            f"{self._lost} log line(s) lost so far",
            file=sys.stderr,
            flush=True,
        )


def configure_logging(log_file: Path | None) -> None:
    """Timestamped lines on stderr, or in a size-rotated file for long-lived services, private
    to this user (0600, every rotated file too: the daemon runs with umask 077)."""
    if log_file is None:
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
    else:
        log_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        make_private(log_file)
        handler = LogFile(
            log_file, maxBytes=LOG_ROTATE_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8"
        )
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)


@with_options
def serve_command(
    thermal: ThermalOptions,
    power: PowerOptions,
    bind: Annotated[
        str,
        typer.Option("--bind", help="HOST:PORT of the command socket; port 0 picks a free one."),
    ] = DEFAULT_BIND,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="Turn CURVE off: anyone who can reach the port may drive this "
            "Mac. For a trusted lab network only.",
        ),
    ] = False,
    log_file: Annotated[
        Path | None,
        typer.Option(
            "--log-file", help="Log here instead of stderr, rotated at 10 MB (5 files kept)."
        ),
    ] = None,
    telemetry_port: Annotated[
        int | None,
        typer.Option(
            "--telemetry-port",
            help="Port of the telemetry PUB socket (default: the command "
            "port + 1, 5556; a free one with --bind HOST:0; 0 picks a free one).",
        ),
    ] = None,
    retention_days: RetentionDays = DEFAULT_RETENTION_DAYS,
    prometheus: PrometheusAddress = None,
    name: AgentName = None,
    models_dir: ModelsDir = None,
    stage_busy_rate: Annotated[
        float,
        typer.Option(
            "--stage-busy-rate",
            metavar="MB/S",
            help="Fetch a staged model at most this fast while a job runs here (a benchmark, "
            "a rank, `agent run`, a calibration).",
        ),
    ] = DEFAULT_BUSY_RATE / 1e6,
    parent_pid: Annotated[
        int | None,
        typer.Option(
            "--parent-pid",
            help="Stop, as on SIGTERM, when process PID (which started this agent) ends: how "
            "`coordinator benchmark`'s local agent never outlives it.",
        ),
    ] = None,
) -> None:
    """Serve coordinators over ZeroMQ until SIGTERM: benchmarks, info, job history, and
    thermal telemetry.

    Stays in the foreground (as launchd and systemd want), logs with timestamps, exits 0 on
    SIGTERM. Prints `agent serve: listening on tcp://HOST:PORT curve-key=KEY
    telemetry=tcp://HOST:PORT` (INSECURE instead of the key) once bound; a second instance on
    the same port is refused. Monitors the thermal source (and the power source,
    --power-source) every --poll-interval seconds all the time, publishes each sample and each
    policy action, keeps them --retention-days, and
    enforces the policy a coordinator pushed (kept across restarts) on its benchmark jobs and on
    the `agent run` commands of this machine.
    """
    if telemetry_port is not None and not 0 <= telemetry_port <= 65535:
        raise usage_error(f"--telemetry-port must be 0 to 65535, got {telemetry_port}")
    if name is not None and not name.strip():
        raise usage_error("--name must not be empty")
    if parent_pid is not None and not 1 <= parent_pid <= MAX_PID:
        raise usage_error(f"--parent-pid must be a process id, 1 to {MAX_PID}, got {parent_pid}")
    if parent_pid is not None and not pid_alive(parent_pid):
        raise usage_error(f"--parent-pid {parent_pid}: no such process (it must be running)")
    if not 0.01 <= stage_busy_rate <= 1e6:
        raise usage_error(
            f"--stage-busy-rate must be 0.01 to 1000000 MB/s, got {stage_busy_rate:g}"
        )
    unusable = bind_problem(bind)
    if unusable is not None:
        raise usage_error(unusable)
    os.umask(0o077)  # every file the daemon and its jobs make is this user's alone
    if models_dir is not None:  # its jobs, and its own checks, load staged models from there
        os.environ["HF_HUB_CACHE"] = str(models_dir.expanduser().absolute())
    try:
        configure_logging(log_file)
    except OSError as exc:
        raise usage_error(f"--log-file {log_file}: {exc.strerror}") from None
    if insecure:
        err.print(
            "[bold red]WARNING: --insecure: CURVE is OFF. Messages travel in clear text "
            "and ANY client that reaches this port can run jobs here.[/bold red]",
            highlight=False,
        )
    try:
        daemon = AgentDaemon(
            bind,
            not insecure,
            thermal.thermal_source,
            poll_interval=thermal.poll_interval,
            telemetry_port=telemetry_port,
            retention_days=retention_days,
            prometheus=prometheus,
            name=name,
            parent_pid=parent_pid,
            power_source=power.power_source,
            idle_baseline=power.idle_baseline,
            models_dir=models_dir,
            stage_busy_rate=stage_busy_rate * 1e6,
        )
        serve(daemon)
    except PortHeld as exc:
        holder = find_daemon()
        if holder is None or not holds_port(holder, exc.endpoint):
            raise usage_error(str(exc)) from None
        # A second copy launchd loaded (gui/ after user/): exit 0 so KeepAlive's
        # SuccessfulExit=false leaves it stopped instead of restarting it every 10 s.
        logging.getLogger("agent.serve").info(
            "%s is held by this data directory's agent (pid %d): not starting a second copy",
            exc.endpoint,
            holder.pid,
        )
    except ServeError as exc:
        raise usage_error(str(exc)) from None


WILDCARDS = ("*", "0.0.0.0", "::", "[::]")


def bind_problem(bind: str) -> str | None:
    """Why --bind's HOST cannot be bound, when DNS has no address for it and it is no network
    interface of this machine (ZeroMQ binds `eth0:5555` too): ZeroMQ would say only `No such
    device`. None when it may be bound (a malformed HOST:PORT is endpoint_for's to refuse)."""
    try:
        host, port = host_port(bind, "--bind", "")
    except ValueError:
        return None
    host = host.strip("[]")
    if not host or host in WILDCARDS:
        return None
    try:
        if host in {name for _, name in socket.if_nameindex()}:
            return None
    except OSError:
        pass
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, socket.gaierror) and exc.strerror else exc
        return (
            f"--bind {bind}: cannot resolve {host} ({why}), so it cannot be bound: give an "
            f"address or interface of this machine, e.g. 0.0.0.0:{port} (every interface) "
            f"or 127.0.0.1:{port}"
        )
    return None


def holds_port(holder: DaemonAddress, endpoint: str) -> bool:
    """Whether the live agent of this data directory listens on `endpoint`'s port."""
    port = endpoint.rpartition(":")[2]
    return port in (holder.endpoint.rpartition(":")[2], holder.telemetry.rpartition(":")[2])
