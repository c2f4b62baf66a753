"""Who copies a model to whom: a tree in which every host that holds a verified copy serves the
next one, so N hosts take about ⌈log₂(N+1)⌉ rounds of one copy each instead of N copies from one
machine.

The origin (the coordinator's cache or directory, or the one agent that downloaded the model)
sends exactly **one** copy, to the *seed*: its uplink is the one to spare (a laptop on Wi-Fi,
the Internet). The seed's first receiver *follows* it (fetches each chunk as soon as the seed
has verified it), so the extra hop costs no round: after round r, 2**r hosts hold the model.
Every other copy starts from a host that holds the whole model, one copy at a time per sender,
so each runs at its link's whole rate.

The plan is made as it goes, never fixed in advance: `next_copies` answers, for what holds and
what runs now, which copies to start. A host that fails drops out with every copy it was in;
the hosts it would have served are matched to other senders on the next call (its subtree takes
another source). With per-link rates, the fastest free links go first, so the hosts behind them
become senders soonest. `simulate` runs the plan on a clock, for the tests and docs/staging.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

Link = tuple[str, str]


class TreeError(ValueError):
    """A stage that cannot be planned: one line naming the problem."""


@dataclass(frozen=True)
class Copy:
    """One transfer of the whole model, `sender` to `receiver`. `follows`: the sender is still
    receiving it (the seed), so the receiver fetches each chunk once the sender has verified
    it."""

    sender: str
    receiver: str
    follows: bool = False


@dataclass(frozen=True)
class Tree:
    """Where a stage stands: who holds a verified copy, who failed, which copies run."""

    origin: str
    hosts: tuple[str, ...]
    holders: frozenset[str] = frozenset()
    failed: frozenset[str] = frozenset()
    running: tuple[Copy, ...] = ()
    rates: Mapping[Link, float] = field(default_factory=dict)

    @classmethod
    def start(
        cls,
        origin: str,
        hosts: Sequence[str],
        holders: Iterable[str] = (),
        rates: Mapping[Link, float] | None = None,
    ) -> Tree:
        """A stage of `hosts` from `origin`; `holders` already hold a verified copy (a stage run
        again resumes). TreeError for no hosts, a host listed twice, or the origin among them."""
        if not hosts:
            raise TreeError("no hosts to stage to: name at least one with --hosts")
        seen: set[str] = set()
        for host in hosts:
            if host in seen:
                raise TreeError(f"host {host} is listed twice")
            seen.add(host)
        if origin in seen:
            raise TreeError(f"host {origin} is the model's origin and cannot also receive it")
        held = frozenset(holders)
        if strangers := sorted(held - seen):
            raise TreeError(f"holder {strangers[0]} is not one of the hosts")
        for link, rate in (rates or {}).items():
            if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
                raise TreeError(f"link {link[0]} → {link[1]}: rate {rate!r} is not above 0")
        return cls(origin, tuple(hosts), held, rates=dict(rates or {}))

    @property
    def waiting(self) -> tuple[str, ...]:
        """Hosts that neither hold, receive, nor failed, in the order given."""
        receiving = {copy.receiver for copy in self.running}
        return tuple(
            host
            for host in self.hosts
            if host not in self.holders and host not in self.failed and host not in receiving
        )

    @property
    def done(self) -> bool:
        """Every host holds a copy or failed, and nothing runs."""
        return not self.running and not self.waiting

    def rate(self, sender: str, receiver: str) -> float:
        """The link's rate as given, else 1 (links of unknown rate are alike)."""
        return self.rates.get((sender, receiver), 1.0)

    def next_copies(self) -> list[Copy]:
        """The copies to start now, fastest link first; none while the plan has no free sender
        for a waiting host."""
        busy = {copy.sender for copy in self.running}
        waiting = list(self.waiting)
        senders = [host for host in self.hosts if host in self.holders and host not in busy]
        started: list[Copy] = []
        if not self.holders and not any(copy.sender == self.origin for copy in self.running):
            if not waiting:
                return []
            seed = max(waiting, key=lambda host: self.rate(self.origin, host))
            started.append(Copy(self.origin, seed))
            waiting.remove(seed)
        pairs = sorted(
            ((sender, receiver) for sender in senders for receiver in waiting),
            key=lambda pair: -self.rate(*pair),
        )
        for sender, receiver in pairs:
            if sender in senders and receiver in waiting:
                started.append(Copy(sender, receiver))
                senders.remove(sender)
                waiting.remove(receiver)
        seeds = [copy.receiver for copy in (*self.running, *started) if copy.sender == self.origin]
        followed = {copy.sender for copy in self.running if copy.follows}
        for seed in seeds:
            if waiting and seed not in followed and seed not in busy:
                follower = max(waiting, key=lambda host: self.rate(seed, host))
                started.append(Copy(seed, follower, follows=True))
                waiting.remove(follower)
        return started

    def begin(self, copies: Iterable[Copy]) -> Tree:
        return replace(self, running=(*self.running, *copies))

    def finish(self, copy: Copy) -> Tree:
        """`copy` ended with its receiver's copy verified."""
        return replace(
            self,
            holders=self.holders | {copy.receiver},
            running=tuple(other for other in self.running if other != copy),
        )

    def drop(self, copy: Copy) -> Tree:
        """`copy` ended without a verified copy (its receiver waits again; what it received
        stays, and the next copy resumes it)."""
        return replace(self, running=tuple(other for other in self.running if other != copy))

    def fail(self, host: str) -> Tree:
        """`host` is lost: it leaves the plan with every copy it was in; the hosts it was
        serving wait for another sender."""
        return replace(
            self,
            failed=self.failed | {host},
            holders=self.holders - {host},
            running=tuple(
                copy for copy in self.running if host not in (copy.sender, copy.receiver)
            ),
        )


