"""What the daemon keeps of its telemetry: every sample numbered and kept in memory (the latest
ones) and in SQLite (written WRITE_EVERY at a time); every event in agent-events.sqlite, shared
with `agent run`; both pruned to a retention, served in pages after a cursor. The policy it
enforces is kept apart (agent.daemon.policy).

A sample or event number is never given twice by one history, whatever moment the agent dies
at (docs/protocol.md §10, History): a sample is numbered only below a mark set aside on disk
and synced before (RESERVED_SEQS, renewed ahead of use), and an event's number is its row's,
synced before it is published (agent.cooling.events).

Only the daemon's main thread uses it.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.cooling.events import EventLog
from agent.daemon.storage import EVENTS, HISTORY, StorageHealth
from agent.daemon.telemetry import page_history
from agent.daemon.throttle import LogThrottle
from shared.io.paths import data_dir
from shared.io.sqlite import open_store, store_id
from shared.wire.telemetry import CLOCK_COLUMNS, FIRST_SAMPLE_ROW, Event, Sample

log = logging.getLogger("agent.history")

_FIRST_ROW = Sample.column_sql(FIRST_SAMPLE_ROW, {"trend_c_per_min": "trend"})
_FIRST_ROW_RENAMED = Sample.column_sql(FIRST_SAMPLE_ROW)

MIGRATIONS = (
    f"""
CREATE TABLE IF NOT EXISTS samples (
    host TEXT NOT NULL,
{_FIRST_ROW}
);
CREATE INDEX IF NOT EXISTS samples_time ON samples (time)
""",
    f"""
CREATE TABLE samples_2 (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
{_FIRST_ROW_RENAMED}
);
INSERT INTO samples_2 (time, celsius, pressure, source, simulated, state, trend_c_per_min,
                       pause_s_total, jobs)
    SELECT time, celsius, pressure, source, simulated, state, trend, pause_s_total, jobs
    FROM samples ORDER BY time;
