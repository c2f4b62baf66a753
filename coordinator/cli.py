"""`coordinator`: drives the fleet and keeps every run in its store. Each command's module is
imported only when that command runs (shared.io.app): the coordinator never imports MLX.

Exit codes: 0 ok, 1 partial failure (a host or cell failed), 2 usage error, 130 interrupted.
"""

from __future__ import annotations

from shared.io.app import MATRIX_NAMES, LazyCommand, fleet_app

COMMANDS = [
    LazyCommand(
        "runs",
        "coordinator.commands.runs:runs",
        "The stored runs, newest first, with their hosts and ok/failed cell counts.",
        examples=("coordinator runs", "coordinator runs --limit 5 -o json"),
    ),
    LazyCommand(
        "show",
        "coordinator.commands.runs:show",
        "A stored run's report, as `coordinator benchmark` printed it.",
        examples=(
            "coordinator show r-20261203-1640         # a unique prefix of an id will do",
            "coordinator show r-20261203-1640 -o md --output run.md",
        ),
    ),
    LazyCommand(
        "compare",
        "coordinator.commands.runs:compare",
        "Per-test speed-up of B over A (tok/s B / tok/s A): runs or `agent bench` JSON files.",
        examples=(
            "coordinator compare r-20261203-1640 r-20261204-0910",
            "coordinator compare r-20261203-1640 r-20261204-0910 --by model,host -o md",
            "coordinator compare before.json after.json   # two `agent bench -o json`",
        ),
    ),
    LazyCommand(
        "health",
        "coordinator.commands.health:health",
        "Which Mac is sick: each host of a stored benchmark run against its family and its own "
        "past, flagged out-of-family or degraded and cordoned (docs/performance.md, Fleet "
        "health).",
        examples=(
            "coordinator health                      # the latest benchmark run",
            "coordinator health r-20261203-1640 -o json",
            "coordinator health --no-record          # judge, cordon nobody",
        ),
    ),
    LazyCommand(
        "canary",
        "coordinator.commands.canary:canary_command",
        "The speed delta after a rollout (after / before - 1) with a 95 % interval, over the "
        "valid cells both sides ran.",
        examples=(
            "coordinator canary --hosts mac1,mac2,mac3,mac4 --split macos   # runs tg128",
            "coordinator canary --runs r-20261203-1640 --split macos",
            "coordinator canary --runs r-20261203-1640,r-20261204-0910 --split mlx",
        ),
    ),
    LazyCommand(
        "uncordon",
        "coordinator.commands.health:uncordon_command",
        "Lift a host's conditions, so the next matrix and group run it again.",
        examples=("coordinator uncordon mac3",),
    ),
    LazyCommand(
        "export",
        "coordinator.commands.export:export",
        "Stored runs as llama-bench's rows, for llama.cpp's compare-llama-bench.py.",
        examples=(
            "coordinator export r-20261203-1640 r-20261204-0910 --label old --label new",
            "compare-llama-bench.py -i llama-bench.sqlite -b old -c new",
            "coordinator export r-20261203-1640 -o jsonl --label macos-24A335 > run.jsonl",
        ),
    ),
    LazyCommand(
        "publish",
        "coordinator.commands.publish:publish",
        "A stored run as one signed, self-describing bundle and its Markdown.",
        examples=(
            "coordinator publish r-20261203-1640 --out results/",
            "coordinator verify results/r-20261203-1640.bundle.json --key KEY",
        ),
    ),
    LazyCommand(
        "verify",
        "coordinator.commands.publish:verify",
        "Check a published bundle: its signature and every figure from its samples.",
        examples=(
            "coordinator verify r-20261203-1640.bundle.json",
            "coordinator verify r-20261203-1640.bundle.json --key KEY -o json",
        ),
    ),
    LazyCommand(
        "benchmark",
        "coordinator.commands.benchmark:benchmark",
        "Run one benchmark matrix on every host at once; one table, the fastest host marked.",
        examples=(
            "coordinator benchmark --config-small -p 32,64 -n 16   # on a local agent",
            "coordinator benchmark --hosts mac1,mac2 -p 512 -n 128 -d 0,4096 --bits 4,8",
            "coordinator benchmark --hostfile hosts.json -r auto -o json --output r.json",
            "coordinator benchmark --hosts mac1,mac2 --sustain 20m --plot out.png",
            "coordinator benchmark --hosts mac1,mac2,mac1+mac2 -p 512 -n 128   # a group",
            "coordinator benchmark --hosts mac1,mac2 --concurrency 1,4,16 -p 512 -n 128",
            "coordinator benchmark --hosts a+b --serve mlx_lm --model M --concurrency 4",
        ),
        note=MATRIX_NAMES,
    ),
    LazyCommand(
        "resume",
        "coordinator.commands.benchmark:resume",
        "Finish a run whose coordinator stopped (killed, asleep, Ctrl-C): reconnect to every "
        "host whose job it recorded, fetch every cell the run lacks from the agent's journal, "
        "follow a job still running to its end, and print the completed table. No cell is "
        "kept twice.",
        examples=(
            "coordinator resume r-20261203-1640",
            "coordinator resume r-20261203-1640 -o json",
        ),
    ),
    LazyCommand(
        "cancel",
        "coordinator.commands.benchmark:cancel",
        "Cancel benchmark jobs: those of RUN on each of its hosts, or whatever job runs on "
        "--hosts. Each host is reported cancelled, not running (the job had ended), none (no "
        "job ran) or unreachable. The cells finished so far stay in the agents' journals.",
        examples=(
            "coordinator cancel r-20261203-1640",
            "coordinator cancel --hosts mac1,mac2 -o json",
        ),
    ),
    LazyCommand(
        "status",
        "coordinator.commands.status:status",
        "Each agent: reachable or not, version, device, memory, temperature, running job.",
        examples=(
            "coordinator status --hosts mac1,mac2",
            "coordinator status --hostfile hosts.json -o json",
        ),
    ),
    LazyCommand(
        "deploy",
        "coordinator.commands.deploy:deploy_command",
        "Install agents on many hosts over ssh: virtualenv, package, trust, service, keys.",
        examples=(
            "coordinator deploy --hosts mac1,mac2 --dry-run    # the script, run nothing",
            "coordinator deploy --hosts mac1,mac2",
            "coordinator deploy --hostfile hosts.json --ssh-user lab -o json",
        ),
    ),
    LazyCommand(
        "doctor",
        "coordinator.commands.doctor:doctor_command",
        "Each agent's `agent doctor` (Python, MLX, a 1 s benchmark, every thermal source, ports, "
        "service, firewall...), as its service sees its Mac, in one table.",
        examples=(
            "coordinator doctor --hosts mac1,mac2",
            "coordinator doctor --hostfile hosts.json -o json",
            "coordinator doctor --level 2 --hosts mac1,mac2",
            "coordinator doctor --level 3 --duration 5m --hosts mac1,mac2,mac3",
        ),
    ),
    LazyCommand(
        "monitor",
        "coordinator.commands.monitor:monitor",
        "Live thermal dashboard of every agent; everything heard is recorded.",
        examples=(
            "coordinator monitor --hosts mac1,mac2",
            "coordinator monitor --hosts mac1,mac2 --once -o json",
            "coordinator monitor --hostfile hosts.json --prometheus 0.0.0.0:9100",
        ),
    ),
    LazyCommand(
        "policy",
        "coordinator.commands.policy:policy",
        "Show each host's cooling policy, or push thresholds to every host.",
        examples=(
            "coordinator policy --hosts mac1,mac2",
            "coordinator policy --hosts mac1,mac2 --pause-temp 80 --stop-temp 95",
        ),
    ),
    LazyCommand(
        "calibrate",
        "coordinator.commands.calibrate:calibrate",
        "Have every host learn where it throttles (`agent calibrate` on each, at once).",
        examples=(
            "coordinator calibrate --hosts mac1,mac2",
            "coordinator calibrate --hosts mac1,mac2 --minutes 45 -o json",
        ),
    ),
    LazyCommand(
        "history",
        "coordinator.commands.history:history",
        "Per host from the recorded telemetry: min / mean / max °C, time at or above each "
        "threshold of the policy in force, time paused, pauses and stops, energy and mean power.",
        examples=(
            "coordinator history --since 2h",
            "coordinator history --hosts mac1 --since 1d --plot temps.png",
            "coordinator history --since 7d -o json",
        ),
    ),
    LazyCommand(
        "netbench",
        "coordinator.commands.netbench:netbench",
        "Link benchmark: MLX all_sum over the ring and send/recv over each link, slow link named.",
        examples=(
            "coordinator netbench --hosts mac1,mac2,mac3",
            "coordinator netbench --hosts mac1,mac2 --sizes 1K,1M,64M -r 10 -o json",
        ),
    ),
    LazyCommand(
        "stage",
        "coordinator.commands.stage:stage",
        "Copy a model to every host once, agent to agent as a tree (docs/staging.md).",
        examples=(
            "coordinator stage mlx-community/Llama-3.2-1B-4bit --hosts mac1,mac2,mac3",
            "coordinator stage ~/models/my-llama --as lab/my-llama --hosts mac1,mac2",
            "coordinator stage mlx-community/Qwen3-4B-4bit@main --hosts mac1,mac2 -o json",
            "coordinator benchmark --model lab/my-llama --hosts mac1,mac2 --stage",
        ),
    ),
    LazyCommand(
        "models",
        "coordinator.commands.stage:models",
        "The models every host holds, one table: present, partial (%), missing or mismatch.",
        examples=("coordinator models --hosts mac1,mac2", "coordinator models --verify -o json"),
    ),
    LazyCommand(
        "keys",
        "coordinator.commands.keys:keys_app",
        "This coordinator's CURVE key and the agents' keys it expects.",
        examples=(
            "coordinator keys show",
            'coordinator keys add mac1 "$(ssh mac1 agent keys show)"',
            "coordinator keys list -o json",
            "coordinator keys remove mac1",
        ),
    ),
]

app = fleet_app(
    "coordinator",
    "mlx-fleet coordinator: one benchmark across many Macs, one table, every run kept.",
    COMMANDS,
    (
        "coordinator benchmark --config-small -p 32,64 -n 16",
        "coordinator deploy --hosts mac1,mac2",
        "coordinator benchmark --hosts mac1,mac2 -p 512 -n 128",
        "coordinator runs",
        "coordinator monitor --hosts mac1,mac2",
        "coordinator benchmark -h            # any command's options and examples",
        "coordinator --install-completion    # tab completion in this shell",
    ),
)


def main() -> None:
    app()
