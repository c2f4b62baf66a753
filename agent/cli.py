"""`agent`: the per-Mac command line (exit codes: shared.exit_codes). Each command's module is
imported only when that command runs (shared.io.app): only `agent bench` imports MLX."""

from __future__ import annotations

from shared.io.app import LazyCommand, fleet_app

COMMANDS = [
    LazyCommand(
        "bench",
        "agent.commands.bench:bench",
        "Benchmark prompt processing and generation over llama-bench's matrix, on this Mac.",
    ),
    LazyCommand(
        "temp",
        "agent.commands.temp:temp_command",
        "Show the SoC temperature, its source, the pressure level and the cooling policy's state.",
    ),
    LazyCommand(
        "run",
        "agent.commands.run:run_command",
        "Run CMD in its own process group under the cooling policy.",
        {"allow_interspersed_args": False},
    ),
    LazyCommand(
        "install",
        "agent.commands.service:install_command",
        "Install `agent serve` as a launchd (macOS) or systemd (Linux) service and start it.",
    ),
    LazyCommand(
        "uninstall",
        "agent.commands.service:uninstall_command",
        "Stop and remove the agent service (every loaded copy); data is kept unless --purge.",
    ),
    LazyCommand(
        "service-status",
        "agent.commands.service:service_status_command",
        "Is the agent service installed and running? Its pid, last exit status and logs.",
    ),
    LazyCommand(
        "doctor",
        "agent.commands.doctor:doctor_command",
        "Python, MLX and its device, a 1-second benchmark, every thermal source side by side, "
        "thermal pressure, the data directory and keys, the ports, the service, the firewall (for "
        "the image that listens: a framework Python's Python.app), FileVault and Login Items.",
    ),
    LazyCommand(
        "serve",
        "agent.commands.serve:serve_command",
        "Serve coordinators over ZeroMQ until SIGTERM: benchmarks, info, job history, and "
        "thermal telemetry.",
    ),
    LazyCommand(
        "keys",
        "agent.commands.keys:keys_app",
        "This agent's CURVE key and the coordinator keys it trusts.",
    ),
]

app = fleet_app(
    "agent", "mlx-fleet agent: true MLX benchmarks and thermal safety on this Mac.", COMMANDS
)


def main() -> None:
    app()
