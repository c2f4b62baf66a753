"""Log lines that cannot flood (agent.daemon.throttle): the first of a kind at once, then a
count."""

from __future__ import annotations

import logging

import pytest

from agent.daemon.throttle import LogThrottle


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_line_of_a_kind_is_written_the_rest_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    throttle = LogThrottle(logging.getLogger("test.throttle"), window_s=60.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.throttle"):
        for index in range(1000):
            throttle.log("refused messages (malformed)", logging.INFO, "refused %d", index)
        throttle.log("refused handshakes", logging.WARNING, "refused key K")
        throttle.flush()  # nothing ended yet
        clock.now += 60.0
        throttle.flush()
        throttle.flush()  # said once
    assert [r.getMessage() for r in caplog.records] == [
        "refused 0",
        "refused key K",
        "999 more refused messages (malformed) in the last 60 s (1000 since the start)",
    ]
    assert throttle.totals == {"refused messages (malformed)": 1000, "refused handshakes": 1}


def test_a_kind_seen_again_after_its_window_is_written_with_the_count_before_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    throttle = LogThrottle(logging.getLogger("test.throttle"), window_s=10.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.throttle"):
        throttle.log("k", logging.ERROR, "first")
        throttle.log("k", logging.ERROR, "second")
        clock.now += 11.0
        throttle.log("k", logging.ERROR, "third")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, "first"),
        (logging.ERROR, "1 more k in the last 10 s (3 since the start)"),
        (logging.ERROR, "third"),
    ]