DROP TABLE samples;
ALTER TABLE samples_2 RENAME TO samples;
CREATE INDEX samples_time ON samples (time)
""",
    Sample.added_sql("samples", ("storage_error",)),
    Sample.added_sql("samples", ("power_w", "energy_j", "power")),
    Sample.added_sql("samples", ("sensor",)),
    Sample.added_sql("samples", ("throttling", "throttle_evidence")),
    Sample.added_sql("samples", CLOCK_COLUMNS),
    Sample.added_sql("samples", ("started",)),
    Sample.added_sql("samples", ("duty",)),
)
"""The schema, version by version (shared.io.sqlite.open_store). Version 1 is the file earlier
releases made without a version; version 2 numbers samples (the history cursor, never given
twice: AUTOINCREMENT's sqlite_sequence row holds the mark, see RESERVED_SEQS) and stores the
columns of shared.wire.telemetry.Sample; version 3 adds what the agent could not write when it took
the sample (storage_error); version 4 what its power source read at the same poll (power_w,
energy_j, power); version 5 which sensor of the source the reading is (sensor; NULL in rows
recorded before); version 6 whether the Mac throttled and why (throttling, throttle_evidence);
version 7 the clocks (CLOCK_COLUMNS: NULL in rows recorded before); version 8 when the agent
that took it started (started: its counters' restarts); version 9 the pace tier's duty (duty;
NULL when not paced, and in rows recorded before)."""
_COLUMNS = ", ".join(("seq", *Sample.columns()))
_INSERT = (
    f"INSERT INTO samples ({_COLUMNS}) VALUES ({', '.join('?' * (len(Sample.columns()) + 1))})"
)
MEMORY_SAMPLES = 3600
"""Samples kept in memory: an hour at 1 Hz, so a coordinator's usual backfill never reads disk;
as many wait in memory while the disk refuses them."""
MEMORY_EVENTS = 10000
"""Events that wait in memory while the disk refuses them."""
WRITE_EVERY = 10
"""Samples are written this many at a time (10 s at the default poll interval), in one
transaction: a commit a second would be most of an idle daemon's CPU (docs/performance.md). What a
crash can lose is docs/reliability.md's: the samples not written yet, all served from memory
meanwhile, and all written at a clean stop."""
RESERVED_SEQS = 2 * MEMORY_SAMPLES
"""Sample numbers set aside on disk at a time: the file's mark (sqlite_sequence) is moved this far
past the last number given, synced (fsync; F_FULLFSYNC on macOS), before any number below it is
given, at every start and then ahead of use. A life that dies, however early, has given no
number past the mark, and the next starts after it: a crash skips up to this many numbers and
never gives one twice. A clean stop sets the mark back to the last number given (no gap)."""
RENEW_BELOW = MEMORY_SAMPLES
"""The mark is moved again with the first write after fewer than this many numbers are left
(once an hour at 1 Hz): the poll loop waits for a sync only then, never per sample, and a disk
that refuses writes still leaves numbers for about as many samples as memory keeps unwritten."""

Page = tuple[list[dict[str, Any]], list[dict[str, Any]], bool]


def default_samples_path() -> Path:
    return data_dir() / "agent-telemetry.sqlite"


class TelemetryHistory:
    """Samples and events since the retention cutoff. `host` labels what it serves; `id` names
    this history (both files), so a cursor into another one is never taken for one into it.

    Samples are written WRITE_EVERY at a time, and all that wait at close(). A write the disk
    refuses is reported to `storage` and kept: each add_sample asks again for the samples, and
    flush() (each poll) for the events, oldest first, until the disk takes them. The samples
    meanwhile are served from memory, numbered as long as the numbers set aside on disk last
    (RESERVED_SEQS: about RENEW_BELOW samples more, then they wait unnumbered, see add_sample);
    an event is published unnumbered (seq nil) and numbered when it is written."""

    def __init__(
        self,
        host: str,
        events: EventLog,
        path: Path | None = None,
        storage: StorageHealth | None = None,
    ) -> None:
        self.host = host
        self.events = events
        self.path = path or default_samples_path()
        self.storage = storage or StorageHealth(LogThrottle(log))
        self._conn = open_store(self.path, MIGRATIONS, what="history")
        self.id = f"{store_id(self._conn)}.{events.id}"
        row = self._conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'samples'")
        self._next_seq = (row.fetchone() or (0,))[0] + 1
        self._reserved = self._next_seq - 1
        """The mark on disk: numbers up to it may be given (none yet)."""
        self._recent: deque[Sample] = deque(maxlen=MEMORY_SAMPLES)
        """The latest samples, every one since the first it holds."""
        self._unwritten: deque[Sample] = deque(maxlen=MEMORY_SAMPLES)
        self._unnumbered: deque[Sample] = deque(maxlen=MEMORY_SAMPLES)
        """Samples taken while no number was set aside (the disk refused the mark): neither
        published nor served until it takes one."""
        self.late: list[Sample] = []
        """Samples numbered late (were unnumbered), for the hub to publish: see take_late()."""
        self._unrecorded: deque[Event] = deque(maxlen=MEMORY_EVENTS)
        self._write_samples(renew=True)  # the first mark, before any number is given

    def add_sample(self, sample: Sample) -> Sample:
        """Number `sample` (the next `seq`) and keep it; returns it numbered. Written with the
        WRITE_EVERY-th sample not yet written, which also moves the mark when it runs low.

        Past the mark (the disk refused to move it for RENEW_BELOW samples, or at start) a
        number could be given again after a crash, so none is given: the sample comes back
        unnumbered (seq None: publish it to no one, serve it to no one) and waits, asking the
        disk again at each sample; once it takes a mark, the samples waiting are numbered in
        order, this one last, and the earlier ones wait in `late` for the hub to publish."""
        if self._unnumbered or self._next_seq > self._reserved:
            return self._add_unreserved(sample)
        sample = self._number(sample)
        if len(self._unwritten) >= WRITE_EVERY:
            self._write_samples(renew=self._reserved - self._next_seq < RENEW_BELOW)
        return sample

    def take_late(self) -> list[Sample]:
        """The samples numbered late since the last call (see add_sample), oldest first."""
        late, self.late = self.late, []
        return late

    @property
    def unwritten_samples(self) -> int:
        """Samples kept that the next write will take (the disk may have refused some)."""
        return len(self._unwritten) + len(self._unnumbered)

    def _add_unreserved(self, sample: Sample) -> Sample:
        if len(self._unnumbered) == self._unnumbered.maxlen:
            self._dropping("samples", MEMORY_SAMPLES)
        self._unnumbered.append(sample)
        if not self._write_samples(renew=True):
            return sample
        numbered = self._number_waiting()
        self.late.extend(numbered[:-1])
        return numbered[-1]

    def _number_waiting(self) -> list[Sample]:
        """Number the unnumbered samples, oldest first (the mark was just moved RESERVED_SEQS
        past the last number given, more than memory holds)."""
        numbered = [self._number(waiting) for waiting in self._unnumbered]
        self._unnumbered.clear()
        return numbered

    def _number(self, sample: Sample) -> Sample:
        """The sample with the next number, kept in memory and waiting for the next write."""
        sample = sample.numbered(self._next_seq)
        self._next_seq += 1
        self._recent.append(sample)
        if len(self._unwritten) == self._unwritten.maxlen:
            self._dropping("samples", MEMORY_SAMPLES)
        self._unwritten.append(sample)
        return sample

    def add_event(self, event: Event) -> Event:
        """Record an event; returns it numbered, or unnumbered when the disk refused it (it is
        kept and retried). One that comes numbered (`agent run` recorded it in the same file)
        keeps its number only when the file holds that event under it: a number from another
        file (an `agent run` with another data directory) could name another event here, so
        the event is recorded again under a number of this file's."""
        if event.seq is not None:
            if self._holds(event):
                return event
            event = replace(event, seq=None)
        if not self._unrecorded:
            try:
                return self._record(event)
            except sqlite3.Error:
                pass
        if len(self._unrecorded) == self._unrecorded.maxlen:
            self._dropping("events", MEMORY_EVENTS)
        self._unrecorded.append(event)
        return event

    def flush(self) -> None:
        """Write the events the disk refused so far, oldest first (samples wait for their
        batch, see add_sample)."""
        while self._unrecorded:
            try:
                self._record(self._unrecorded[0])
            except sqlite3.Error:
                return
            self._unrecorded.popleft()

    def _holds(self, event: Event) -> bool:
        try:
            return self.events.holds(event)
        except sqlite3.Error:
            return False  # recorded again, under a number this file gives

    def _write_samples(self, renew: bool = False, exact: bool = False) -> bool:
        """Write every sample waiting, in one transaction; True when the disk took it. With
        `renew`, the same transaction moves the mark RESERVED_SEQS past the last number given,
        synced before it returns (the only synced write: once per RENEW_BELOW samples); with
        `exact`, back to the last number given (a clean stop: the next start leaves no gap; a
        mark lowered is safe unsynced, since a crash that loses it keeps the higher one)."""
        rows = [(s.seq, *s.row()) for s in self._unwritten]
        mark = None
        if exact:
            mark = self._next_seq - 1
        elif renew:
            mark = self._next_seq - 1 + RESERVED_SEQS
        synced = mark is not None and mark > self._reserved
        try:
            if synced:
                self._conn.execute("PRAGMA synchronous = FULL")  # the WAL synced at commit
                self._conn.execute("PRAGMA fullfsync = ON")  # macOS: past the drive's cache
            with self._conn:
                if rows:
                    self._conn.executemany(_INSERT, rows)
                if mark is not None:
                    self._set_mark(mark)
        except sqlite3.Error as exc:
            self.storage.failed(HISTORY, self.path, exc)
            return False
        finally:
            if synced:
                self._conn.execute("PRAGMA fullfsync = OFF")
                self._conn.execute("PRAGMA synchronous = NORMAL")
        self._unwritten.clear()
        if mark is not None:
            self._reserved = mark
        self.storage.written(HISTORY)
        return True

    def _set_mark(self, mark: int) -> None:
        """sqlite_sequence's row for samples: AUTOINCREMENT's own, so files of earlier
        releases (which kept their mark there) are read alike."""
        taken = self._conn.execute(
            "UPDATE sqlite_sequence SET seq = ? WHERE name = 'samples'", (mark,)
        )
        if taken.rowcount == 0:  # no sample was ever written to this file
            self._conn.execute(
                "INSERT INTO sqlite_sequence (name, seq) VALUES ('samples', ?)", (mark,)
            )

    def _record(self, event: Event) -> Event:
        try:
            recorded = self.events.record(event)
        except sqlite3.Error as exc:
            self.storage.failed(EVENTS, self.events.path, exc)
            raise
        self.storage.written(EVENTS)
        return recorded

    def _dropping(self, what: str, kept: int) -> None:
        self.storage.throttle.log(
            f"{what} dropped unwritten",
            logging.ERROR,
            "the disk refused the last %d %s: the oldest is dropped unwritten",
            kept,
            what,
        )

    def page(
        self, samples_after: int, events_after: int, since: float, limit: int, budget: int
    ) -> Page:
        """history.get: samples and events numbered after their cursors and stamped after
        `since` (see page_history), as bodies."""
        samples = [s.body(self.host) for s in self._samples_after(samples_after, since, limit + 1)]
        events = [e.body(self.host) for e in self.events.after(events_after, since, limit + 1)]
        return page_history(samples, events, limit, budget)

    def prune(self, cutoff: float) -> None:
        """Forget what is older than `cutoff`, in memory and on disk (a disk that refuses is
        reported, and asked again at the next prune)."""
        while self._recent and self._recent[0].time < cutoff:
            self._recent.popleft()
        while self._unwritten and self._unwritten[0].time < cutoff:
            self._unwritten.popleft()
        while self._unnumbered and self._unnumbered[0].time < cutoff:
            self._unnumbered.popleft()
        try:
            with self._conn:
                self._conn.execute("DELETE FROM samples WHERE time < ?", (cutoff,))
            self.events.prune(cutoff)
        except sqlite3.Error as exc:
            self.storage.failed(HISTORY, self.path, exc)

    def close(self) -> None:
        """Write every sample still waiting (unnumbered ones numbered, if the disk now takes a
        mark: never published, they are served from the next start), set the mark back to the
        last number given (a clean stop leaves no gap in the numbers), and close the file."""
        if self._unnumbered and self._write_samples(renew=True):
            self._number_waiting()
        self._write_samples(exact=True)
        self._conn.close()

    def _samples_after(self, seq: int, since: float, count: int) -> list[Sample]:
        if self._recent and seq >= (self._recent[0].seq or 0) - 1:
            return self._recent_after(seq, since, count)
        rows = self._conn.execute(
            f"SELECT {_COLUMNS} FROM samples WHERE seq > ? AND time > ? ORDER BY seq LIMIT ?",
            (seq, since, count),
        ).fetchall()
        stored = [Sample.from_row(row[1:], seq=row[0]) for row in rows]
        if len(stored) == count:
            return stored
        after = (stored[-1].seq or 0) if stored else seq  # the rest are not written yet
        return stored + self._recent_after(after, since, count - len(stored))

    def _recent_after(self, seq: int, since: float, count: int) -> list[Sample]:
        return [s for s in self._recent if (s.seq or 0) > seq and s.time > since][:count]


def throttle_polls(
    history: TelemetryHistory, source: str, since: float
) -> list[tuple[float | None, bool | None]]:
    """(°C, throttling) of every sample of `source` stamped after `since`, oldest first, the
    stored then those only in memory: what shared.cooling.throttle_point.passive_onsets learns
    from."""
    rows = history._conn.execute(  # noqa: SLF001  # the store's own module
        "SELECT seq, celsius, throttling FROM samples WHERE source = ? AND time > ? ORDER BY seq",
        (source, since),
    ).fetchall()
    last = rows[-1][0] if rows else 0
    polls = [
        (celsius, None if throttling is None else bool(throttling))
        for _, celsius, throttling in rows
    ]
    polls += [
        (s.celsius, s.throttling)
        for s in history._recent  # noqa: SLF001
        if (s.seq or 0) > last and s.source == source and s.time > since
    ]
    return polls
