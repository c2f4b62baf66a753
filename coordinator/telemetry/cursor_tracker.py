"""Where the record of one host's history stands while its telemetry arrives two ways: live off
its SUB (in order, but PUB drops what a slow subscriber cannot take) and in history.get pages
(docs/protocol.md §10). Pure: `coordinator monitor`'s main thread tells it what arrived, and it
says when the monitor must order a backfill."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from shared.wire.telemetry import Cursor


@dataclass
class CursorTracker:
    """One session's cursor: the last sample and event numbers recorded with nothing missing
    before them. A live number that skips one starts a backfill; until it ends, live numbers are
    only noted, then taken in order, as if they had arrived after it."""

    cursor: Cursor
    backfilling: bool = False
    skipped: tuple[int, int] = (0, 0)
    """The highest live sample and event numbers that showed the gap being backfilled: what the
    agent no longer has below them is gone for good, so the cursor passes them afterwards."""
    heard: tuple[list[int], list[int]] = field(default_factory=lambda: ([], []))
    """Live sample and event numbers that arrived while backfilling."""

    def start_backfill(self) -> None:
        """A backfill was ordered without a gap (a session's first)."""
        self.backfilling, self.skipped = True, (0, 0)

    def live(self, samples: Iterable[dict[str, Any]], events: Iterable[dict[str, Any]]) -> bool:
        """Messages read off the SUB, in order; True when one skipped a number: order a
        backfill from `cursor`."""
        sample_numbers, event_numbers = numbers(samples), numbers(events)
        if self.backfilling:
            self.heard[0].extend(sample_numbers)
            self.heard[1].extend(event_numbers)
            return False
        return self._advance(sample_numbers, event_numbers)

    def paged(self, samples: Iterable[dict[str, Any]], events: Iterable[dict[str, Any]]) -> None:
        """A backfill page was recorded."""
        self.cursor = past(self.cursor, samples, events)

    def backfilled(self) -> bool:
        """The backfill's last page was recorded: pass the numbers that showed the gap, then take
        the live ones heard meanwhile; True when they show a new gap."""
        self.cursor = Cursor(
            self.cursor.history,
            max(self.cursor.samples, self.skipped[0]),
            max(self.cursor.events, self.skipped[1]),
        )
        heard, self.heard, self.backfilling = self.heard, ([], []), False
        return self._advance(*heard)

    def _advance(self, sample_numbers: list[int], event_numbers: list[int]) -> bool:
        samples, samples_gap = advance(self.cursor.samples, sample_numbers)
        events, events_gap = advance(self.cursor.events, event_numbers)
        self.cursor = Cursor(self.cursor.history, samples, events)
        if samples_gap or events_gap:
            self.backfilling = True
            self.skipped = (max([samples, *sample_numbers]), max([events, *event_numbers]))
            self.heard = ([], [])
        return samples_gap or events_gap


def past(
    cursor: Cursor, samples: Iterable[dict[str, Any]], events: Iterable[dict[str, Any]]
) -> Cursor:
    """The cursor past a history.get page: a page is complete up to its last numbers."""
    return Cursor(
        cursor.history,
        max([cursor.samples, *numbers(samples)]),
        max([cursor.events, *numbers(events)]),
    )


def numbers(items: Iterable[dict[str, Any]]) -> list[int]:
    """The `seq` of each message that has one."""
    return [item["seq"] for item in items if item["seq"] is not None]


def advance(cursor: int, arrived: list[int]) -> tuple[int, bool]:
    """(the new cursor, whether a number was skipped) after live numbers `arrived`."""
    for number in sorted(set(arrived)):
        if number == cursor + 1:
            cursor = number
        elif number > cursor + 1:
            return cursor, True
    return cursor, False