def rounds_needed(hosts: int) -> int:
    """⌈log₂(hosts + 1)⌉: rounds of one copy per sender for `hosts` hosts, the origin counted as a
    sender (which the seed's follower stands in for)."""
    return math.ceil(math.log2(hosts + 1)) if hosts > 0 else 0


@dataclass(frozen=True)
class Finish:
    """When a host's copy was verified in a simulated stage, and from whom it came."""

    host: str
    sender: str
    seconds: float


def simulate(
    origin: str,
    hosts: Sequence[str],
    size: float,
    rates: Mapping[Link, float] | None = None,
    lost: Mapping[str, float] | None = None,
) -> list[Finish]:
    """The stage of `size` bytes on a clock: each copy takes size ÷ its link's rate (1 byte/s
    when unknown); a follower never outpaces its sender (it takes the slower of its own link and
    the time its sender's copy ends). `lost`: hosts that fail at a time, and what they were in
    starts over elsewhere (resuming is the transfer's business, not the plan's). Returns the
    finishes in time order."""
    tree = Tree.start(origin, hosts, rates=rates)
    ends: dict[Copy, float] = {}
    losses = sorted((lost or {}).items(), key=lambda item: item[1])
    finished: list[Finish] = []
    now = 0.0
    while True:
        started = tree.next_copies()
        tree = tree.begin(started)
        for copy in started:
            own = now + size / tree.rate(copy.sender, copy.receiver)
            ends[copy] = max(own, ends[_feeding(tree, copy)]) if copy.follows else own
        if tree.done or not tree.running:
            return finished
        copy = min(tree.running, key=lambda c: ends[c])
        if losses and losses[0][1] <= ends[copy]:
            host, when = losses.pop(0)
            now = max(now, when)
            tree = tree.fail(host)
            continue
        now = ends.pop(copy)
        tree = tree.finish(copy)
        finished.append(Finish(copy.receiver, copy.sender, now))


def _feeding(tree: Tree, follower: Copy) -> Copy:
    """The copy a follower's sender is receiving."""
    return next(copy for copy in tree.running if copy.receiver == follower.sender)
