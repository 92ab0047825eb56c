"""Epoch arithmetic.

Epoch ``n`` is the half-open ``_ingest_ts`` interval ``[n*E, (n+1)*E)`` seconds since the Unix epoch (UTC),
with ``E = PIPELINE_EPOCH_SECONDS``. Boundaries are therefore deterministic and aligned to the epoch
length (with E=3600 epochs are whole UTC hours, like an hourly Airflow schedule). Barrier ``n`` of a
partition is the position of the first row with ``_ingest_ts >= end(n) = (n+1)*E``.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

__all__ = ["EpochClock"]


@dataclass(frozen=True, slots=True)
class EpochClock:
    epoch_seconds: int

    @property
    def epoch_us(self) -> int:
        return self.epoch_seconds * 1_000_000

    def epoch_of(self, ts_us: int) -> int:
        return ts_us // self.epoch_us

    def start_us(self, n: int) -> int:
        return n * self.epoch_us

    def end_us(self, n: int) -> int:
        """End of epoch n = barrier n's timestamp (exclusive upper bound of the epoch)."""
        return (n + 1) * self.epoch_us

    def epoch_ending_at(self, dt: datetime) -> int:
        """The epoch whose end is ``dt`` (e.g. an Airflow data interval end)."""
        us = int(dt.timestamp() * 1_000_000)
        return us // self.epoch_us - 1

    def iso(self, ts_us: int) -> str:
        return datetime.fromtimestamp(ts_us / 1_000_000, tz=UTC).isoformat().replace("+00:00", "Z")
