"""Acknowledgements: the :class:`AckResult` of delivering one, the :class:`TaskAcknowledgement` itself and the
:class:`TaskMetrics` it carries (Flink's ``CheckpointMetrics``: sync/async/alignment time, start delay, in-flight
bytes).

A Spark task's acknowledgement of checkpoint n is the set of handles it wrote (Flink's
``AcknowledgeCheckpoint`` carrying a ``TaskStateSnapshot``): state handles, staged sink files,
channel state (unaligned), plus its metrics. :func:`acks_from_reports` groups the typed
:class:`~pipeline.checkpoint.report.TaskReport` s that operator tasks return (decoded from their ``mapInArrow``
rows by :mod:`pipeline.runtime.operators.report_codec`) into one acknowledgement per ``(operator, subtask)``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pipeline.checkpoint._frozen import FrozenDict
from pipeline.checkpoint.handles import ChannelStateHandle, FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.exceptions import CheckpointError

__all__ = ["AckResult", "TaskMetrics", "TaskAcknowledgement", "acks_from_reports"]


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
    ack_ts_ms: float = 0.0   # wall clock (Unix ms) at which the subtask finished its snapshot; 0: unknown

    def __post_init__(self) -> None:
        for name in ("sync_ms", "async_ms", "alignment_ms", "start_delay_ms", "ack_ts_ms"):
            object.__setattr__(self, name, float(getattr(self, name)))
        object.__setattr__(self, "inflight_bytes", int(self.inflight_bytes))
        object.__setattr__(self, "in_rows", int(self.in_rows))

    def to_dict(self) -> dict[str, Any]:
        return {"sync_ms": self.sync_ms, "async_ms": self.async_ms, "alignment_ms": self.alignment_ms,
                "start_delay_ms": self.start_delay_ms, "inflight_bytes": self.inflight_bytes,
                "in_rows": self.in_rows, "mode": self.mode, "ack_ts_ms": self.ack_ts_ms}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TaskMetrics:
        return cls(**{k: d[k] for k in ("sync_ms", "async_ms", "alignment_ms", "start_delay_ms",
                                        "inflight_bytes", "in_rows", "mode", "ack_ts_ms") if k in d})


class AckResult(Enum):
    """Result of delivering an acknowledgement to a pending checkpoint (Flink's ``TaskAcknowledgeResult``)."""

    SUCCESS = "success"        # first ack of an expected task
    DUPLICATE = "duplicate"    # that task had already acknowledged
    UNKNOWN = "unknown"        # the task is not part of this checkpoint
    DISCARDED = "discarded"    # the checkpoint was already aborted / disposed


@dataclass(frozen=True, slots=True)
class TaskAcknowledgement:
    """What one subtask reports for checkpoint n."""

    operator_uid: str
    subtask: int
    state: tuple[StateHandle, ...] = ()
    sink_files: Mapping[str, tuple[FileHandle, ...]] = field(default_factory=FrozenDict)
    channel_state: tuple[ChannelStateHandle, ...] = ()
    metrics: TaskMetrics = field(default_factory=TaskMetrics)

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", tuple(self.state))
        object.__setattr__(self, "channel_state", tuple(self.channel_state))
        object.__setattr__(self, "sink_files", FrozenDict(
            {str(t): tuple(fs) for t, fs in (self.sink_files or {}).items()}))
        if self.metrics is None:
            object.__setattr__(self, "metrics", TaskMetrics())
        for h in self.state:
            if h.operator_uid != self.operator_uid or h.subtask != self.subtask:
                raise CheckpointError(
                    f"state handle of {h.operator_uid}[{h.subtask}] ({h.file.uri if h.file else 'no file'}) "
                    f"delivered in the acknowledgement of {self.operator_uid}[{self.subtask}]")
        for c in self.channel_state:
            if c.operator_uid != self.operator_uid or c.subtask != self.subtask:
                raise CheckpointError(
                    f"channel state of {c.operator_uid}[{c.subtask}] delivered in the acknowledgement of "
                    f"{self.operator_uid}[{self.subtask}]")

    @property
    def task(self) -> tuple[str, int]:
        return (self.operator_uid, self.subtask)


def acks_from_reports(reports: Iterable[TaskReport]) -> list[TaskAcknowledgement]:
    """Group a round's :class:`~pipeline.checkpoint.report.TaskReport` s into one acknowledgement per subtask.

    Order: by ``(operator, subtask)``; within a subtask, handles keep their report order. Metrics of several
    reports of the same subtask are combined: times take the max, ``in_rows`` the max (every report of a subtask
    repeats it), the in-flight bytes are the channel files' bytes; ``mode`` is the one the driver's reports
    name (``"mixed"`` if they differ, ``"aligned"`` if none does).
    """
    groups: dict[tuple[str, int], dict[str, Any]] = {}
    for r in reports:
        key = (r.operator_uid, r.subtask)
        g = groups.setdefault(key, {"state": [], "sink": {}, "channel": [], "m": {}, "modes": set()})
        if r.kind is ReportKind.STATE:
            g["state"].append(r.state)
        elif r.kind is ReportKind.OUTPUT:
            files = g["sink"].setdefault(r.name, [])
            if r.file is not None:
                files.append(r.file)
        elif r.kind is ReportKind.CHANNEL:
            g["channel"].append(r.channel_handle())
            if r.file is not None:
                g["m"]["inflight_bytes"] = g["m"].get("inflight_bytes", 0) + r.file.bytes
        m = g["m"]
        for t in ("sync_ms", "async_ms", "alignment_ms", "start_delay_ms", "in_rows", "ack_ts_ms"):
            m[t] = max(m.get(t, 0), getattr(r, t))
        if r.mode:
            g["modes"].add(r.mode)
    out = []
    for key in sorted(groups):
        g = groups[key]
        modes = g["modes"]
        mode = next(iter(modes)) if len(modes) == 1 else ("mixed" if modes else "aligned")
        metrics = TaskMetrics(mode=mode, **g["m"])
        out.append(TaskAcknowledgement(operator_uid=key[0], subtask=key[1], state=tuple(g["state"]),
                                       sink_files={t: tuple(fs) for t, fs in g["sink"].items()},
                                       channel_state=tuple(g["channel"]), metrics=metrics))
    return out
