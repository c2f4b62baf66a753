"""Is `coordinator stage` as fast as a plain scp of the same directory over the same link, and
does its tree cost what docs/staging.md says?

Network namespaces (tests/netns_support.py: each host its own namespace, one bridge), every
uplink shaped with `tc tbf` to --rate-mbit, a generated mlx-lm model directory of --size-mb
(tests/staging_support.py) on the source:

1. One link, side by side in rotating rounds: `scp -r` of the directory from the source to a
   host running sshd (OpenSSH's default cipher: encrypted, as staging is over CURVE), against
   `coordinator stage DIR` from the source to an agent on the same host (each round a new id,
   so nothing is held). Printed: each side's MB/s, median (min–max), and stage / scp round by
   round (target ≥ 0.9). The stage's copy time is the receiving agent's own (its task, the
   connection and the manifest included); the whole command's time (it starts the origin agent
   and hashes the model first) is printed beside it.
2. (not with --quick) The tree: the source and 7 hosts, one stage: the bytes that left the
   source's interface over the model's size (target ≤ 1.1), the tree's time over ⌈log₂8⌉
   copies' time at the link rate (target ≤ 1.3), each copy's rate over the link's (≥ 0.8).

    python bench/bench_staging.py [--size-mb 200] [--rate-mbit 80] [--repeats 3] [--quick]

Needs root, iproute2's `ip` and `tc`, and OpenSSH's sshd and scp. Nothing is asserted.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from support import BenchError, interleave, machine, parser, round_count, run, spread

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the namespace lab and the model are the tests' own

from shared.io.trust import trust  # noqa: E402
from tests.fleet_support import AgentPool  # noqa: E402
from tests.netns_support import Lab, lab  # noqa: E402
from tests.staging_support import sent_bytes, shape, write_model_dir  # noqa: E402

BIN = Path(sys.executable).parent
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
TREE_HOSTS = [f"h{index}" for index in range(1, 8)]
MB = 1e6


def coordinator(made: Lab, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`coordinator ARGS` in the source's namespace, with its own data dir."""
    return subprocess.run(
        ["ip", "netns", "exec", made.namespaces["src"], str(BIN / "coordinator"), *args],
        capture_output=True, text=True, timeout=1800,
        env=dict(os.environ, MLX_FLEET_HOME=str(home), COLUMNS="200"),
    )  # fmt: skip


def start_agents(made: Lab, pool: AgentPool, root: Path, hosts: list[str], home: Path) -> Path:
    """An agent per host (its own HF cache as its store), peers of each other, trusting this
    bench's coordinator; the hostfile naming them."""
    agents = {
        host: pool.start(
            host,
            netns=made.namespaces[host],
            bind_host=made.addresses[host],
            wrapper=["env", f"HF_HOME={root / host / 'hf'}", "HF_HUB_OFFLINE=1"],
        )
        for host in hosts
    }
    key = subprocess.run(
        [str(BIN / "coordinator"), "keys", "show"], capture_output=True, text=True,
        env=dict(os.environ, MLX_FLEET_HOME=str(home)), check=True,
    ).stdout.strip()  # fmt: skip
    for host, agent in agents.items():
        trusted = agent.home / "keys" / "trusted"
        trust(key, "bench", trusted)
        for other, peer in agents.items():
            if other != host:
                trust(peer.key or "", f"peer-{other}", trusted, peer.address)
    root.mkdir(parents=True, exist_ok=True)
    hostfile = root / f"hosts-{len(hosts)}.json"
    entries = [
        {"host": agent.address.rsplit(":", 1)[0], "port": agent.port, "key": agent.key}
        for agent in agents.values()
    ]
    hostfile.write_text(json.dumps({"hosts": entries}))
    return hostfile


