"""`agent`: the per-Mac command line (exit codes: shared.exit_codes). Each command's module is
imported only when that command runs (shared.io.app): only `agent bench` imports MLX."""

from __future__ import annotations

from shared.io.app import MATRIX_NAMES, LazyCommand, fleet_app

COMMANDS = [
    LazyCommand(
        "bench",
        "agent.commands.bench:bench",
        "Benchmark prompt processing and generation over llama-bench's matrix, on this Mac.",
        examples=(
            "agent bench --config-small -p 32,64 -n 16 -r 2     # a quick smoke test",
            "agent bench -p 512 -n 128 -d 0,4096 --bits 4,8",
            "agent bench --model mlx-community/Llama-3.2-1B-Instruct-4bit -n 0",
            "agent bench --config-small -r auto --precision 2% -o md",
            "agent bench --config-small -o sql | sqlite3 results.db",
            "agent bench --config-small --sustain 20m --power-source auto",
            "agent bench --config-small --concurrency 1,4 --request-rate 2 -p 32 -n 16",
            "agent bench --serve mlx_lm --model ~/models/qwen --concurrency 1,4",
            "agent bench --serve-url http://127.0.0.1:8080 --concurrency 1,4,16",
        ),
        note=MATRIX_NAMES,
    ),
    LazyCommand(
        "temp",
        "agent.commands.temp:temp_command",
        "Show the SoC temperature, its source, the pressure level and the cooling policy's state.",
        examples=(
            "agent temp",
            "agent temp --watch --interval 2",
            "agent temp --watch --count 10 -o json     # one JSON line per reading",
        ),
    ),
    LazyCommand(
        "run",
        "agent.commands.run:run_command",
        "Run CMD in its own process group under the cooling policy.",
        {"allow_interspersed_args": False},
    ),
    LazyCommand(
        "calibrate",
        "agent.commands.calibrate:calibrate_command",
        "Learn where this Mac throttles (a sustained MLX load, then held below it) and keep it "
        "as its calibrated policy.",
        examples=(
            "agent calibrate                       # 30 minutes, the sensor auto picks",
            "agent calibrate --minutes 45 -o json",
            "agent calibrate --thermal-source sim:plant:air,speed=60 --minutes 1",
        ),
    ),
    LazyCommand(
        "install",
        "agent.commands.service:install_command",
        "Install `agent serve` as a launchd (macOS) or systemd (Linux) service and start it.",
        examples=(
            "agent install --dry-run              # print the definition, change nothing",
            "agent install --bind 0.0.0.0:5555",
            "agent install --system --sudo",
        ),
    ),
    LazyCommand(
        "uninstall",
        "agent.commands.service:uninstall_command",
        "Stop and remove the agent service (every loaded copy); data is kept unless --purge.",
        examples=("agent uninstall", "agent uninstall --purge      # its data and keys too"),
    ),
    LazyCommand(
        "service-status",
        "agent.commands.service:service_status_command",
        "Is the agent service installed and running? Its pid, last exit status and logs.",
        examples=("agent service-status", "agent service-status --system -o json"),
    ),
    LazyCommand(
        "doctor",
        "agent.commands.doctor:doctor_command",
        "Python, MLX and its device, a 1-second benchmark, every thermal source side by side, "
        "thermal pressure, the data directory and keys, the ports, the service, the firewall (for "
        "the image that listens: a framework Python's Python.app), FileVault and Login Items.",
        examples=(
            "agent doctor",
            "agent doctor --load 60        # does each sensor move under an MLX load?",
            "agent doctor --capture mac.jsonl --seconds 60    # for a bug report",
            "agent doctor -o json",
        ),
    ),
    LazyCommand(
        "serve",
        "agent.commands.serve:serve_command",
        "Serve coordinators over ZeroMQ until SIGTERM: benchmarks, info, job history, and "
        "thermal telemetry.",
        examples=(
            "agent serve --bind 0.0.0.0:5555",
            "agent serve --bind 0.0.0.0:5555 --prometheus 0.0.0.0:9100",
            "agent serve --thermal-source sim --name lab-sim",
        ),
    ),
    LazyCommand(
        "models",
        "agent.commands.models:models_app",
        "The models this Mac holds: staged, downloaded, partly staged.",
        examples=(
            "agent models list            # also what `agent models` alone prints",
            "agent models list --verify -o json",
            "agent models remove mlx-community/Llama-3.2-1B-Instruct-4bit",
        ),
    ),
    LazyCommand(
        "keys",
        "agent.commands.keys:keys_app",
        "This agent's CURVE key and the coordinator keys it trusts.",
        examples=(
            "agent keys show",
            'agent keys trust "$(coordinator keys show)" --name laptop',
            "agent keys list -o json",
            "agent keys revoke laptop",
        ),
    ),
]

app = fleet_app(
    "agent",
    "mlx-fleet agent: true MLX benchmarks and thermal safety on this Mac.",
    COMMANDS,
    (
        "agent doctor                  # can this machine run the agent?",
        "agent bench --config-small -p 32,64 -n 16",
        "agent temp --watch",
        "agent run -- python train.py",
        "agent install",
        "agent bench -h                # any command's options and examples",
        "agent --install-completion    # tab completion in this shell",
    ),
)


def main() -> None:
    app()
