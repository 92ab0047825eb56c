"""Clocks. The barrier rule for idle partitions depends on the wall clock; tests control it."""
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from pipeline.exceptions import ConfigError

__all__ = ["Clock", "SystemClock", "FixedClock", "clock_from_iso", "parse_utc"]


class Clock(Protocol):
    def now_us(self) -> int:
        """Current time in microseconds since the Unix epoch (UTC)."""


class SystemClock:
    def now_us(self) -> int:
        return time.time_ns() // 1000


@dataclass(frozen=True, slots=True)
class FixedClock:
    at_us: int

    def now_us(self) -> int:
        return self.at_us


def parse_utc(value: str) -> datetime:
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"not an ISO-8601 timestamp: {value!r}") from None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def clock_from_iso(value: str) -> Clock:
    """``""`` -> wall clock; otherwise a fixed clock at that instant (PIPELINE_CLOCK_NOW)."""
    if not value:
        return SystemClock()
    return FixedClock(int(parse_utc(value).timestamp() * 1_000_000))
