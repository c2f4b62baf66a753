#!/usr/bin/env python3
"""A stand-in for launchctl and systemctl: logs its argv, answers like the real tool.

Installed on PATH under both names by tests/test_service.py. State (what is loaded, lingering,
disabled) lives in $FAKE_SERVICE_STATE so successive calls agree, as the real manager's would.

launchctl behaves as the real one was seen to (each with its source):
- `print` of a service the domain does not have exits 113 (mac-desk-check.md, launchd).
- `bootout` of a job that is not loaded exits 3 "No such process" (same).
- `bootout` returns before launchd has forgotten the job: for $FAKE_LINGER_S seconds (launchd:
  "the label actually frees ~3 s after bootout", Layr-Labs/d-inference#1102) the label stays:
  `print` still lists it, a second `bootout` exits 36 "Operation now in progress" (Homebrew's
  services/cli.rb loops on it), and `bootstrap` exits 5 "Input/output error"
  (headroomlabs-ai/headroom#1289), or 37 "Operation already in progress" with
  $FAKE_LINGER_CODE=37 (d-inference#1102). $FAKE_LINGER_HIDDEN=1: `print` already says 113
  while `bootstrap` still fails (d-inference#1102: bootstrap ~0.5 s after bootout, refused).
  $FAKE_LINGER_S defaults to 0, no linger: only the tests about lingering wait one out (they
  set 3, launchd's), so the other install tests do not spend 3 s in every bootout.
- $FAKE_NO_GUI: nobody is logged in at the screen, so there is no gui/ domain: `print gui/<uid>`
  exits $FAKE_GUI_PROBE_CODE, 112 "Could not find specified domain" by default or 125 (both in
  duh17/oppi#38), and `bootstrap gui/<uid>` exits 125 "Domain does not support specified
  action" (home-manager#4413, Mic92/sops-nix#966).
- $FAKE_GUI_UNUSABLE=CODE: `print gui/<uid>` exits 0 but this session cannot use the domain
  (cron, tmux or mosh without $SSH_*): `bootstrap gui/<uid>` exits CODE: 5 "Input/output
  error" (psimaker/vaultsync#89), 112 or 125 (duh17/oppi#38). $FAKE_GUI_ENABLE_CODE=CODE: the
  same for `enable gui/<uid>/<label>`.
- $FAKE_BOOTOUT_RACE=CODE: the job exits on its own as `bootout` asks: it is gone, and bootout
  exits CODE, 113 "Could not find specified service" or 125 (Homebrew's services/cli.rb stops
  waiting on 3 and 125). The strings are launchctl's own (`launchctl error 112` prints them).
- A plist whose LimitLoadToSessionType does not include the domain's session (Aqua for gui/,
  Background for user/, System for system; no key means Aqua) does not bootstrap: exit 5, "Service
  cannot load in requested session" (duh17/oppi#31; exit 5 in NousResearch/hermes-agent#13560).
- A disabled label (`launchctl disable`, which persists across uninstalls) fails `bootstrap` with
  119 "Service is disabled" until `launchctl enable` (DeterminateSystems/nix-installer#530).

$FAKE_FAIL lists verbs (comma-separated: bootstrap, bootout, print, enable, disable, show, ...)
that fail as an unreachable or refusing manager does, e.g. `FAKE_FAIL=show` for a systemctl
that cannot reach the bus, `FAKE_FAIL=bootout` for a launchctl that will not stop the job.
"""

import json
import os
import plistlib
import sys
import time
from pathlib import Path

state_path = Path(os.environ["FAKE_SERVICE_STATE"])
state = json.loads(state_path.read_text()) if state_path.exists() else {}
for key in ("loaded", "disabled"):
    state.setdefault(key, [])
for key in ("paths", "lingering"):
    state.setdefault(key, {})
name = Path(sys.argv[0]).name
args = sys.argv[1:]
with open(state_path.with_suffix(".log"), "a") as log:
    log.write(json.dumps([name, *args]) + "\n")

LAUNCHCTL_PRINT = """{target} = {{
\tactive count = 1
\tpath = {path}
\ttype = LaunchAgent
\tstate = running

\tprogram = /usr/bin/python3
\targuments = {{
\t\t/usr/bin/python3
\t\t-m
\t\tagent
\t\tserve
\t}}

\tpid = 4242
\timmediate reason = speculative
\tlast exit code = 0
}}
"""
SESSIONS = {"gui": "Aqua", "user": "Background", "system": "System"}
WORDS = {
    5: "Input/output error",
    112: "Could not find specified domain",
    113: "Could not find specified service",
    125: "Domain does not support specified action",
}


def save() -> None:
    state_path.write_text(json.dumps(state))


def fail(code: int, *lines: str) -> None:
    print("\n".join(lines), file=sys.stderr)
    sys.exit(code)


