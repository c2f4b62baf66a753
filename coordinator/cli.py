"""`coordinator`: drives the fleet and keeps every run in its store. Each command's module is
imported only when that command runs (shared.io.app): the coordinator never imports MLX.

Exit codes: 0 ok, 1 partial failure (a host or cell failed), 2 usage error, 130 interrupted.
"""

from __future__ import annotations

from shared.io.app import LazyCommand, fleet_app

COMMANDS = [
    LazyCommand(
        "runs",
        "coordinator.commands.runs:runs",
        "The stored runs, newest first, with their hosts and ok/failed cell counts.",
    ),
    LazyCommand(
        "show",
        "coordinator.commands.runs:show",
        "A stored run's report, as `coordinator benchmark` printed it.",
    ),
    LazyCommand(
        "compare",
        "coordinator.commands.runs:compare",
        "Per-test speed-up of B over A (tok/s B / tok/s A): runs or `agent bench` JSON files.",
    ),
    LazyCommand(
        "benchmark",
        "coordinator.commands.benchmark:benchmark",
        "Run one benchmark matrix on every host at once; one table, the fastest host marked.",
    ),
    LazyCommand(
        "resume",
        "coordinator.commands.benchmark:resume",
        "Finish a run whose coordinator stopped (killed, asleep, Ctrl-C): reconnect to every "
        "host whose job it recorded, fetch every cell the run lacks from the agent's journal, "
        "follow a job still running to its end, and print the completed table. No cell is "
        "kept twice.",
    ),
    LazyCommand(
        "cancel",
        "coordinator.commands.benchmark:cancel",
        "Cancel benchmark jobs: those of RUN on each of its hosts, or whatever job runs on "
        "--hosts. Each host is reported cancelled, not running (the job had ended), none (no "
        "job ran) or unreachable. The cells finished so far stay in the agents' journals.",
    ),
    LazyCommand(
        "status",
        "coordinator.commands.status:status",
        "Each agent: reachable or not, version, device, memory, temperature, running job.",
    ),
    LazyCommand(
        "deploy",
        "coordinator.commands.deploy:deploy_command",
        "Install agents on many hosts over ssh: virtualenv, package, trust, service, keys.",
    ),
    LazyCommand(
        "doctor",
        "coordinator.commands.doctor:doctor_command",
        "Each agent's `agent doctor` (Python, MLX, a 1 s benchmark, every thermal source, ports, "
        "service, firewall...), as its service sees its Mac, in one table.",
    ),
    LazyCommand(
        "monitor",
        "coordinator.commands.monitor:monitor",
        "Live thermal dashboard of every agent; everything heard is recorded.",
    ),
    LazyCommand(
        "policy",
        "coordinator.commands.policy:policy",
        "Show each host's cooling policy, or push thresholds to every host.",
    ),
    LazyCommand(
        "history",
        "coordinator.commands.history:history",
        "Per host from the recorded telemetry: min / mean / max °C, time at or above each "
        "threshold of the policy in force, time paused, pauses and stops, energy and mean power.",
    ),
    LazyCommand(
        "keys",
        "coordinator.commands.keys:keys_app",
        "This coordinator's CURVE key and the agents' keys it expects.",
    ),
]

app = fleet_app(
    "coordinator",
    "mlx-fleet coordinator: one benchmark across many Macs, one table, every run kept.",
    COMMANDS,
)


def main() -> None:
    app()
