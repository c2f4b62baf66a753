"""The staging tree (shared/staging/tree.py): who copies a model to whom, on hand-made fleets."""

from __future__ import annotations

import math

import pytest

from shared.staging.tree import Copy, Tree, TreeError, rounds_needed, simulate

HOSTS = [f"h{i}" for i in range(1, 8)]


def test_seven_hosts_take_three_rounds_and_one_copy_from_the_origin() -> None:
    finishes = simulate("origin", HOSTS, size=1.0)
    assert sorted(f.host for f in finishes) == sorted(HOSTS)
    assert max(f.seconds for f in finishes) == rounds_needed(7) == 3
    assert [f.sender for f in finishes].count("origin") == 1
    by_round = [sum(1 for f in finishes if f.seconds == r) for r in (1, 2, 3)]
    assert by_round == [2, 2, 3]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 8, 15, 16, 31, 100])
def test_every_fleet_size_within_its_rounds(count: int) -> None:
    hosts = [f"h{i}" for i in range(count)]
    finishes = simulate("origin", hosts, size=1.0)
    assert len(finishes) == count
    assert max(f.seconds for f in finishes) <= rounds_needed(count)
    assert max(f.seconds for f in finishes) == max(1, math.ceil(math.log2(count)))
    assert [f.sender for f in finishes].count("origin") == 1


def test_every_sender_sends_one_copy_at_a_time() -> None:
    tree = Tree.start("origin", HOSTS)
    first = tree.next_copies()
    assert first == [Copy("origin", "h1"), Copy("h1", "h2", follows=True)]
    tree = tree.begin(first)
    assert tree.next_copies() == []
    tree = tree.finish(first[0])
    # the seed holds it but still serves its follower: no second copy from it yet
    assert tree.next_copies() == []
    tree = tree.finish(first[1])
    assert tree.next_copies() == [Copy("h1", "h3"), Copy("h2", "h4")]


def test_the_origin_sends_nothing_once_a_host_holds_the_model() -> None:
    tree = Tree.start("origin", HOSTS, holders=["h5"])
    copies = tree.next_copies()
    assert copies == [Copy("h5", "h1")]
    assert all(copy.sender != "origin" for copy in copies)


def test_a_lost_sender_s_hosts_take_another_source() -> None:
    tree = Tree.start("origin", HOSTS, holders=["h1", "h2"])
    copies = tree.next_copies()
    assert copies == [Copy("h1", "h3"), Copy("h2", "h4")]
    tree = tree.begin(copies).fail("h1")
    assert tree.running == (Copy("h2", "h4"),)
    assert tree.next_copies() == []  # h2 is busy; h3 waits for it
    tree = tree.finish(Copy("h2", "h4"))
    assert tree.next_copies() == [Copy("h2", "h3"), Copy("h4", "h5")]
    assert "h1" not in tree.waiting


def test_a_lost_seed_has_the_origin_send_again() -> None:
    tree = Tree.start("origin", ["a", "b", "c"])
    tree = tree.begin(tree.next_copies()).fail("a")
    assert tree.running == ()
    assert tree.next_copies() == [Copy("origin", "b"), Copy("b", "c", follows=True)]


def test_a_dropped_copy_is_started_again() -> None:
    tree = Tree.start("origin", ["a"], holders=())
    (copy,) = tree.next_copies()
    tree = tree.begin([copy]).drop(copy)
    assert tree.next_copies() == [copy]


def test_a_lost_host_in_simulation_is_routed_around() -> None:
    finishes = simulate("origin", HOSTS, size=1.0, lost={"h2": 1.5})
    got = {f.host: f for f in finishes}
    assert "h2" in got  # it finished round 1 before it was lost
    assert set(got) == set(HOSTS)
    assert all(f.sender != "h2" or f.seconds <= 1.5 for f in finishes)


def test_the_fastest_links_go_first() -> None:
    rates = {("origin", "slow"): 1.0, ("origin", "fast"): 10.0, ("fast", "slow"): 5.0}
    tree = Tree.start("origin", ["slow", "fast"], rates=rates)
    assert tree.next_copies() == [Copy("origin", "fast"), Copy("fast", "slow", follows=True)]
    finishes = simulate("origin", ["slow", "fast"], size=10.0, rates=rates)
    assert [(f.host, f.seconds) for f in finishes] == [("fast", 1.0), ("slow", 2.0)]


def test_a_follower_never_outpaces_its_sender() -> None:
    rates = {("origin", "a"): 1.0, ("a", "b"): 100.0}
    finishes = simulate("origin", ["a", "b"], size=1.0, rates=rates)
    assert [f.seconds for f in finishes] == [1.0, 1.0]


@pytest.mark.parametrize(
    ("origin", "hosts", "holders", "rates", "message"),
    [
        ("o", [], (), None, "no hosts to stage to: name at least one with --hosts"),
        ("o", ["a", "b", "a"], (), None, "host a is listed twice"),
        ("o", ["a", "o"], (), None, "host o is the model's origin and cannot also receive it"),
        ("o", ["a"], ("z",), None, "holder z is not one of the hosts"),
        ("o", ["a"], (), {("o", "a"): 0.0}, "link o → a: rate 0.0 is not above 0"),
        ("o", ["a"], (), {("o", "a"): math.nan}, "link o → a: rate nan is not above 0"),
    ],
)
def test_bad_plans_are_one_line(origin, hosts, holders, rates, message) -> None:  # noqa: ANN001
    with pytest.raises(TreeError) as caught:
        Tree.start(origin, hosts, holders=holders, rates=rates)
    assert str(caught.value) == message


def test_done_when_every_host_holds_or_failed() -> None:
    tree = Tree.start("o", ["a", "b"], holders=["a"]).fail("b")
    assert tree.done and tree.next_copies() == []