def lingering(target: str) -> bool:
    """Booted out, not yet forgotten."""
    deadline = state["lingering"].get(target)
    if deadline is None:
        return False
    if time.time() < deadline:
        return True
    del state["lingering"][target]
    save()
    return False


def session_types(plist_path: str) -> list[str]:
    with open(plist_path, "rb") as handle:
        types = plistlib.load(handle).get("LimitLoadToSessionType", "Aqua")
    return [types] if isinstance(types, str) else list(types)


verb = next(a for a in args if a != "--user")
if verb in os.environ.get("FAKE_FAIL", "").split(","):
    if name == "launchctl":
        fail(1, f"{verb.capitalize()} failed: 1: Operation not permitted")
    fail(1, "Failed to connect to bus: No medium found")

if name == "launchctl":
    gui = args[1].startswith("gui/") if len(args) > 1 else False
    if verb == "print" and args[1].count("/") < 2:  # a domain, not a service
        if gui and os.environ.get("FAKE_NO_GUI"):
            code = int(os.environ.get("FAKE_GUI_PROBE_CODE", "112"))
            fail(code, f"Bad request.\nCould not find domain for {args[1]}: {WORDS[code]}")
        print(f"{args[1]} = {{\n\ttype = {SESSIONS[args[1].split('/')[0]]}\n}}")
        sys.exit(0)
    if verb == "enable" and gui and os.environ.get("FAKE_GUI_ENABLE_CODE"):
        code = int(os.environ["FAKE_GUI_ENABLE_CODE"])
        fail(code, f"Enable failed: {code}: {WORDS[code]}")
    if verb == "bootstrap":
        domain, path = args[1], args[2]
        target = f"{domain}/io.mlx-fleet.agent"
        if gui and os.environ.get("FAKE_NO_GUI"):
            fail(125, "Bootstrap failed: 125: Domain does not support specified action")
        if gui and os.environ.get("FAKE_GUI_UNUSABLE"):
            code = int(os.environ["FAKE_GUI_UNUSABLE"])
            fail(code, f"Bootstrap failed: {code}: {WORDS[code]}")
        if target in state["disabled"]:
            fail(119, f"{path}: Service is disabled", "Bootstrap failed: 119: Service is disabled")
        if lingering(target):
            code = int(os.environ.get("FAKE_LINGER_CODE", "5"))
            words = {5: "Input/output error", 37: "Operation already in progress"}[code]
            fail(code, f"Bootstrap failed: {code}: {words}")
        if target in state["loaded"]:
            fail(5, "Bootstrap failed: 5: Input/output error")
        if SESSIONS[domain.split("/")[0]] not in session_types(path):
            fail(
                5,
                "Bootstrap failed: 5: Input/output error",
                "Service cannot load in requested session",
            )
        state["loaded"].append(target)
        state["paths"][target] = path
        save()
    elif verb == "bootout":
        target = args[1]
        if lingering(target):
            fail(36, "Boot-out failed: 36: Operation now in progress")
        if target not in state["loaded"]:
            fail(3, "Boot-out failed: 3: No such process")
        state["loaded"].remove(target)
        race = os.environ.get("FAKE_BOOTOUT_RACE")
        if race:  # exited by itself, nothing left to linger
            save()
            fail(int(race), f"Boot-out failed: {race}: {WORDS[int(race)]}")
        state["lingering"][target] = time.time() + float(os.environ.get("FAKE_LINGER_S", "0"))
        save()
    elif verb == "print":
        target = args[1]
        hidden = os.environ.get("FAKE_LINGER_HIDDEN")
        if target in state["loaded"] or (lingering(target) and not hidden):
            print(LAUNCHCTL_PRINT.format(target=target, path=state["paths"][target]))
        else:
            fail(113, f'Could not find service "io.mlx-fleet.agent" in domain for {target}')
    elif verb == "enable" and args[1] in state["disabled"]:
        state["disabled"].remove(args[1])
        save()
    elif verb == "disable" and args[1] not in state["disabled"]:
        state["disabled"].append(args[1])
        save()
    sys.exit(0)

# systemctl [--user] verb ...
if verb in ("enable", "restart"):
    if "mlx-fleet-agent.service" not in state["loaded"]:
        state["loaded"].append("mlx-fleet-agent.service")
    save()
elif verb == "disable":
    if "mlx-fleet-agent.service" in state["loaded"]:
        state["loaded"].remove("mlx-fleet-agent.service")
    save()
elif verb == "show":
    active = "mlx-fleet-agent.service" in state["loaded"]
    print(f"LoadState={'loaded' if active else 'not-found'}")
    print(f"ActiveState={'active' if active else 'inactive'}")
    print(f"SubState={'running' if active else 'dead'}")
    print(f"MainPID={4343 if active else 0}")
    print("ExecMainStatus=0")
sys.exit(0)
