"""launchd the way Homebrew's `brew services` drives it (Homebrew/brew Library/Homebrew/services/
cli.rb and system.rb, at aad366f), with the waits other projects found it needs.

- The domain (`domain_target` in system.rb): `system` whenever euid is 0 (so root and sudo get a
  LaunchDaemon, agent.service.plan); for a LaunchAgent `user/<uid>` when the session is ssh
  without ownership of /dev/console, or sudo, or uid != euid, else `gui/<uid>`. Homebrew tests
  $SSH_TTY alone; a non-interactive `ssh host cmd` (what `coordinator deploy` runs) has no tty,
  so $SSH_CONNECTION counts too. gui/ is chosen only when `launchctl print gui/<uid>` exits 0:
  cron, tmux or mosh have no $SSH_* and may have no GUI session (duh17/oppi#38: the probe exits
  112 "Could not find specified domain" or 125). Even then `enable`/`bootstrap gui/<uid>` can
  fail with 125 "Domain does not support specified action" (home-manager#4413,
  Mic92/sops-nix#966), 5 "Input/output error" (psimaker/vaultsync#89) or 112: gui/ falls back to
  `user/` on those.
- The plist may load in every session type (service.rb writes LimitLoadToSessionType = [Aqua,
  Background, LoginWindow, StandardIO, System]); without it a job defaults to Aqua and `bootstrap
  user/<uid>` fails ("Service cannot load in requested session", duh17/oppi#31; exit 5 in
  NousResearch/hermes-agent#13560; geldata/gel-cli#740). A plist bootstrapped into user/ is
  Background alone (agent.service.files.session_types): no second copy at a later GUI login.
- `launchctl enable <domain>/<label>` before `bootstrap` (services/cli.rb `launchctl_load`): a
  label once disabled stays disabled across uninstalls and bootstrap then fails with 119 "Service
  is disabled" (DeterminateSystems/nix-installer#530) or 5 (openclaw/openclaw#849).
- `bootout` returns before the job is gone: the label stays registered for ~3-5 s and a
  `bootstrap` in that window fails with 5 "Input/output error" or 37 "Operation already in
  progress" (Layr-Labs/d-inference#1102, headroomlabs-ai/headroom#1289, Opendray/opendray#211).
  Homebrew's `stop` (services/cli.rb) re-issues bootout while it exits 36 ("Operation now in
  progress", Errno::EINPROGRESS) or the job is still loaded, and stops waiting on 3 ("No such
  process", Errno::ESRCH) and 125 (LAUNCHCTL_DOMAIN_ACTION_NOT_SUPPORTED, system.rb); we also
  poll `print` until it exits 113 (unknown service), bounded, and retry `bootstrap` on 5/37,
  bounded. A bootout racing the job's own exit can also answer 113 "Could not find specified
  service": 3, 113 and 125 all mean gone.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass

from agent.service.managers import ServiceError, acting_ids, failure, run

LABEL = "io.mlx-fleet.agent"
"""launchd Label, and the plist's file name (`io.mlx-fleet.agent.plist`)."""
SESSION_TYPES = ["Aqua", "Background", "LoginWindow", "StandardIO", "System"]
"""Homebrew's LimitLoadToSessionType (Library/Homebrew/service.rb)."""

GONE = 3
"""`bootout` of a job that is not loaded: No such process."""
IO_ERROR = 5
"""`bootstrap` while the label lingers after a bootout (also: a session it cannot load in)."""
DOMAIN_NOT_FOUND = 112
"""A domain launchd does not have: Could not find specified domain (gui/ with no GUI session)."""
IN_PROGRESS = 36
"""`bootout` still tearing the job down: Operation now in progress."""
ALREADY_IN_PROGRESS = 37
"""`bootstrap` racing the previous job's cleanup: Operation already in progress."""
NOT_FOUND = 113
"""`print` of a service the domain does not have (any other failure: launchd not reachable)."""
NO_DOMAIN = 125
"""`bootstrap gui/<uid>` with no GUI session: Domain does not support specified action."""
RETRIED_BOOTSTRAP = (IO_ERROR, ALREADY_IN_PROGRESS)
BOOTOUT_GONE = (GONE, NOT_FOUND, NO_DOMAIN)
"""`bootout` answers meaning the job is not there: Homebrew's dont_wait_statuses (3, 125) and 113
when it exited as we asked."""
GUI_UNSUPPORTED = (IO_ERROR, DOMAIN_NOT_FOUND, NO_DOMAIN)
"""`enable`/`bootstrap gui/<uid>` answers meaning this session cannot use the GUI domain."""

STOP_WAIT_S = 40.0
"""How long a bootout may take to be forgotten: the job's ExitTimeOut (30 s) plus launchd's
cleanup (~5 s after SIGTERM, Layr-Labs/d-inference#1102)."""
BOOTSTRAP_RETRY_S = 10.0
"""How long `bootstrap` is retried on 5/37 (headroom#1289 measured ~5 s of 5s)."""
POLL_S = 0.25

