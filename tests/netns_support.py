"""A small lab of "Macs" in network namespaces for tests: each host its own namespace and
address, every host's veth plugged into a bridge in a hub namespace, where the coordinator
runs. Cutting a host's link (its veth's hub end down) cuts it from the coordinator and from
every peer at once, as pulling its cable would.

The /24 exists only inside the namespaces the lab creates; everything is deleted afterwards.
Needs root and `ip`; a test skips with the reason where the lab cannot be made.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import pytest

SUBNET = "10.254.91.{}"
HUB_ADDRESS = SUBNET.format(254)


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def in_ns(namespace: str, *command: str) -> list[str]:
    """`command`'s argv run inside network namespace `namespace`."""
    return ["ip", "netns", "exec", namespace, *command]


@contextmanager
def wired_namespaces(names: Iterable[str], steps: Sequence[tuple[str, ...]]) -> Iterator[None]:
    """Network namespaces `names`, made and then wired by `ip STEP` for each of `steps`;
    deleted afterwards. The test skips, saying why, where one cannot be made or wired."""
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed")
    created: list[str] = []
    try:
        for name in names:
            made = ip("netns", "add", name)
            if made.returncode != 0:
                pytest.skip(f"cannot create a network namespace: {made.stderr.strip()}")
            created.append(name)
        for step in steps:
            done = ip(*step)
            if done.returncode != 0:
                pytest.skip(f"cannot wire the namespaces (ip {' '.join(step)}): {done.stderr}")
        yield
    finally:
        for name in created:
            ip("netns", "del", name)


@dataclass(frozen=True)
class Lab:
    hub: str
    """The hub's namespace: the coordinator runs there."""
    namespaces: dict[str, str]
    addresses: dict[str, str]
    hub_ends: dict[str, str]
    """Each host's veth end in the hub (on the bridge)."""
    host_ends: dict[str, str]
    """The other end of each host's veth, in its own namespace."""

    def cut(self, host: str) -> None:
        """Pull `host`'s cable: its hub end down."""
        done = ip("-n", self.hub, "link", "set", self.hub_ends[host], "down")
        assert done.returncode == 0, done.stderr

    def slow_link(self, host: str, peer: str, delay_ms: int = 40) -> str:
        """Slow what `host` sends to `peer` alone (one way of one link; the hub and the other
        peers untouched): an htb class that only `peer`'s address goes to, and under it `tc
        netem delay`. A kernel without sch_netem (this VM's: `Specified qdisc kind is
        unknown`) gets that class held at 500 kbit/s instead, a 4 KiB message then taking
        about 66 ms. Returns which it did."""
        device = self.host_ends[host]

        def tc(*args: str) -> subprocess.CompletedProcess[str]:
            argv = ["ip", "netns", "exec", self.namespaces[host], "tc", *args[:2], "dev", device]
            argv += args[2:]  # before the qdisc's kind: what follows it is the kind's
            return subprocess.run(argv, capture_output=True, text=True, timeout=30)

        slow = ("parent", "1:", "classid", "1:20", "htb")
        for step in (
            ("qdisc", "add", "root", "handle", "1:", "htb", "default", "10"),
            ("class", "add", "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit"),
            ("class", "add", *slow, "rate", "10gbit"),
            ("filter", "add", "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match",
             "ip", "dst", f"{self.addresses[peer]}/32", "flowid", "1:20"),
        ):  # fmt: skip
            done = tc(*step)
            if done.returncode != 0:
                pytest.skip(f"cannot shape a link (tc {' '.join(step)}): {done.stderr.strip()}")
        if tc("qdisc", "add", "parent", "1:20", "netem", "delay", f"{delay_ms}ms").returncode == 0:
            return f"netem delay {delay_ms}ms"
        held = tc("class", "change", *slow, "rate", "500kbit", "burst", "1600", "cburst", "1600")
        assert held.returncode == 0, held.stderr
        return "htb rate 500kbit (no netem in this kernel)"

    def run(self, argv: Sequence[str], **options: object) -> subprocess.CompletedProcess[str]:
        """`argv` in the hub's namespace (the coordinator's)."""
        return subprocess.run(in_ns(self.hub, *argv), **options)  # type: ignore[call-overload]

    def popen(self, argv: Sequence[str], **options: object) -> subprocess.Popen[str]:
        return subprocess.Popen(in_ns(self.hub, *argv), **options)  # type: ignore[call-overload]


@contextmanager
def lab(hosts: Sequence[str]) -> Iterator[Lab]:
    """Hosts `hosts` (short names), each at SUBNET.1, .2, … in its own namespace, all on one
    bridge in the hub (HUB_ADDRESS)."""
    tag = f"mlxg{os.getpid() % 100000}"
    hub = f"{tag}-hub"
    namespaces = {host: f"{tag}-{host}" for host in hosts}
    addresses = {host: SUBNET.format(index) for index, host in enumerate(hosts, start=1)}
    hub_ends = {host: f"{tag}h{index}" for index, host in enumerate(hosts, start=1)}
    host_ends = {host: f"{tag}v{index}" for index, host in enumerate(hosts, start=1)}
    steps: list[tuple[str, ...]] = [
        ("-n", hub, "link", "add", "br0", "type", "bridge"),
        ("-n", hub, "addr", "add", f"{HUB_ADDRESS}/24", "dev", "br0"),
        ("-n", hub, "link", "set", "br0", "up"),
        ("-n", hub, "link", "set", "lo", "up"),
    ]
    for host in hosts:
        inside = host_ends[host]
        steps += [
            ("link", "add", hub_ends[host], "netns", hub, "type", "veth", "peer", "name",
             inside, "netns", namespaces[host]),
            ("-n", hub, "link", "set", hub_ends[host], "master", "br0"),
            ("-n", hub, "link", "set", hub_ends[host], "up"),
            ("-n", namespaces[host], "addr", "add", f"{addresses[host]}/24", "dev", inside),
            ("-n", namespaces[host], "link", "set", inside, "up"),
            ("-n", namespaces[host], "link", "set", "lo", "up"),
        ]  # fmt: skip
    with wired_namespaces((hub, *namespaces.values()), steps):
        yield Lab(hub, namespaces, addresses, hub_ends, host_ends)
