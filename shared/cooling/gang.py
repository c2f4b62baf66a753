"""A distributed MLX job as one gang: who its ranks are, and the one cooling decision for all.

Pausing one rank of a job whose ranks meet in `all_sum` every step cools nothing: its peers
wait in the collective (busy-polling on the ring backend; on a Mac a GPU-stream collective that
waits too long is killed by Metal's command-buffer watchdog). So every rank lives under the most
severe state any rank's Mac asks for: pause when one asks, resume only when all allow, stop on
one stops all (docs/monitoring.md, "Distributed fine-tunes").

Pure: the identity is read from an environment and a file reader given by the caller; the
decision is a function of the members' last reports. The exchange is agent.cooling.gang.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from shared.cooling.policy import Action, CoolingState

MAX_WORLD = 256
"""The most ranks a gang may have (a lab's Macs; mlx.launch has no limit of its own)."""

MAX_GROUP_LENGTH = 64
GROUP_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

PEER_HOLD_POLLS = 10
"""Polls a member's last report holds the gang after the member fell silent (its agent down,
its link cut): as long as a missing reading holds a pause (shared.cooling.policy
MISSING_POLLS_TO_RESUME), so a cut never lets the gang run while a hot rank is parked, and a
member that never comes back never parks the gang for ever. A stop is final: it holds for good."""

RING, JACCL, MANUAL = "ring", "jaccl", "manual"
BACKENDS = (RING, JACCL, MANUAL)


class GangSpecError(ValueError):
    """The environment or options name a gang that cannot be: the message says what."""


@dataclass(frozen=True)
class GangIdentity:
    """Which job (`group`), which rank of how many (`world`), the address of each rank's Mac
    (`hosts`, "" where the launcher does not say: JACCL names rank 0's only) and the backend."""

    group: str
    rank: int
    world: int
    hosts: tuple[str, ...]
    backend: str

    def __post_init__(self) -> None:
        if not GROUP_PATTERN.fullmatch(self.group):
            raise GangSpecError(
                f"bad group {self.group!r}: use letters, digits, '.', '_' and '-' "
                f"(up to {MAX_GROUP_LENGTH}, starting with a letter or digit)"
            )
        if not 2 <= self.world <= MAX_WORLD:
            raise GangSpecError(f"a gang has 2 to {MAX_WORLD} ranks, not {self.world}")
        if not 0 <= self.rank < self.world:
            raise GangSpecError(f"rank {self.rank} is outside 0 to {self.world - 1}")
        if len(self.hosts) != self.world:
            raise GangSpecError(f"{len(self.hosts)} hosts for {self.world} ranks")

    @property
    def peers(self) -> tuple[str, ...]:
        """The other ranks' Macs that have an address, each once (two ranks may share a Mac)."""
        own = self.hosts[self.rank]
        return tuple(dict.fromkeys(h for h in self.hosts if h and h != own))

    def describe(self) -> str:
        hosts = ", ".join(h or "?" for h in self.hosts)
        return (
            f"rank {self.rank} of {self.world} in {self.backend} group {self.group} (hosts {hosts})"
        )

    @classmethod
    def from_wire(cls, body: Mapping[str, Any]) -> GangIdentity:
        """From a body shared.wire.agent_types.GangIdentity checked; GangSpecError when it
        is not a gang (a rank outside its world, hosts that do not match it)."""
        hosts = tuple(body["hosts"])
        return cls(body["group"], body["rank"], body["world"], hosts, body["backend"])

    def to_wire(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "rank": self.rank,
            "world": self.world,
            "hosts": list(self.hosts),
            "backend": self.backend,
        }


def _digest(*parts: str) -> str:
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def _rank(env: Mapping[str, str], world: int) -> int:
    text = env.get("MLX_RANK", "")
    try:
        return int(text)
    except ValueError:
        raise GangSpecError(f"MLX_RANK is {text!r}, not a rank of 0 to {world - 1}") from None


def _json_file(env: Mapping[str, str], name: str, read: Callable[[str], str]) -> Any:
    path = env[name]
    try:
        text = read(path)
    except OSError as exc:
        raise GangSpecError(f"{name} {path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise GangSpecError(f"{name} {path}: not UTF-8 text, so not a JSON hostfile") from None
    if not text.strip():
        return None  # mlx.launch writes an empty hostfile for a job on one host
    try:
        return json.loads(text)
    except ValueError as exc:
        raise GangSpecError(f"{name} {path}: not JSON ({exc})") from None


def _ring_host(entry: Any, index: int) -> str:
    """The address of rank `index` in a ring hostfile: the IP of its first "ip:port"."""
    if not (isinstance(entry, list) and entry and all(isinstance(a, str) for a in entry)):
        raise GangSpecError(f'MLX_HOSTFILE: rank {index} is not a list of "ip:port"')
    host, sep, port = entry[0].rpartition(":")
    if not (sep and host and port.isdigit()):
        raise GangSpecError(f'MLX_HOSTFILE: rank {index} has {entry[0]!r}, not "ip:port"')
    return host.strip("[]")


def from_environment(env: Mapping[str, str], read: Callable[[str], str]) -> GangIdentity | None:
    """The gang mlx.launch started this process into, from the variables it sets
    (mlx/_distributed_utils/launch.py: MLX_RANK with MLX_HOSTFILE for ring, a JSON list per
    rank of "ip:port"; MLX_JACCL_COORDINATOR "ip:port" and MLX_IBV_DEVICES, a JSON matrix of
    RDMA devices, one row per rank, for JACCL). None: not a distributed job, or one of one
    rank. GangSpecError when the variables are there but say nothing usable.

    The group is named by a digest of what every rank was given alike (the hostfile names each
    rank's ports, so two jobs on the same Macs differ)."""
    if "MLX_HOSTFILE" in env:
        ranks = _json_file(env, "MLX_HOSTFILE", read)
        if ranks is None:
            return None
        if not isinstance(ranks, list) or not ranks:
            raise GangSpecError("MLX_HOSTFILE: not a list of ranks")
        if len(ranks) == 1:
            return None
        hosts = tuple(_ring_host(entry, i) for i, entry in enumerate(ranks))
        group = f"ring-{_digest(json.dumps(ranks, sort_keys=True))}"
        return GangIdentity(group, _rank(env, len(ranks)), len(ranks), hosts, RING)
    if "MLX_JACCL_COORDINATOR" in env and "MLX_IBV_DEVICES" in env:
        devices = _json_file(env, "MLX_IBV_DEVICES", read)
        if not isinstance(devices, list) or not devices:
            raise GangSpecError("MLX_IBV_DEVICES: not a list with a row per rank")
        if len(devices) == 1:
            return None
        coordinator = env["MLX_JACCL_COORDINATOR"]
        host = coordinator.rpartition(":")[0].strip("[]")
        if not host:
            raise GangSpecError(f'MLX_JACCL_COORDINATOR is {coordinator!r}, not "ip:port"')
        group = f"jaccl-{_digest(coordinator, json.dumps(devices, sort_keys=True))}"
        hosts = (host,) + ("",) * (len(devices) - 1)
        return GangIdentity(group, _rank(env, len(devices)), len(devices), hosts, JACCL)
    return None


def from_options(group: str, ranks: int, rank: int | None, hosts: Iterable[str]) -> GangIdentity:
    """`agent run --group NAME --ranks N --rank R --rank-hosts H0,H1,...`: a gang for a launcher
    that sets nothing. Every rank's Mac must be named: the ranks find each other's agents there."""
    given = [h.strip() for h in hosts]
    if "" in given and len(given) > 1:
        raise GangSpecError(
            f"--rank-hosts item {given.index('') + 1} is empty: one HOST or HOST:PORT per rank"
        )
    listed = tuple(h for h in given if h)
    if rank is None:
        raise GangSpecError("--group needs --rank (or MLX_RANK in the environment)")
    if len(listed) != ranks:
        raise GangSpecError(
            f"--rank-hosts names {len(listed)} hosts for --ranks {ranks}: one per rank, in "
            "rank order"
        )
    return GangIdentity(group, rank, ranks, listed, MANUAL)


# --- the members' reports and the one decision ----------------------------------------------


@dataclass(frozen=True)
class MemberState:
    """What one rank's Mac asks for (its own cooling rule's state, the reading behind it) and
    when it said so, on that Mac's wall clock (`time`, which orders that rank's reports) and,
    once heard, on the listener's monotonic clock (`heard`: how fresh it is)."""

    rank: int
    host: str
    state: CoolingState
    applied: CoolingState
    """What the rank lives under now: the gang's verdict as that rank last applied it."""
    celsius: float | None
    source: str
    sensor: str | None
    time: float
    job: str = ""
    heard: float = 0.0
    duty: float | None = None
    """While the Mac asks for pace: the duty its controller wants, and its slice (s)."""
    slice_s: float | None = None

    def reading_text(self) -> str:
        """`104.0 °C (smc · TCMz)`: the reading behind the state, with its source and sensor."""
        where = self.source + (f" · {self.sensor}" if self.sensor else "")
        degrees = "no reading" if self.celsius is None else f"{self.celsius:.1f} °C"
        return f"{degrees} ({where})"

    def to_wire(self, now: float | None = None) -> dict[str, Any]:
        """The report as sent: `age_s` says how long ago its sender heard it (0 from the rank
        itself), so a report an agent kept is not taken for a fresh one."""
        return {
            "rank": self.rank,
            "host": self.host,
            "state": self.state.value,
            "applied": self.applied.value,
            "celsius": self.celsius,
            "source": self.source,
            "sensor": self.sensor,
            "time": self.time,
            "job": self.job,
            "age_s": 0.0 if now is None else max(0.0, now - self.heard),
            "duty": self.duty,
            "slice_s": self.slice_s,
        }

    @classmethod
    def from_wire(cls, body: Mapping[str, Any], now: float) -> MemberState:
        """From a body shared.wire.agent_types.GangMember checked, heard `age_s` before
        `now`."""
        return cls(
            rank=body["rank"],
            host=body["host"],
            state=CoolingState(body["state"]),
            applied=CoolingState(body["applied"]),
            celsius=body["celsius"],
            source=body["source"],
            sensor=body["sensor"],
            time=body["time"],
            job=body["job"],
            heard=now - body["age_s"],
            duty=body.get("duty"),
            slice_s=body.get("slice_s"),
        )


def merge(known: Mapping[int, MemberState], news: Iterable[MemberState]) -> dict[int, MemberState]:
    """`known` with each newer report taken, by rank; a stop is final: only a newer stop
    (saying it is applied now) replaces it."""
    merged = dict(known)
    for report in news:
        current = merged.get(report.rank)
        if current is None:
            merged[report.rank] = report
        elif current.state is CoolingState.STOP:
            if report.state is CoolingState.STOP and _newer(report, current):
                merged[report.rank] = report  # the same stop, now applied: its ack
        elif report.state is CoolingState.STOP or _newer(report, current):
            merged[report.rank] = report
    return merged


def _newer(report: MemberState, current: MemberState) -> bool:
    """Said later, or the same report heard more recently (relayed by another agent)."""
    return (report.time, report.heard) > (current.time, current.heard)


@dataclass(frozen=True)
class Verdict:
    """The state every rank lives under, the member that asks for it (None when all are ok),
    and the ranks whose reports no longer count (silent for PEER_HOLD_POLLS); under pace, the
    duty and slice every rank runs at (the lowest duty any member asks for, with its slice)."""

    state: CoolingState
    cause: MemberState | None
    silent: tuple[int, ...] = ()
    duty: float | None = None
    slice_s: float | None = None


def verdict(members: Mapping[int, MemberState], now: float, hold_s: float) -> Verdict:
    """The most severe state a member asks for, among reports heard within `hold_s` (a stop
    counts however old); ties go to the lowest rank, so every rank names the same cause."""
    worst: MemberState | None = None
    silent = []
    for rank in sorted(members):
        report = members[rank]
        if report.state is not CoolingState.STOP and now - report.heard > hold_s:
            silent.append(rank)
            continue
        if worst is None or report.state.severity > worst.state.severity:
            worst = report
    if worst is None or worst.state is CoolingState.OK:
        return Verdict(CoolingState.OK, None, tuple(silent))
    if worst.state is CoolingState.PACE:
        return paced(members, worst, tuple(silent))
    return Verdict(worst.state, worst, tuple(silent))


def paced(
    members: Mapping[int, MemberState], worst: MemberState, silent: tuple[int, ...]
) -> Verdict:
    """A gang under pace: the lowest duty a counted member asks for (the lowest rank on a tie),
    so every rank computes the same duty and slice and runs in the same slices."""
    pacing = [
        members[rank]
        for rank in sorted(members)
        if rank not in silent and members[rank].state is CoolingState.PACE
    ]
    lowest = min(pacing, key=lambda m: 1.0 if m.duty is None else m.duty, default=worst)
    return Verdict(CoolingState.PACE, lowest, silent, lowest.duty, lowest.slice_s)


@dataclass(frozen=True)
class Enforced:
    """What has been done to this rank: paused, told to reduce its batch, stopped."""

    paused: bool = False
    reduced: bool = False
    stopped: bool = False
    paced: bool = False


def steer(enforced: Enforced, target: CoolingState) -> tuple[Enforced, tuple[Action, ...]]:
    """The actions that take this rank from what was done to `target`, as
    shared.cooling.policy.react takes a single job: a stop is final; a pause keeps the batch as it
    was; leaving a pause resumes, then reduces or restores as `target` says."""
    if enforced.stopped:
        return enforced, ()
    if target is CoolingState.STOP:
        return replace(enforced, stopped=True), (Action.STOP,)
    if target is CoolingState.PAUSE:
        if enforced.paused:
            return enforced, ()
        return replace(enforced, paused=True, paced=False), (Action.PAUSE,)
    actions = [Action.RESUME] if enforced.paused else []
    reduce = target is CoolingState.REDUCE_BATCH or (
        target is CoolingState.PACE and enforced.reduced
    )  # pace keeps the batch as it was, as a pause does
    if reduce != enforced.reduced:
        actions.append(Action.REDUCE_BATCH if reduce else Action.RESTORE_BATCH)
    pace = target is CoolingState.PACE
    if pace != (enforced.paced and not enforced.paused):
        actions.append(Action.PACE if pace else Action.PACE_END)
    return Enforced(reduced=reduce, paced=pace), tuple(actions)


def gang_reason(
    action: Action,
    world: int,
    cause: MemberState | None,
    own_rank: int,
    untold: Mapping[int, str] | None = None,
) -> str:
    """What an event of a gang action says: `paused all 3 ranks: mac2 (rank 1) at 104.0 °C
    (smc · TCMz)`; a resume names no cause (every Mac allows it). `untold`: the ranks this rank
    neither hears nor can tell, each with why: then the line counts only the others and names
    each of those, never `all` (a gang said paused while a rank runs is the worst kind of
    wrong for a safety feature)."""
    verbs = {
        Action.PAUSE: "paused",
        Action.STOP: "stopped",
        Action.REDUCE_BATCH: "reduced the batch of",
        Action.RESTORE_BATCH: "restored the batch of",
        Action.PACE: "paced",
        Action.PACE_END: "ended the pacing of",
    }
    if action is Action.PACE_END:
        verb = verbs[action]
    else:
        verb = "resumed" if action is Action.RESUME or cause is None else verbs[action]
    if untold:
        told = [rank for rank in range(world) if rank not in untold]
        ranks = f"{len(told)} of {world} ranks ({', '.join(map(str, told))})"
    else:
        ranks = f"all {world} ranks"
    if action in (Action.RESUME, Action.PACE_END) or cause is None:
        why = "every rank's Mac allows it" if not untold else "every rank heard allows it"
    else:
        who = f"{cause.host} (rank {cause.rank}{', this Mac' if cause.rank == own_rank else ''})"
        why = f"{who} at {cause.reading_text()}"
    said = f"{verb} {ranks}: {why}"
    if untold:
        said += "; not told: " + "; ".join(
            f"rank {rank} ({reason})" for rank, reason in sorted(untold.items())
        )
    return said