CONSOLE_ENV = "MLX_FLEET_CONSOLE_DEVICE"
"""Stands in for /dev/console (whose owner is the user logged in at the screen), as
MLX_FLEET_SYSFS_ROOT stands in for /sys: tests name a file with the owner they need."""


@dataclass(frozen=True)
class Session:
    """Who is asking, and from where: what Homebrew's domain_target looks at."""

    uid: int
    euid: int
    console_uid: int | None
    """Owner of /dev/console: root at the login window, the user logged in at the screen."""
    ssh: bool
    sudo: bool

    @property
    def at_screen(self) -> bool:
        """This user owns the console: a GUI session (gui/<uid>) exists."""
        return self.console_uid == self.uid


def current_session() -> Session:
    uid, euid = acting_ids()
    console = os.environ.get(CONSOLE_ENV) or "/dev/console"
    try:
        console_uid: int | None = os.stat(console).st_uid
    except OSError:
        console_uid = None
    return Session(
        uid=uid,
        euid=euid,
        console_uid=console_uid,
        ssh=bool(os.environ.get("SSH_TTY") or os.environ.get("SSH_CONNECTION")),
        sudo=bool(os.environ.get("SUDO_USER")),
    )


def agent_domain(session: Session, gui_exists: bool) -> str:
    """Homebrew's domain_target for a user's LaunchAgent (its root case is our system scope),
    with gui/ only where `launchctl print gui/<uid>` found it."""
    homebrew_user = (session.ssh and not session.at_screen) or session.sudo
    if homebrew_user or session.uid != session.euid or not gui_exists:
        return f"user/{session.euid}"
    return f"gui/{session.uid}"


def bootstrap_domains(system: bool, session: Session, gui_exists: bool) -> list[str]:
    """Where to bootstrap, in order: gui/ falls back to user/ when it turns out unusable."""
    if system:
        return ["system"]
    first = agent_domain(session, gui_exists)
    return [first, f"user/{session.euid}"] if first.startswith("gui/") else [first]


def owned_domains(system: bool, uid: int) -> list[str]:
    """Every domain a copy of the service of this scope may be loaded in."""
    return ["system"] if system else [f"gui/{uid}", f"user/{uid}"]


def target(domain: str) -> str:
    return f"{domain}/{LABEL}"


class DomainUnsupported(ServiceError):
    """`enable`/`bootstrap` into gui/ that this session cannot use (no GUI session)."""


class Launchctl:
    """launchctl with Homebrew's order and the bounded waits around bootout and bootstrap."""

    def __init__(
        self,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sleep = sleep
        self._clock = clock

    def has_domain(self, domain: str) -> bool:
        """`launchctl print <domain>` exits 0: the domain exists for this session (oppi#38)."""
        return run(["launchctl", "print", domain]).returncode == 0

    def print(self, domain: str) -> tuple[bool, str]:
        """(loaded, `launchctl print` output); ServiceError when launchd cannot be asked."""
        command = ["launchctl", "print", target(domain)]
        result = run(command)
        if result.returncode == 0:
            return True, result.stdout
        if result.returncode == NOT_FOUND:
            return False, ""
        raise ServiceError(failure(command, result))

    def bootout(self, domain: str) -> str:
        """Boot the job out and wait until launchd has forgotten it; the line for the report."""
        command = ["launchctl", "bootout", target(domain)]
        deadline = self._clock() + STOP_WAIT_S
        while True:
            result = run(command)
            if result.returncode in BOOTOUT_GONE:
                break
            if result.returncode not in (0, IN_PROGRESS):
                raise ServiceError(failure(command, result))
            if not self.print(domain)[0]:
                break
            if self._clock() >= deadline:
                raise ServiceError(
                    f"launchctl print {target(domain)} still lists the job {STOP_WAIT_S:g} s "
                    f"after {shlex.join(command)}"
                )
            self._sleep(POLL_S)
        return shlex.join(command)

    def start(self, domain: str, plist: str, booted_out: bool) -> list[str]:
        """`enable`, then `bootstrap`, retried while the previous job's label lingers (only
        where one was booted out: otherwise a gui/ 5 means no GUI session, vaultsync#89).
        DomainUnsupported when gui/ cannot be used from this session."""
        gui = domain.startswith("gui/")
        enable = ["launchctl", "enable", target(domain)]
        result = run(enable)
        if result.returncode != 0:
            unsupported = gui and result.returncode in GUI_UNSUPPORTED
            raise (DomainUnsupported if unsupported else ServiceError)(failure(enable, result))
        command = ["launchctl", "bootstrap", domain, plist]
        deadline = self._clock() + BOOTSTRAP_RETRY_S
        while True:
            result = run(command)
            code = result.returncode
            if code == 0:
                return [shlex.join(enable), shlex.join(command)]
            lingers = code in RETRIED_BOOTSTRAP and (booted_out or not gui)
            if gui and code in GUI_UNSUPPORTED and not lingers:
                raise DomainUnsupported(failure(command, result))
            if not lingers or self._clock() >= deadline:
                retried = f" (retried for {BOOTSTRAP_RETRY_S:g} s)" if lingers else ""
                raise ServiceError(failure(command, result) + retried)
            self._sleep(POLL_S)
