"""Wall-clock times as the project writes them: UTC, ISO 8601, whole seconds."""

from __future__ import annotations

from datetime import datetime, timezone


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def iso(moment: datetime) -> str:
    """'2026-11-30T20:06:00+00:00': what every stored and reported time looks like."""
    return moment.isoformat(timespec="seconds")


def now_iso() -> str:
    return iso(utc_now())
