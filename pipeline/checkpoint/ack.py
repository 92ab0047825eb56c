"""Acknowledgements: the :class:`AckResult` of delivering one, and the :class:`TaskAcknowledgement` itself.

A Spark task's acknowledgement of checkpoint n is the set of handles it wrote (Flink's
``AcknowledgeCheckpoint`` carrying a ``TaskStateSnapshot``): state handles, staged sink files,
channel state (unaligned), plus its metrics. :func:`acks_from_rows` groups the flat *handle rows*
that operator tasks yield from ``mapInArrow`` into one acknowledgement per ``(operator, subtask)``.

Handle row schema accepted by :func:`acks_from_rows` (extra keys are ignored)::

    kind       "state" | "output" | "channel" | "ack"   ("ack": no file, only marks the subtask)
    operator   operator uid            (alias: operator_uid)
    subtask    int
    name       state name (kind=state), sink table (kind=output), channel name (kind=channel)
    kg_start, kg_end                   key-group range of the subtask (inclusive)
    uri, rows, bytes, sha256           the file (uri None/empty: nothing written); of a state: its chain's base
    deltas, state_rows, persisted_bytes  state: the chain's delta files (JSON), rows it represents, bytes this
                                       checkpoint wrote (see pipeline.state.chain; optional)
    sync_ms, async_ms, alignment_ms, start_delay_ms, inflight_bytes, in_rows   metrics (optional)
    ack_ts_ms  wall clock (Unix ms) when the subtask finished its snapshot (optional; max over its rows)
    mode       "aligned" | "unaligned" | "at_least_once" ... (optional)

Metrics of several rows of the same subtask are combined: times take the max, counts the sum of
distinct rows (``in_rows`` the max, as every row of a subtask repeats it).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Mapping

from pipeline.checkpoint._frozen import FrozenDict
from pipeline.checkpoint.handles import ChannelStateHandle, FileHandle, StateHandle
from pipeline.checkpoint.stats import TaskMetrics
from pipeline.exceptions import CheckpointError

__all__ = ["AckResult", "TaskAcknowledgement", "acks_from_rows"]


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


def _opt_file(row: Mapping[str, Any]) -> FileHandle | None:
    uri = row.get("uri")
    if not uri:
        return None
    return FileHandle(uri=str(uri), rows=int(row.get("rows") or 0), bytes=int(row.get("bytes") or 0),
                      sha256=str(row.get("sha256") or ""))


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _deltas(raw: Any) -> tuple[FileHandle, ...]:
    """The delta files of a state handle row (JSON text or a list of dicts; None: none)."""
    if raw is None or raw == "":
        return ()
    items = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    return tuple(FileHandle.from_dict(f) for f in items)


def acks_from_rows(rows: Iterable[Mapping[str, Any] | Any]) -> list[TaskAcknowledgement]:
    """Group flat handle rows (dicts or Spark ``Row``s) into one acknowledgement per subtask.

    Order: by ``(operator, subtask)``; within a subtask, handles keep their row order.
    """
    groups: dict[tuple[str, int], dict[str, Any]] = {}
    for raw in rows:
        row: Mapping[str, Any] = raw.asDict() if hasattr(raw, "asDict") else raw
        uid = row.get("operator_uid", row.get("operator"))
        if uid is None or row.get("subtask") is None:
            raise CheckpointError(f"handle row without operator/subtask: {dict(row)!r}")
        key = (str(uid), int(row["subtask"]))
        g = groups.setdefault(key, {"state": [], "sink": {}, "channel": [], "m": {}, "modes": set()})
        kind = str(row.get("kind") or "state")
        name = str(row.get("name") or "")
        fh = _opt_file(row)
        if kind == "state":
            g["state"].append(StateHandle(operator_uid=key[0], subtask=key[1], kg_start=int(row.get("kg_start") or 0),
                                          kg_end=int(row["kg_end"]) if row.get("kg_end") is not None else -1,
                                          name=name, file=fh, deltas=_deltas(row.get("deltas")),
                                          state_rows=_opt_int(row.get("state_rows")) if fh else None,
                                          persisted_bytes=_opt_int(row.get("persisted_bytes")) if fh else None))
        elif kind == "output":
            files = g["sink"].setdefault(name, [])
            if fh is not None:
                files.append(fh)
        elif kind == "channel":
            g["channel"].append(ChannelStateHandle(operator_uid=key[0], subtask=key[1], channel=name, file=fh))
        elif kind != "ack":
            raise CheckpointError(f"handle row of {key[0]}[{key[1]}] has unknown kind {kind!r}")
        m = g["m"]
        for t in ("sync_ms", "async_ms", "alignment_ms", "start_delay_ms", "in_rows", "ack_ts_ms"):
            if row.get(t) is not None:
                m[t] = max(m.get(t, 0), row[t])
        if row.get("inflight_bytes") is not None:
            m["inflight_bytes"] = m.get("inflight_bytes", 0) + int(row["inflight_bytes"])
        if row.get("mode"):
            g["modes"].add(str(row["mode"]))
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
