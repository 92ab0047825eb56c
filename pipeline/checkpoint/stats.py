"""Checkpoint statistics (what the Airflow UI / ``checkpoints show`` display): frozen, JSON-able.

* :class:`TaskMetrics`: the metrics one subtask reports with its acknowledgement (Flink's
  ``CheckpointMetrics``): sync/async/alignment time, start delay, in-flight (channel state) bytes.
* :class:`OperatorStats`: per operator, aggregated over its subtasks (times: max, sizes: sum).
* :class:`CheckpointStats`: per checkpoint: trigger time, duration, sizes, acks, per operator,
  backlog and dead letters per source, number of rounds.

Times are milliseconds (float), sizes bytes (int).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from pipeline.checkpoint._frozen import FrozenDict

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.checkpoint.ack import TaskAcknowledgement

__all__ = ["TaskMetrics", "OperatorStats", "CheckpointStats"]


@dataclass(frozen=True, slots=True)
class TaskMetrics:
    """Metrics of one subtask's snapshot."""

    sync_ms: float = 0.0
    async_ms: float = 0.0
    alignment_ms: float = 0.0
    start_delay_ms: float = 0.0
    inflight_bytes: int = 0
    in_rows: int = 0
    mode: str = "aligned"

    def __post_init__(self) -> None:
        for name in ("sync_ms", "async_ms", "alignment_ms", "start_delay_ms"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "inflight_bytes", int(self.inflight_bytes))
        object.__setattr__(self, "in_rows", int(self.in_rows))

    def to_dict(self) -> dict[str, Any]:
        return {"sync_ms": self.sync_ms, "async_ms": self.async_ms, "alignment_ms": self.alignment_ms,
                "start_delay_ms": self.start_delay_ms, "inflight_bytes": self.inflight_bytes,
                "in_rows": self.in_rows, "mode": self.mode}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "TaskMetrics":
        return cls(**{k: d[k] for k in ("sync_ms", "async_ms", "alignment_ms", "start_delay_ms",
                                        "inflight_bytes", "in_rows", "mode") if k in d})


@dataclass(frozen=True, slots=True)
class OperatorStats:
    """Per-operator statistics of one checkpoint."""

    uid: str
    subtasks: int
    acks: int
    rows: int
    bytes: int
    sync_ms: float
    async_ms: float
    alignment_ms: float
    start_delay_ms: float
    inflight_bytes: int
    mode: str
    in_rows: int = 0

    def __post_init__(self) -> None:
        for name in ("sync_ms", "async_ms", "alignment_ms", "start_delay_ms"):
            object.__setattr__(self, name, float(getattr(self, name)))

    @classmethod
    def aggregate(cls, uid: str, subtasks: int, acks: Iterable["TaskAcknowledgement"]) -> "OperatorStats":
        """Combine the acknowledgements of one operator's subtasks."""
        acks = [a for a in acks if a.operator_uid == uid]
        modes = {a.metrics.mode for a in acks}
        return cls(
            uid=uid, subtasks=subtasks, acks=len(acks),
            rows=sum(h.rows for a in acks for h in a.state),
            bytes=sum(h.bytes for a in acks for h in a.state)
            + sum(c.file.bytes for a in acks for c in a.channel_state if c.file),
            sync_ms=max((a.metrics.sync_ms for a in acks), default=0.0),
            async_ms=max((a.metrics.async_ms for a in acks), default=0.0),
            alignment_ms=max((a.metrics.alignment_ms for a in acks), default=0.0),
            start_delay_ms=max((a.metrics.start_delay_ms for a in acks), default=0.0),
            inflight_bytes=sum(a.metrics.inflight_bytes for a in acks),
            mode=(next(iter(modes)) if len(modes) == 1 else ("mixed" if modes else "none")),
            in_rows=sum(a.metrics.in_rows for a in acks),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "subtasks": self.subtasks, "acks": self.acks, "rows": self.rows,
                "bytes": self.bytes, "sync_ms": self.sync_ms, "async_ms": self.async_ms,
                "alignment_ms": self.alignment_ms, "start_delay_ms": self.start_delay_ms,
                "inflight_bytes": self.inflight_bytes, "mode": self.mode, "in_rows": self.in_rows}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "OperatorStats":
        return cls(uid=str(d["uid"]), subtasks=int(d["subtasks"]), acks=int(d["acks"]), rows=int(d["rows"]),
                   bytes=int(d["bytes"]), sync_ms=d["sync_ms"], async_ms=d["async_ms"],
                   alignment_ms=d["alignment_ms"], start_delay_ms=d["start_delay_ms"],
                   inflight_bytes=int(d["inflight_bytes"]), mode=str(d["mode"]), in_rows=int(d.get("in_rows", 0)))


@dataclass(frozen=True, slots=True)
class CheckpointStats:
    """Statistics of one checkpoint (per-operator detail in ``operators``)."""

    trigger_time: str                      # ISO-8601 UTC
    duration_ms: float = 0.0               # trigger -> _metadata written
    sync_ms: float = 0.0                   # max over operators
    async_ms: float = 0.0
    alignment_ms: float = 0.0
    bytes: int = 0                         # state + channel state bytes
    rows: int = 0                          # state rows
    acks: int = 0
    expected_acks: int = 0
    rounds: int = 1
    operators: Mapping[str, OperatorStats] = field(default_factory=FrozenDict)
    backlog: Mapping[str, int] = field(default_factory=FrozenDict)        # records left per source
    dead_letters: Mapping[str, int] = field(default_factory=FrozenDict)   # malformed records per source

    def __post_init__(self) -> None:
        for name in ("duration_ms", "sync_ms", "async_ms", "alignment_ms"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "operators", FrozenDict(self.operators or {}))
        object.__setattr__(self, "backlog", FrozenDict({str(k): int(v) for k, v in (self.backlog or {}).items()}))
        object.__setattr__(self, "dead_letters",
                           FrozenDict({str(k): int(v) for k, v in (self.dead_letters or {}).items()}))

    def to_dict(self) -> dict[str, Any]:
        return {"trigger_time": self.trigger_time, "duration_ms": self.duration_ms, "sync_ms": self.sync_ms,
                "async_ms": self.async_ms, "alignment_ms": self.alignment_ms, "bytes": self.bytes,
                "rows": self.rows, "acks": self.acks, "expected_acks": self.expected_acks, "rounds": self.rounds,
                "operators": {uid: s.to_dict() for uid, s in sorted(self.operators.items())},
                "backlog": dict(sorted(self.backlog.items())),
                "dead_letters": dict(sorted(self.dead_letters.items()))}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CheckpointStats":
        return cls(trigger_time=str(d["trigger_time"]), duration_ms=d.get("duration_ms", 0.0),
                   sync_ms=d.get("sync_ms", 0.0), async_ms=d.get("async_ms", 0.0),
                   alignment_ms=d.get("alignment_ms", 0.0), bytes=int(d.get("bytes", 0)),
                   rows=int(d.get("rows", 0)), acks=int(d.get("acks", 0)),
                   expected_acks=int(d.get("expected_acks", 0)), rounds=int(d.get("rounds", 1)),
                   operators={uid: OperatorStats.from_dict(s) for uid, s in d.get("operators", {}).items()},
                   backlog=d.get("backlog", {}), dead_letters=d.get("dead_letters", {}))
