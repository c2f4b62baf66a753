#!/usr/bin/env python3
"""A stand-in for launchctl and systemctl: logs its argv, answers like the real tool.

Installed on PATH under both names by tests/test_service.py. State (what is loaded) lives in
$FAKE_SERVICE_STATE so successive calls agree, as the real service manager's would.

$FAKE_FAIL lists verbs (comma-separated: bootstrap, bootout, print, enable, disable, show, ...)
that fail as an unreachable or refusing manager does, e.g. `FAKE_FAIL=show` for a systemctl
that cannot reach the bus, `FAKE_FAIL=bootout` for a launchctl that will not stop the job.
"""

import json
import os
import sys
from pathlib import Path

state_path = Path(os.environ["FAKE_SERVICE_STATE"])
state = json.loads(state_path.read_text()) if state_path.exists() else {"loaded": []}
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


def save() -> None:
    state_path.write_text(json.dumps(state))


verb = next(a for a in args if a != "--user")
if verb in os.environ.get("FAKE_FAIL", "").split(","):
    if name == "launchctl":
        print(f"{verb.capitalize()} failed: 1: Operation not permitted", file=sys.stderr)
    else:
        print("Failed to connect to bus: No medium found", file=sys.stderr)
    sys.exit(1)

if name == "launchctl":
    if verb == "bootstrap":
        domain, path = args[1], args[2]
        if domain.startswith("gui/") and os.environ.get("FAKE_NO_GUI"):
            print(
                "Bootstrap failed: 125: Domain does not support specified action", file=sys.stderr
            )
            sys.exit(125)
        target = f"{domain}/io.mlx-fleet.agent"
        if target in state["loaded"]:
            print("Bootstrap failed: 5: Input/output error", file=sys.stderr)
            sys.exit(5)
        state["loaded"].append(target)
        state.setdefault("paths", {})[target] = path
        save()
    elif verb == "bootout":
        if args[1] not in state["loaded"]:
            print("Boot-out failed: 3: No such process", file=sys.stderr)
            sys.exit(3)
        state["loaded"].remove(args[1])
        save()
    elif verb == "print":
        if args[1] not in state["loaded"]:
            print("Could not find service in domain", file=sys.stderr)
            sys.exit(113)
        print(LAUNCHCTL_PRINT.format(target=args[1], path=state["paths"][args[1]]))
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