def start_sshd(made: Lab, root: Path, host: str) -> tuple[list[str], subprocess.Popen[str]]:
    """sshd in `host`'s namespace on port 22 of its address; the scp command line that reaches
    it from the source (its key, no known_hosts)."""
    folder = root / "sshd"
    folder.mkdir()
    client_key, host_key = folder / "client_key", folder / "host_key"
    for key in (client_key, host_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (folder / "authorized_keys").write_text(client_key.with_suffix(".pub").read_text())
    config = folder / "sshd_config"
    config.write_text(
        f"ListenAddress {made.addresses[host]}\nHostKey {host_key}\n"
        f"AuthorizedKeysFile {folder / 'authorized_keys'}\nPidFile {folder / 'sshd.pid'}\n"
        "PermitRootLogin yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "StrictModes no\nUsePAM no\nLogLevel ERROR\nSubsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)
    server = subprocess.Popen(
        ["ip", "netns", "exec", made.namespaces[host], SSHD, "-D", "-e", "-f", str(config)],
        stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    scp = [
        "ip", "netns", "exec", made.namespaces["src"], "scp", "-q", "-r", "-i", str(client_key),
        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
        "-o", "BatchMode=yes",
    ]  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        probe = subprocess.run(
            [*scp, str(config), f"root@{made.addresses[host]}:{folder / 'probe'}"],
            capture_output=True,
        )
        if probe.returncode == 0:
            return scp, server
        time.sleep(0.3)
    server.kill()
    raise BenchError(f"sshd in the host's namespace did not come up: {probe.stderr[-300:]!r}")


def one_link(size_mb: float, rate_bits: int, repeats: int, root: Path) -> None:
    model = root / "model"
    size = write_model_dir(model, size_mb)
    home = root / "coordinator"
    with ExitStack() as stack:
        made = stack.enter_context(_lab(["src", "dst"]))
        shape(made, rate_bits)
        pool = AgentPool(root / "agents")
        stack.callback(pool.kill_all)
        hostfile = start_agents(made, pool, root, ["dst"], home)
        scp, server = start_sshd(made, root, "dst")
        stack.callback(server.kill)
        rounds = iter(range(10**6))
        walls: list[float] = []

        def by_scp() -> float:
            target = root / f"scp-{next(rounds)}"
            began = time.perf_counter()
            done = subprocess.run(
                [*scp, str(model), f"root@{made.addresses['dst']}:{target}"],
                capture_output=True, text=True,
            )  # fmt: skip
            elapsed = time.perf_counter() - began
            if done.returncode != 0:
                raise BenchError(f"scp failed: {done.stderr[-500:]}")
            shutil.rmtree(target, ignore_errors=True)
            return size / elapsed

        def by_stage() -> float:
            name = f"bench/model-{next(rounds)}"
            began = time.perf_counter()
            done = coordinator(
                made, home, "stage", str(model), "--as", name, "--hostfile", str(hostfile),
                "-o", "json",
            )  # fmt: skip
            walls.append(time.perf_counter() - began)
            if done.returncode != 0:
                raise BenchError(f"coordinator stage failed: {done.stderr[-800:]}")
            (row,) = json.loads(done.stdout)["hosts"]
            return (row["bytes"] - row["resumed"]) / row["seconds"]

        measured = interleave({"scp": by_scp, "stage": by_stage}, repeats)
    link = rate_bits / 8
    print(f"one link, {size / MB:.1f} MB model, shaped to {rate_bits / 1e6:g} Mbit/s "
          f"({link / MB:.2f} MB/s), {repeats} round(s):")  # fmt: skip
    print(f"  scp -r                MB/s {spread(measured.figures('scp'), 1 / MB)}")
    print(f"  coordinator stage     MB/s {spread(measured.figures('stage'), 1 / MB)}")
    print(f"  stage / scp           {spread(measured.ratios('stage', 'scp'))}  (target >= 0.9)")
    print(f"  stage / link rate     {spread([v / link for v in measured.figures('stage')])}")
    print(f"  whole stage command   s {spread(walls)} (origin agent started, model hashed)")


def tree(size_mb: float, rate_bits: int, root: Path) -> None:
    model = root / "tree-model"
    size = write_model_dir(model, size_mb)
    home = root / "tree-coordinator"
    with ExitStack() as stack:
        made = stack.enter_context(_lab(["src", *TREE_HOSTS]))
        shape(made, rate_bits)
        pool = AgentPool(root / "tree-agents")
        stack.callback(pool.kill_all)
        hostfile = start_agents(made, pool, root / "tree", TREE_HOSTS, home)
        before = sent_bytes(made, "src")
        began = time.perf_counter()
        done = coordinator(
            made, home, "stage", str(model), "--as", "bench/tree", "--hostfile", str(hostfile),
            "-o", "json",
        )  # fmt: skip
        wall = time.perf_counter() - began
        sent = sent_bytes(made, "src") - before
    if done.returncode != 0:
        raise BenchError(f"coordinator stage failed: {done.stderr[-800:]}")
    report = json.loads(done.stdout)
    copy_s = size * 8 / rate_bits
    rounds = math.ceil(math.log2(len(TREE_HOSTS) + 1))
    shares = [
        (row["bytes"] - row["resumed"]) / row["seconds"] / (rate_bits / 8)
        for row in report["hosts"]
    ]
    print(f"tree, source + {len(TREE_HOSTS)} hosts, {size / MB:.1f} MB model, "
          f"{rate_bits / 1e6:g} Mbit/s links (one copy {copy_s:.1f} s):")  # fmt: skip
    print(f"  left the source       {sent / size:.3f} x the model  (target <= 1.1)")
    tree_share = report["fan_out_s"] / (rounds * copy_s)
    print(f"  the tree              {report['fan_out_s']:.1f} s = {tree_share:.3f} x "
          f"{rounds} copies  (target <= 1.3)")  # fmt: skip
    print(
        f"  whole stage command   {wall:.1f} s = {wall / (rounds * copy_s):.3f} x {rounds} copies"
    )
    print(f"  copy / link rate      {spread(shares)}  (target >= 0.8 each)")
    print(f"  sources               {sorted(r['source'] for r in report['hosts'])}")


def _lab(hosts: list[str]):  # noqa: ANN202 - the tests' lab, its pytest.skip made a BenchError
    class _Lab:
        def __enter__(self) -> Lab:
            self.inner = lab(hosts)
            try:
                return self.inner.__enter__()
            except BaseException as exc:  # pytest's Skipped: no namespaces here
                if type(exc).__name__ == "Skipped":
                    raise BenchError(f"no network namespaces: {exc}") from None
                raise

        def __exit__(self, *exc: object) -> None:
            self.inner.__exit__(*exc)

    return _Lab()


def main() -> None:
    options = parser(__doc__)
    options.add_argument("--size-mb", type=float, default=None, help="the model (200; quick: 8)")
    options.add_argument("--rate-mbit", type=float, default=80.0, help="each link's rate")
    options.add_argument(
        "--only", choices=("link", "tree"), default=None, help="one of the two measurements"
    )
    opts = options.parse_args()
    if os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("ip", "tc", "scp")):
        raise BenchError("needs root, `ip`, `tc` and scp (network namespaces, shaped links)")
    size_mb = opts.size_mb or (8.0 if opts.quick else 200.0)
    rate_bits = int(opts.rate_mbit * 1e6)
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory(prefix="bench-staging-") as folder:
        if opts.only != "tree":
            one_link(size_mb, rate_bits, round_count(opts, 3), Path(folder))
        if not opts.quick and opts.only != "link":
            tree(size_mb, rate_bits, Path(folder))


if __name__ == "__main__":
    run(main)
