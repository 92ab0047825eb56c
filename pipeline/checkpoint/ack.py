"""Acknowledgements: the :class:`AckResult` of delivering one, and the :class:`TaskAcknowledgement` itself.

A Spark task's acknowledgement of checkpoint n is the set of handles it wrote (Flink's
``AcknowledgeCheckpoint`` carrying a ``TaskStateSnapshot``): state handles, staged sink files,
channel state (unaligned), plus its metrics. :func:`acks_from_reports` groups the typed
:class:`~pipeline.checkpoint.report.TaskReport` s that operator tasks return (decoded from their ``mapInArrow``
rows by :mod:`pipeline.runtime.operators.report_codec`) into one acknowledgement per ``(operator, subtask)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Mapping

from pipeline.checkpoint._frozen import FrozenDict
from pipeline.checkpoint.handles import ChannelStateHandle, FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.checkpoint.stats import TaskMetrics
from pipeline.exceptions import CheckpointError

__all__ = ["AckResult", "TaskAcknowledgement", "acks_from_reports"]


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
