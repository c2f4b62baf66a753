"""The environment one rank of a distributed MLX job starts with, written as `mlx.launch`
writes it (mlx/_distributed_utils/launch.py, launch_ring and launch_jaccl, MLX 0.32), so that
a rank an agent starts is the rank mlx.launch would have started over ssh:

- ring: MLX_HOSTFILE names a JSON file, one list of "ip:port" per rank, the ports counted up
  from the starting port, one per rank and address in rank order; MLX_RANK is the rank.
- JACCL: MLX_IBV_DEVICES names a JSON file, each rank's RDMA device towards every other rank
  (null towards itself); MLX_JACCL_COORDINATOR is rank 0's first address at the starting port;
  MLX_RANK is the rank.

Pure: the agent writes the files and starts the process.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

RING, JACCL, AUTO = "ring", "jaccl", "auto"
BACKENDS = (RING, JACCL, AUTO)
DEFAULT_STARTING_PORT = 32323
"""mlx.launch's --starting-port default."""
JACCL_NEEDS = "JACCL needs macOS 26.2 or later, Thunderbolt 5 and RDMA enabled"


class RankEnvError(ValueError):
    """A group that cannot be launched as given: one line naming the member and the problem."""


@dataclass(frozen=True)
class Member:
    """One host of a group as its rank sees the others: the addresses its peers reach it at,
    and (JACCL) its RDMA device towards each rank, None towards itself."""

    name: str
    ips: tuple[str, ...]
    rdma: tuple[str | None, ...] = ()


@dataclass(frozen=True)
class RankLaunch:
    """What to start rank `rank` with: `files` maps an environment variable to the content of
    the file it names; `env` are plain variables."""

    rank: int
    env: dict[str, str]
    files: dict[str, str]


def ring_hostfile(members: Sequence[Member], starting_port: int) -> list[list[str]]:
    """mlx.launch's ring hostfile: rank by rank, each of its addresses at the next port."""
    port = starting_port
    ranks = []
    for member in members:
        if not member.ips:
            raise RankEnvError(f"{member.name}: the ring backend needs its IP address")
        addresses = []
        for ip in member.ips:
            addresses.append(address(ip, port))
            port += 1
        ranks.append(addresses)
    if port - 1 > 65535:
        raise RankEnvError(f"ports {starting_port}…{port - 1} run past 65535")
    return ranks


def address(ip: str, port: int) -> str:
    """A hostfile's "ip:port", an IPv6 address bracketed."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def ring_hostfile_at(members: Sequence[Member], ports: Sequence[Sequence[int]]) -> list[list[str]]:
    """A ring hostfile whose ports each rank chose itself (`ports`: rank by rank, one per
    address, as the ranks shared them), not counted up from one starting port."""
    ranks = []
    for member, chosen in zip(members, ports, strict=True):
        if not member.ips:
            raise RankEnvError(f"{member.name}: the ring backend needs its IP address")
        if len(chosen) != len(member.ips) or not all(0 < port <= 65535 for port in chosen):
            raise RankEnvError(f"{member.name}: ports {list(chosen)} for {len(member.ips)} IPs")
        ranks.append([address(ip, port) for ip, port in zip(member.ips, chosen, strict=True)])
    return ranks


def ports_used(members: Sequence[Member], starting_port: int) -> range:
    """The ports a ring over `members` listens on (for the firewall and for docs)."""
    return range(starting_port, starting_port + sum(len(member.ips) for member in members))


def listens_on(
    members: Sequence[Member], rank: int, backend: str, starting_port: int
) -> list[tuple[str, int]]:
    """The addresses rank `rank` listens on: a ring rank on its own hostfile entries, JACCL's
    rank 0 on the coordinator address (the other JACCL ranks only connect)."""
    if backend == RING:
        port = starting_port + sum(len(member.ips) for member in members[:rank])
        return [(ip, port + i) for i, ip in enumerate(members[rank].ips)]
    if backend == JACCL and rank == 0 and members[0].ips:
        return [(members[0].ips[0], starting_port)]
    return []


def jaccl_devices(members: Sequence[Member]) -> list[list[str | None]]:
    """mlx.launch's checks of a JACCL hostfile: one device per rank, None towards itself,
    a device towards every other rank."""
    count = len(members)
    for rank, member in enumerate(members):
        if len(member.rdma) != count:
            raise RankEnvError(
                f"{member.name}: {len(member.rdma)} RDMA devices listed for {count} ranks"
            )
        if member.rdma[rank] is not None:
            raise RankEnvError(f"{member.name}: its RDMA device towards itself must be null")
        missing = [
            members[peer].name for peer in range(count) if peer != rank and not member.rdma[peer]
        ]
        if missing:
            raise RankEnvError(f"{member.name}: no RDMA device towards {', '.join(missing)}")
    if not members[0].ips:
        raise RankEnvError(f"{members[0].name}: rank 0 needs an IP address the others reach")
    return [list(member.rdma) for member in members]


def rank_launch(
    members: Sequence[Member], rank: int, backend: str, starting_port: int = DEFAULT_STARTING_PORT
) -> RankLaunch:
    """Rank `rank`'s environment for `backend` (ring or jaccl; `auto` is resolved before, by
    chosen_backend)."""
    if len(members) < 2:
        raise RankEnvError("a distributed group needs at least two members")
    if not 0 <= rank < len(members):
        raise RankEnvError(f"rank {rank} is outside 0…{len(members) - 1}")
    if backend == RING:
        hostfile = json.dumps(ring_hostfile(members, starting_port))
        return RankLaunch(rank, {"MLX_RANK": str(rank)}, {"MLX_HOSTFILE": hostfile})
    if backend == JACCL:
        devices = json.dumps(jaccl_devices(members))
        first = members[0].ips[0]
        coordinator = f"[{first}]:{starting_port}" if ":" in first else f"{first}:{starting_port}"
        env = {"MLX_RANK": str(rank), "MLX_JACCL_COORDINATOR": coordinator}
        return RankLaunch(rank, env, {"MLX_IBV_DEVICES": devices})
    raise RankEnvError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")


JACCL_MACOS = (26, 2)


def backends_of(machine: Mapping[str, object], rdma_given: bool) -> list[str]:
    """The backends a host can run, from its agent's `info` machine map: the ring anywhere
    MLX runs; JACCL on macOS 26.2 or later where the hostfile names its RDMA devices."""
    found = [RING]
    version = machine.get("macos_version")
    if rdma_given and isinstance(version, str):
        parts = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
        if parts >= JACCL_MACOS:
            found.append(JACCL)
    return found


def chosen_backend(wanted: str, available: Mapping[str, Sequence[str]]) -> str:
    """`wanted` checked against the backends each member's MLX has (member name → names);
    `auto` is JACCL where every member has it (RDMA over Thunderbolt 5), else ring."""
    if wanted == AUTO:
        return JACCL if all(JACCL in each for each in available.values()) else RING
    if wanted not in (RING, JACCL):
        raise RankEnvError(f"unknown backend {wanted!r}; choose from {', '.join(BACKENDS)}")
    lacking = [name for name, each in available.items() if wanted not in each]
    if lacking:
        raise RankEnvError(f"{', '.join(lacking)}: no {wanted} backend ({JACCL_NEEDS})")
    return wanted
