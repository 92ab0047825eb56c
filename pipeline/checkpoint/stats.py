"""Checkpoint statistics (what the Airflow UI / ``checkpoints show`` display): frozen, JSON-able.

* :class:`OperatorStats`: per operator, aggregated over its subtasks (times: max, sizes: sum).
* :class:`SubtaskStats`: per subtask (Flink's per-subtask checkpoint details): when it acknowledged,
  relative to the trigger, its sync/async/alignment times and the state it persisted.
* :class:`CheckpointStats`: per checkpoint: trigger time, duration, sizes, acks, per operator,
  backlog and dead letters per source, number of rounds, and the driver's S3 requests by kind
  (``s3_requests``, a :class:`~pipeline.fileio.request_counter.StorageRequests`; see docs/state.md,
  "S3 requests per epoch"), the executors' (``executor_s3_requests``) and how those were counted
  (``executor_s3_requests_counting``: exact or approximate).

Times are milliseconds (float), sizes bytes (int).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.checkpoint._frozen import FrozenDict
from pipeline.checkpoint.ack import TaskAcknowledgement
from pipeline.fileio.request_counter import RequestCounting, StorageRequests

__all__ = ["OperatorStats", "SubtaskStats", "CheckpointStats"]


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
    persisted_bytes: int | None = None   # what this checkpoint wrote for the operator (None: ``bytes``)

    def __post_init__(self) -> None:
        for name in ("sync_ms", "async_ms", "alignment_ms", "start_delay_ms"):
            object.__setattr__(self, name, float(getattr(self, name)))

    @classmethod
    def aggregate(cls, uid: str, subtasks: int, acks: Iterable[TaskAcknowledgement]) -> OperatorStats:
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
            persisted_bytes=sum(h.checkpointed_bytes for a in acks for h in a.state)
            + sum(c.file.bytes for a in acks for c in a.channel_state if c.file),
        )

    @property
    def checkpointed_bytes(self) -> int:
        return self.bytes if self.persisted_bytes is None else self.persisted_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "subtasks": self.subtasks, "acks": self.acks, "rows": self.rows,
                "bytes": self.bytes, "sync_ms": self.sync_ms, "async_ms": self.async_ms,
                "alignment_ms": self.alignment_ms, "start_delay_ms": self.start_delay_ms,
                "inflight_bytes": self.inflight_bytes, "mode": self.mode, "in_rows": self.in_rows,
                "persisted_bytes": self.persisted_bytes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OperatorStats:
        return cls(uid=str(d["uid"]), subtasks=int(d["subtasks"]), acks=int(d["acks"]), rows=int(d["rows"]),
                   bytes=int(d["bytes"]), sync_ms=d["sync_ms"], async_ms=d["async_ms"],
                   alignment_ms=d["alignment_ms"], start_delay_ms=d["start_delay_ms"],
                   inflight_bytes=int(d["inflight_bytes"]), mode=str(d["mode"]), in_rows=int(d.get("in_rows", 0)),
                   persisted_bytes=None if d.get("persisted_bytes") is None else int(d["persisted_bytes"]))


@dataclass(frozen=True, slots=True)
class SubtaskStats:
    """One subtask's part of a checkpoint (a row of Flink's per-subtask checkpoint details)."""

    uid: str
    subtask: int
    ack_ms: float | None      # acknowledgement time minus the checkpoint's trigger time; None: not recorded
    sync_ms: float
    async_ms: float
    alignment_ms: float
    start_delay_ms: float
    state_bytes: int          # state + channel state this subtask's handles hold
    state_rows: int
    in_rows: int
    mode: str

    @classmethod
    def of(cls, ack: TaskAcknowledgement, trigger_ts_ms: float) -> SubtaskStats:
        m = ack.metrics
        return cls(uid=ack.operator_uid, subtask=ack.subtask,
                   ack_ms=round(max(0.0, m.ack_ts_ms - trigger_ts_ms), 3) if m.ack_ts_ms else None,
                   sync_ms=m.sync_ms, async_ms=m.async_ms, alignment_ms=m.alignment_ms,
                   start_delay_ms=m.start_delay_ms,
                   state_bytes=sum(h.bytes for h in ack.state)
                   + sum(c.file.bytes for c in ack.channel_state if c.file),
                   state_rows=sum(h.rows for h in ack.state), in_rows=m.in_rows, mode=m.mode)

    def to_dict(self) -> dict[str, Any]:
        return {"uid": self.uid, "subtask": self.subtask, "ack_ms": self.ack_ms, "sync_ms": self.sync_ms,
                "async_ms": self.async_ms, "alignment_ms": self.alignment_ms,
                "start_delay_ms": self.start_delay_ms, "state_bytes": self.state_bytes,
                "state_rows": self.state_rows, "in_rows": self.in_rows, "mode": self.mode}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SubtaskStats:
        return cls(uid=str(d["uid"]), subtask=int(d["subtask"]),
                   ack_ms=None if d.get("ack_ms") is None else float(d["ack_ms"]),
                   sync_ms=float(d.get("sync_ms", 0.0)), async_ms=float(d.get("async_ms", 0.0)),
                   alignment_ms=float(d.get("alignment_ms", 0.0)),
                   start_delay_ms=float(d.get("start_delay_ms", 0.0)), state_bytes=int(d.get("state_bytes", 0)),
                   state_rows=int(d.get("state_rows", 0)), in_rows=int(d.get("in_rows", 0)),
                   mode=str(d.get("mode", "aligned")))


@dataclass(frozen=True, slots=True)
class CheckpointStats:
    """Statistics of one checkpoint (per-operator detail in ``operators``, per subtask in ``subtasks``)."""

    trigger_time: str                      # ISO-8601 UTC
    duration_ms: float = 0.0               # trigger -> _metadata written
    sync_ms: float = 0.0                   # max over operators
    async_ms: float = 0.0
    alignment_ms: float = 0.0
    bytes: int = 0                         # state + channel state bytes: the full state this checkpoint represents
    persisted_bytes: int | None = None     # bytes this checkpoint itself wrote (Flink's "checkpointed data size");
                                           # None: not recorded (older _metadata) - then equal to ``bytes``
    rows: int = 0                          # state rows
    acks: int = 0
    expected_acks: int = 0
    rounds: int = 1
    operators: Mapping[str, OperatorStats] = field(default_factory=FrozenDict)
    backlog: Mapping[str, int] = field(default_factory=FrozenDict)        # records left per source
    dead_letters: Mapping[str, int] = field(default_factory=FrozenDict)   # malformed records per source
    subtasks: tuple[SubtaskStats, ...] = ()                               # per (operator, subtask)
    # S3 requests by kind the driver sent for this checkpoint: since the previous checkpoint of the same
    # coordinator was completed (its sink commits and retention included) or since the coordinator was created
    # (a fresh process: restore included), up to this _metadata. None: not recorded (older _metadata)
    s3_requests: StorageRequests | None = None
    # S3 requests by kind of the executors' Python workers for this checkpoint: every task of its rounds (source
    # reads, state chains, sink staging, dead letters, acks); in a tagged round, the tasks' work of this epoch
    # (docs/state.md "S3 requests per epoch"). None: not recorded (older _metadata)
    executor_s3_requests: StorageRequests | None = None
    # how they were counted: EXACT (a Spark accumulator: every successful task attempt once) or APPROXIMATE (Spark
    # Connect: each operator task reported its worker's requests not reported before). None: not recorded (older
    # _metadata, whose counts were the approximate ones)
    executor_s3_requests_counting: RequestCounting | None = None
    # per sink table: whether its S3 requests are in the counts above (its staging always is; its commit only when
    # the format's client goes through Epochal's counted clients), e.g. "not counted (delta-rs ...)": never a
    # silent omission (pipeline.sink.formats.sink_requests_counting). Empty: not recorded (older _metadata)
    sink_s3_requests_counting: Mapping[str, str] = field(default_factory=FrozenDict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "subtasks", tuple(self.subtasks or ()))
        for name in ("s3_requests", "executor_s3_requests"):
            if isinstance(getattr(self, name), Mapping):
                object.__setattr__(self, name, StorageRequests.from_dict(getattr(self, name)))
        if isinstance(self.executor_s3_requests_counting, str):
            object.__setattr__(self, "executor_s3_requests_counting",
                               RequestCounting(self.executor_s3_requests_counting))
        for name in ("duration_ms", "sync_ms", "async_ms", "alignment_ms"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "operators", FrozenDict(self.operators or {}))
        object.__setattr__(self, "sink_s3_requests_counting",
                           FrozenDict({str(k): str(v) for k, v in (self.sink_s3_requests_counting or {}).items()}))
        object.__setattr__(self, "backlog", FrozenDict({str(k): int(v) for k, v in (self.backlog or {}).items()}))
        object.__setattr__(self, "dead_letters",
                           FrozenDict({str(k): int(v) for k, v in (self.dead_letters or {}).items()}))

    @property
    def checkpointed_bytes(self) -> int:
        """What this checkpoint wrote (``persisted_bytes``), ``bytes`` where that was not recorded."""
        return self.bytes if self.persisted_bytes is None else self.persisted_bytes

    def to_dict(self) -> dict[str, Any]:
        return {"trigger_time": self.trigger_time, "duration_ms": self.duration_ms, "sync_ms": self.sync_ms,
                "async_ms": self.async_ms, "alignment_ms": self.alignment_ms, "bytes": self.bytes,
                "persisted_bytes": self.persisted_bytes,
                "rows": self.rows, "acks": self.acks, "expected_acks": self.expected_acks, "rounds": self.rounds,
                "operators": {uid: s.to_dict() for uid, s in sorted(self.operators.items())},
                "backlog": dict(sorted(self.backlog.items())),
                "dead_letters": dict(sorted(self.dead_letters.items())),
                "subtasks": [t.to_dict() for t in self.subtasks],
                "s3_requests": None if self.s3_requests is None else self.s3_requests.to_dict(),
                "executor_s3_requests": None if self.executor_s3_requests is None
                else self.executor_s3_requests.to_dict(),
                "executor_s3_requests_counting": None if self.executor_s3_requests_counting is None
                else self.executor_s3_requests_counting.value,
                "sink_s3_requests_counting": dict(sorted(self.sink_s3_requests_counting.items()))}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CheckpointStats:
        return cls(trigger_time=str(d["trigger_time"]), duration_ms=d.get("duration_ms", 0.0),
                   sync_ms=d.get("sync_ms", 0.0), async_ms=d.get("async_ms", 0.0),
                   alignment_ms=d.get("alignment_ms", 0.0), bytes=int(d.get("bytes", 0)),
                   persisted_bytes=None if d.get("persisted_bytes") is None else int(d["persisted_bytes"]),
                   rows=int(d.get("rows", 0)), acks=int(d.get("acks", 0)),
                   expected_acks=int(d.get("expected_acks", 0)), rounds=int(d.get("rounds", 1)),
                   operators={uid: OperatorStats.from_dict(s) for uid, s in d.get("operators", {}).items()},
                   backlog=d.get("backlog", {}), dead_letters=d.get("dead_letters", {}),
                   subtasks=tuple(SubtaskStats.from_dict(t) for t in d.get("subtasks", ())),
                   s3_requests=None if d.get("s3_requests") is None
                   else StorageRequests.from_dict(d["s3_requests"]),
                   executor_s3_requests=None if d.get("executor_s3_requests") is None
                   else StorageRequests.from_dict(d["executor_s3_requests"]),
                   executor_s3_requests_counting=None if d.get("executor_s3_requests_counting") is None
                   else RequestCounting(d["executor_s3_requests_counting"]),
                   sink_s3_requests_counting=d.get("sink_s3_requests_counting") or {})
