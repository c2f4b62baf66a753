"""`agent`: the per-Mac command line (exit codes: shared.exit_codes). Each command's module is
imported only when that command runs (shared.io.app): only `agent bench` imports MLX."""

from __future__ import annotations

from shared.io.app import LazyCommand, fleet_app

COMMANDS = [
    LazyCommand(
        "bench",
        "agent.bench_cli:bench",
        "Benchmark prompt processing and generation over llama-bench's matrix, on this Mac.",
    ),
    LazyCommand(
        "temp",
        "agent.thermal.cli:temp_command",
        "Show the SoC temperature, its source, the pressure level and the cooling policy's state.",
    ),
    LazyCommand(
        "run",
        "agent.run_cli:run_command",
        "Run CMD in its own process group under the cooling policy.",
        {"allow_interspersed_args": False},
    ),
    LazyCommand(
        "install",
        "agent.service_cli:install_command",
        "Install `agent serve` as a launchd (macOS) or systemd (Linux) service and start it.",
    ),
    LazyCommand(
        "uninstall",
        "agent.service_cli:uninstall_command",
        "Stop and remove the agent service (every loaded copy); data is kept unless --purge.",
    ),
    LazyCommand(
        "service-status",
        "agent.service_cli:service_status_command",
        "Is the agent service installed and running? Its pid, last exit status and logs.",
    ),
    LazyCommand(
        "doctor",
        "agent.doctor_cli:doctor_command",
        "Python, MLX and its device, a 1-second benchmark, every thermal source side by side, "
        "thermal pressure, the data directory and keys, the ports, the service, the firewall.",
    ),
    LazyCommand(
        "serve",
        "agent.serve_cli:serve_command",
        "Serve coordinators over ZeroMQ until SIGTERM: benchmarks, info, job history, and "
        "thermal telemetry.",
    ),
    LazyCommand(
        "keys",
        "agent.keys_cli:keys_app",
        "This agent's CURVE key and the coordinator keys it trusts.",
    ),
]

app = fleet_app(
    "agent", "mlx-fleet agent: true MLX benchmarks and thermal safety on this Mac.", COMMANDS
)


def main() -> None:
    app()
