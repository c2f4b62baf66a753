"""The monitor's cursor bookkeeping (coordinator.telemetry.cursor_tracker): pure, with numbered
messages."""

from __future__ import annotations

from typing import Any

from coordinator.telemetry.cursor_tracker import CursorTracker
from shared.wire.telemetry import Cursor


def numbered(*seqs: int | None) -> list[dict[str, Any]]:
    return [{"seq": seq} for seq in seqs]


def test_live_numbers_in_order_move_the_cursor_without_a_backfill() -> None:
    tracker = CursorTracker(Cursor("h", 3, 1))
    assert not tracker.live(numbered(4, 5), numbered(2))
    assert tracker.cursor == Cursor("h", 5, 2)
    assert not tracker.live(numbered(None), [])  # a message without a number moves nothing
    assert tracker.cursor == Cursor("h", 5, 2)


def test_a_skipped_number_orders_one_backfill_and_what_is_heard_meanwhile_waits() -> None:
    tracker = CursorTracker(Cursor("h", 3, 0))
    assert tracker.live(numbered(4, 7), [])  # 5 and 6 were dropped by PUB
    assert tracker.cursor == Cursor("h", 4, 0)  # as far as nothing is missing
    assert not tracker.live(numbered(8, 9), [])  # heard while backfilling: no second order
    assert tracker.cursor == Cursor("h", 4, 0)
    tracker.paged(numbered(5, 6), [])
    assert not tracker.backfilled()  # 7 then 8, 9 follow on
    assert tracker.cursor == Cursor("h", 9, 0)


def test_what_the_agent_no_longer_has_is_passed_after_the_backfill() -> None:
    tracker = CursorTracker(Cursor("h", 3, 0))
    assert tracker.live(numbered(10), [])
    tracker.paged([], [])  # the agent kept nothing between 3 and 10
    assert not tracker.backfilled()
    assert tracker.cursor == Cursor("h", 10, 0)


def test_a_new_gap_heard_during_a_backfill_orders_the_next_one() -> None:
    tracker = CursorTracker(Cursor("h", 0, 0))
    tracker.start_backfill()  # a session's first
    assert not tracker.live(numbered(6), numbered(3))
    tracker.paged(numbered(1, 2, 3), numbered(1))
    assert tracker.backfilled()  # 4 and 5 of the samples, 2 of the events: still missing
    assert tracker.cursor == Cursor("h", 3, 1)
    tracker.paged(numbered(4, 5, 6), numbered(2, 3))
    assert not tracker.backfilled()
    assert tracker.cursor == Cursor("h", 6, 3)
