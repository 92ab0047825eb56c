"""PendingCheckpoint: a triggered checkpoint collecting task acknowledgements.

Life cycle (guarded; illegal transitions raise)::

    PENDING --finalize() [all acks in]--> COMPLETED   (``_metadata`` written last, create-only)
    PENDING --abort(reason)------------> ABORTED     (its directory is deleted)

Its write-ahead manifest :class:`PendingManifest` (``_pending.json``, written create-only by the
coordinator at trigger time, before any task runs) records what the checkpoint will be: id, parent,
epoch, barrier positions, expected tasks and the runtime's plan. A checkpoint that spans several
rounds (backlog) can be picked up again from it with :meth:`PendingCheckpoint.load`.

``acknowledge_task`` returns an :class:`~pipeline.checkpoint.ack.AckResult` like Flink's
``PendingCheckpoint.acknowledgeTask``: SUCCESS (first ack of an expected task), DUPLICATE (already
acknowledged), UNKNOWN (not an expected task), DISCARDED (the checkpoint was already disposed).

Over 400 lines: one concept (Flink's PendingCheckpoint with its write-ahead manifest): the acknowledgement
bookkeeping and the manifest share its state.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Iterable, Mapping, Sequence

from pipeline.barriers.events import CheckpointingMode, CheckpointType
from pipeline.checkpoint._frozen import FrozenDict, enum_member
from pipeline.checkpoint.ack import AckResult, TaskAcknowledgement, TaskMetrics
from pipeline.checkpoint.completed import CompletedCheckpoint, delete_location
from pipeline.checkpoint.failure import CheckpointFailureReason
from pipeline.checkpoint.handles import ChannelStateHandle, FileHandle, Position, SinkHandle, StateHandle
from pipeline.checkpoint.metadata import (
    FORMAT_VERSION,
    CheckpointMetadata,
    _positions,
    _positions_dict,
    freeze_json,
    iso_utc,
    thaw_json,
)
from pipeline.checkpoint.stats import CheckpointStats, OperatorStats, SubtaskStats
from pipeline.exceptions import (
    CheckpointDeclinedError,
    CheckpointError,
    CheckpointFencedError,
    ConditionalWriteError,
    CorruptCheckpointError,
    StorageError,
)
from pipeline.fileio import FileIO, join_uri
from pipeline.fileio.request_counter import RequestCounting, StorageRequests
from pipeline.layout import METADATA_FILE, PENDING_FILE

__all__ = ["PendingCheckpoint", "PendingManifest", "PendingState", "PENDING_FILE"]

log = logging.getLogger(__name__)



class PendingState(Enum):
    PENDING = "pending"
    COMPLETED = "completed"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingManifest:
    """The write-ahead record of a triggered checkpoint (``_pending.json``)."""

    job: str
    checkpoint_id: int
    parent_id: int | None
    epoch: int
    barrier_time: str
    checkpoint_mode: CheckpointingMode  # a str is coerced
    alignment: str
    max_parallelism: int
    parallelism: int
    expected_tasks: tuple[tuple[str, int], ...]
    kind: CheckpointType = CheckpointType.CHECKPOINT  # a str is coerced
    positions: Mapping[str, Mapping[str, Position]] = field(default_factory=FrozenDict)
    barriers: Mapping[str, Mapping[str, Position]] = field(default_factory=FrozenDict)
    sink_tables: tuple[str, ...] = ()
    trigger_time: str = ""
    runner: str = ""
    plan: Mapping[str, Any] = field(default_factory=FrozenDict)   # free-form JSON (segments, rounds...)
    format: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "kind", enum_member(CheckpointType, self.kind, f"checkpoint {self.checkpoint_id}: kind"))
        set_(self, "checkpoint_mode", enum_member(CheckpointingMode, self.checkpoint_mode,
                                                  f"checkpoint {self.checkpoint_id}: checkpoint_mode"))
        tasks = tuple(sorted({(str(u), int(s)) for u, s in self.expected_tasks}))
        if len(tasks) != len(tuple(self.expected_tasks)):
            raise ValueError(f"checkpoint {self.checkpoint_id}: duplicate expected tasks")
        # no tasks: a job without stateful operators (its sink writers' files are in _metadata, not in acks)
        set_ = object.__setattr__
        set_(self, "expected_tasks", tasks)
        set_(self, "positions", _positions(self.positions))
        set_(self, "barriers", _positions(self.barriers))
        set_(self, "sink_tables", tuple(sorted(set(self.sink_tables))))
        set_(self, "plan", freeze_json(self.plan or {}))
        if not self.trigger_time:
            set_(self, "trigger_time", iso_utc())

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "job": self.job, "checkpoint_id": self.checkpoint_id,
                "parent_id": self.parent_id, "kind": self.kind, "epoch": self.epoch,
                "barrier_time": self.barrier_time, "checkpoint_mode": self.checkpoint_mode,
                "alignment": self.alignment, "max_parallelism": self.max_parallelism,
                "parallelism": self.parallelism, "expected_tasks": [list(t) for t in self.expected_tasks],
                "positions": _positions_dict(self.positions), "barriers": _positions_dict(self.barriers),
                "sink_tables": list(self.sink_tables), "trigger_time": self.trigger_time,
                "runner": self.runner, "plan": thaw_json(self.plan)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1, allow_nan=False) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, uri: str = "<memory>") -> "PendingManifest":
        try:
            d = json.loads(text)
            if not isinstance(d, dict) or d.get("format") != FORMAT_VERSION:
                raise CorruptCheckpointError(
                    f"unsupported pending manifest format {d.get('format') if isinstance(d, dict) else None!r} "
                    f"in {uri}")
            return cls(format=d["format"], job=d["job"], checkpoint_id=int(d["checkpoint_id"]),
                       parent_id=d["parent_id"], kind=enum_member(CheckpointType, d["kind"], "pending checkpoint: kind"), epoch=int(d["epoch"]),
                       barrier_time=d["barrier_time"], checkpoint_mode=enum_member(CheckpointingMode, d["checkpoint_mode"],
                                                                  "pending checkpoint: checkpoint_mode"),
                       alignment=d["alignment"], max_parallelism=int(d["max_parallelism"]),
                       parallelism=int(d["parallelism"]),
                       expected_tasks=tuple((str(u), int(s)) for u, s in d["expected_tasks"]),
                       positions=d["positions"], barriers=d["barriers"], sink_tables=tuple(d["sink_tables"]),
                       trigger_time=d["trigger_time"], runner=d.get("runner", ""), plan=d.get("plan") or {})
        except CorruptCheckpointError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptCheckpointError(f"unreadable pending manifest {uri}: {e!r}") from e


def _task_list(tasks: Iterable[tuple[str, int]], limit: int = 8) -> str:
    ts = sorted(tasks)
    shown = ", ".join(f"{u}[{s}]" for u, s in ts[:limit])
    return shown + (f" (+{len(ts) - limit} more)" if len(ts) > limit else "")


class PendingCheckpoint:
    """A triggered checkpoint waiting for the acknowledgements of its tasks."""

    def __init__(self, manifest: PendingManifest, location: str, fileio: FileIO, *,
                 clock: Callable[[], float] = time.time, started_at: float | None = None,
                 preexisting: Iterable[str] = ()) -> None:
        self.manifest = manifest
        # files that were at the location before this checkpoint was triggered (a user-chosen savepoint
        # target): an abort deletes only what this checkpoint wrote, never these
        self.preexisting = frozenset(preexisting)
        self.location = location.rstrip("/")
        self.fileio = fileio
        self._clock = clock
        self.started_at = clock() if started_at is None else started_at
        self._expected = frozenset(manifest.expected_tasks)
        self._acks: dict[tuple[str, int], TaskAcknowledgement] = {}
        self._state = PendingState.PENDING
        self._failure_reason: CheckpointFailureReason | None = None
        self._failure_cause: BaseException | None = None
        self._lock = threading.RLock()

    # -- accessors ---------------------------------------------------------------------------------
    @property
    def checkpoint_id(self) -> int:
        return self.manifest.checkpoint_id

    @property
    def job(self) -> str:
        return self.manifest.job

    @property
    def parent_id(self) -> int | None:
        return self.manifest.parent_id

    @property
    def epoch(self) -> int:
        return self.manifest.epoch

    @property
    def kind(self) -> str:
        return self.manifest.kind

    @property
    def state(self) -> PendingState:
        return self._state

    @property
    def is_disposed(self) -> bool:
        return self._state is not PendingState.PENDING

    @property
    def failure_reason(self) -> CheckpointFailureReason | None:
        return self._failure_reason

    @property
    def failure_cause(self) -> BaseException | None:
        return self._failure_cause

    @property
    def pending_uri(self) -> str:
        return join_uri(self.location, PENDING_FILE)

    @property
    def metadata_uri(self) -> str:
        return join_uri(self.location, METADATA_FILE)

    @property
    def expected_tasks(self) -> frozenset[tuple[str, int]]:
        return self._expected

    @property
    def acknowledged_tasks(self) -> frozenset[tuple[str, int]]:
        with self._lock:
            return frozenset(self._acks)

    @property
    def not_yet_acknowledged_tasks(self) -> frozenset[tuple[str, int]]:
        with self._lock:
            return self._expected - frozenset(self._acks)

    @property
    def is_fully_acknowledged(self) -> bool:
        with self._lock:
            return len(self._acks) == len(self._expected)

    @property
    def acknowledgements(self) -> list[TaskAcknowledgement]:
        with self._lock:
            return [self._acks[k] for k in sorted(self._acks)]

    def describe(self) -> str:
        return f"{self.kind} {self.checkpoint_id} of job '{self.job}'"

    def elapsed_s(self) -> float:
        return self._clock() - self.started_at

    def __repr__(self) -> str:
        return (f"PendingCheckpoint(id={self.checkpoint_id}, job={self.job!r}, state={self._state.value}, "
                f"acks={len(self._acks)}/{len(self._expected)})")

    # -- write-ahead manifest ----------------------------------------------------------------------
    def write_manifest(self) -> None:
        """Write ``_pending.json`` create-only (an existing one means the id was reused: fenced)."""
        try:
            self.fileio.write_bytes(self.pending_uri, self.manifest.to_json().encode(), if_none_match=True)
        except ConditionalWriteError as e:
            raise CheckpointFencedError(
                f"{self.describe()}: pending manifest {self.pending_uri} already exists; another runner uses "
                "this checkpoint id") from e

    @classmethod
    def load(cls, fileio: FileIO, location: str, *, clock: Callable[[], float] = time.time) -> "PendingCheckpoint":
        """Re-open a pending checkpoint from its ``_pending.json`` (acks start empty)."""
        uri = join_uri(location, PENDING_FILE)
        manifest = PendingManifest.from_json(fileio.read_bytes(uri), uri)
        return cls(manifest, location, fileio, clock=clock)

    # -- acknowledgements --------------------------------------------------------------------------
    def acknowledge(self, ack: TaskAcknowledgement) -> AckResult:
        """Deliver one task's acknowledgement."""
        with self._lock:
            if self.is_disposed:
                return AckResult.DISCARDED
            if ack.task not in self._expected:
                log.warning("%s: acknowledgement from unknown task %s[%d]", self.describe(), *ack.task)
                return AckResult.UNKNOWN
            if ack.task in self._acks:
                return AckResult.DUPLICATE
            self._acks[ack.task] = ack
            return AckResult.SUCCESS

    def acknowledge_task(self, operator_uid: str, subtask: int, state: Sequence[StateHandle] = (), *,
                         sink_files: Mapping[str, Sequence[FileHandle]] | None = None,
                         channel_state: Sequence[ChannelStateHandle] = (),
                         metrics: TaskMetrics | None = None) -> AckResult:
        """Deliver the acknowledgement of subtask ``subtask`` of ``operator_uid`` with its handles."""
        return self.acknowledge(TaskAcknowledgement(
            operator_uid=operator_uid, subtask=subtask, state=tuple(state),
            sink_files={t: tuple(fs) for t, fs in (sink_files or {}).items()},
            channel_state=tuple(channel_state), metrics=metrics or TaskMetrics()))

    # -- abort -------------------------------------------------------------------------------------
    def abort(self, reason: CheckpointFailureReason, *, cause: BaseException | None = None,
              discard: bool = True) -> bool:
        """Abort (Flink ``abort``). Deletes the checkpoint directory unless ``discard=False``.

        Returns True if this call aborted it, False if it was already aborted.
        """
        with self._lock:
            if self._state is PendingState.COMPLETED:
                raise CheckpointError(f"cannot abort {self.describe()} ({reason.name}): it is already completed")
            if self._state is PendingState.ABORTED:
                return False
            self._state = PendingState.ABORTED
            self._failure_reason = reason
            self._failure_cause = cause
        log.warning("%s aborted: %s%s", self.describe(), reason, f" ({cause})" if cause else "")
        if discard:
            try:
                self._discard_own_files()
            except StorageError as e:  # leftovers are garbage, cleaned up later
                log.warning("could not delete aborted %s at %s: %s", self.describe(), self.location, e)
        return True

    def _discard_own_files(self) -> int:
        """Delete what this checkpoint wrote at its location (all of it unless the location held files
        before the trigger: those are the user's and stay, ``_metadata`` included)."""
        if not self.preexisting:
            return delete_location(self.fileio, self.location)
        n = 0
        for fi in self.fileio.list(self.location):
            if fi.uri not in self.preexisting:
                self.fileio.delete(fi.uri)
                n += 1
        return n

    # -- finalize ----------------------------------------------------------------------------------
    def build_metadata(self, *, positions: Mapping[str, Mapping[str, Position]] | None = None,
                       channel_state: Sequence[ChannelStateHandle] = (),
                       sinks_full: Mapping[str, bool] | None = None,
                       backlog: Mapping[str, int] | None = None,
                       dead_letters: Mapping[str, int] | None = None,
                       rounds: int = 1, extra: Mapping[str, Any] | None = None,
                       s3_requests: StorageRequests | None = None,
                       executor_s3_requests: StorageRequests | None = None,
                       executor_s3_requests_counting: RequestCounting | None = None,
                       sink_s3_requests_counting: Mapping[str, str] | None = None,
                       writer_files: Mapping[str, Sequence[FileHandle]] | None = None) -> CheckpointMetadata:
        """The ``_metadata`` this checkpoint would have if finalized now. ``writer_files``: per sink table, the files
        its stateless sink writer staged (no keyed state, so not an acknowledging task of the checkpoint).

        Over 8 parameters: one keyword per section of `_metadata`, all optional; a typed value per section would
        only rename them."""
        m = self.manifest
        acks = self.acknowledgements
        subtasks: dict[str, int] = {}
        for uid, _s in self._expected:
            subtasks[uid] = subtasks.get(uid, 0) + 1
        operators: dict[str, tuple[StateHandle, ...]] = {}
        for uid in sorted(subtasks):
            hs = [h for a in acks if a.operator_uid == uid for h in a.state]
            operators[uid] = tuple(sorted(hs, key=lambda h: (h.subtask, h.name, h.kg_start)))
        sink_files: dict[str, list[FileHandle]] = {t: [] for t in m.sink_tables}
        for a in acks:
            for table, files in a.sink_files.items():
                sink_files.setdefault(table, []).extend(files)
        for table, written in (writer_files or {}).items():
            sink_files.setdefault(table, []).extend(written)
        full = dict(sinks_full or {})
        unknown = set(full) - set(sink_files)
        if unknown:
            raise CheckpointError(f"{self.describe()}: 'full' flag given for unknown sink tables {sorted(unknown)}")
        sinks = {t: SinkHandle(tuple(fs), bool(full.get(t, False))) for t, fs in sink_files.items()}
        chan = [c for a in acks for c in a.channel_state] + list(channel_state)
        op_stats = {uid: OperatorStats.aggregate(uid, n, acks) for uid, n in subtasks.items()}
        now = self._clock()
        stats = CheckpointStats(
            trigger_time=m.trigger_time, duration_ms=round((now - self.started_at) * 1000.0, 3),
            sync_ms=max((s.sync_ms for s in op_stats.values()), default=0.0),
            async_ms=max((s.async_ms for s in op_stats.values()), default=0.0),
            alignment_ms=max((s.alignment_ms for s in op_stats.values()), default=0.0),
            bytes=sum(s.bytes for s in op_stats.values()), rows=sum(s.rows for s in op_stats.values()),
            # incremental snapshots reference files earlier checkpoints wrote: persisted is what this one wrote
            persisted_bytes=sum(s.checkpointed_bytes for s in op_stats.values()),
            acks=len(acks), expected_acks=len(self._expected), rounds=rounds, operators=op_stats,
            backlog=backlog or {}, dead_letters=dead_letters or {},
            subtasks=tuple(SubtaskStats.of(a, self.started_at * 1000.0) for a in acks),
            s3_requests=s3_requests, executor_s3_requests=executor_s3_requests,
            executor_s3_requests_counting=executor_s3_requests_counting,
            sink_s3_requests_counting=sink_s3_requests_counting or {})
        return CheckpointMetadata(
            job=m.job, checkpoint_id=m.checkpoint_id, parent_id=m.parent_id, kind=m.kind, epoch=m.epoch,
            barrier_time=m.barrier_time, checkpoint_mode=m.checkpoint_mode, alignment=m.alignment,
            max_parallelism=m.max_parallelism, parallelism=m.parallelism,
            positions=m.positions if positions is None else positions, barriers=m.barriers,
            channel_state=tuple(chan), operators=operators, sinks=sinks, stats=stats,
            created_at=iso_utc(now), extra=extra or {})

    def finalize(self, **metadata_kwargs: Any) -> CompletedCheckpoint:
        """Write ``_metadata`` (create-only, the commit point) and return the completed checkpoint.

        Keyword arguments are those of :meth:`build_metadata`. Raises CheckpointDeclinedError if the
        checkpoint was aborted, CheckpointError if acknowledgements are missing, CheckpointFencedError
        if ``_metadata`` already exists, StorageError if it cannot be written.
        """
        with self._lock:
            if self._state is PendingState.ABORTED:
                raise CheckpointDeclinedError(
                    f"cannot finalize {self.describe()}: it was aborted ({self._failure_reason})",
                    reason=self._failure_reason)
            if self._state is PendingState.COMPLETED:
                raise CheckpointError(f"{self.describe()} is already completed")
            missing = self._expected - frozenset(self._acks)
            if missing:
                raise CheckpointError(f"cannot finalize {self.describe()}: {len(missing)} of {len(self._expected)} "
                                      f"tasks have not acknowledged: {_task_list(missing)}")
            metadata = self.build_metadata(**metadata_kwargs)
            data = metadata.to_bytes()
            try:
                self.fileio.write_bytes(self.metadata_uri, data, if_none_match=True)
            except ConditionalWriteError as e:
                raise CheckpointFencedError(
                    f"{self.describe()}: {self.metadata_uri} already exists - another runner completed this "
                    "checkpoint id") from e
            except StorageError:
                # the PUT may have succeeded although the response was lost
                if not self._metadata_is(data):
                    raise
            self._state = PendingState.COMPLETED
        return CompletedCheckpoint(metadata, self.location)

    def _metadata_is(self, data: bytes) -> bool:
        try:
            return self.fileio.read_bytes(self.metadata_uri) == data
        except StorageError:
            return False
