"""Checkpoint history of a job, the way Flink's web UI shows it (read-only; used by the Airflow plugin).

Lists every ``chk-<id>`` directory of the job (COMPLETED, PENDING = in progress or aborted, CORRUPT) and
its savepoints (the job's ``savepoints/`` directory plus savepoints taken through Airflow to other
targets), with id, status, trigger time, duration, size, alignment time and acknowledgements per operator.
Nothing here writes anything.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from pipeline.exceptions import CheckpointError, ObjectNotFoundError, StorageError
from pipeline.fileio import FileIO, join_uri
from pipeline.layout import JobLayout, pending_uri

__all__ = ["OperatorRow", "CheckpointRow", "CheckpointHistory", "list_jobs"]


@dataclass(frozen=True, slots=True)
class OperatorRow:
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


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """One line of the history table."""

    checkpoint_id: int
    kind: str                    # checkpoint | savepoint
    status: str                  # COMPLETED | PENDING | CORRUPT
    epoch: int | None
    barrier_time: str | None
    trigger_time: str | None
    duration_ms: float | None
    state_bytes: int | None
    sink_bytes: int | None
    alignment_ms: float | None
    acks: int | None
    expected_acks: int | None
    parallelism: int | None
    parent_id: int | None
    location: str
    records: Mapping[str, int] = field(default_factory=dict)
    operators: tuple[OperatorRow, ...] = ()
    problem: str | None = None
    checkpointed_bytes: int | None = None   # what this checkpoint wrote; ``state_bytes`` is the full state
    s3_requests: Mapping[str, int] | None = None  # the driver's S3 requests by kind (CheckpointStats.s3_requests)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["records"] = dict(self.records)
        d["operators"] = [asdict(o) for o in self.operators]
        d["s3_requests"] = None if self.s3_requests is None else dict(self.s3_requests)
        return d


def _row_from_metadata(md, location: str, status: str = "COMPLETED") -> CheckpointRow:
    st = md.stats
    ops = ()
    if st is not None:
        ops = tuple(OperatorRow(uid=o.uid, subtasks=o.subtasks, acks=o.acks, rows=o.rows, bytes=o.bytes,
                                sync_ms=o.sync_ms, async_ms=o.async_ms, alignment_ms=o.alignment_ms,
                                start_delay_ms=o.start_delay_ms, inflight_bytes=o.inflight_bytes, mode=o.mode)
                    for _, o in sorted(st.operators.items()))
    records = {}
    extra_records = (md.extra or {}).get("records") if hasattr(md, "extra") else None
    if isinstance(extra_records, Mapping):
        records = {str(k): int(v) for k, v in extra_records.items()}
    sink_bytes = sum(f.bytes for s in md.sinks.values() for f in s.files)
    return CheckpointRow(
        checkpoint_id=md.checkpoint_id, kind=md.kind, status=status, epoch=md.epoch, barrier_time=md.barrier_time,
        trigger_time=st.trigger_time if st else None, duration_ms=st.duration_ms if st else None,
        state_bytes=st.bytes if st else None, sink_bytes=sink_bytes, alignment_ms=st.alignment_ms if st else None,
        acks=st.acks if st else None, expected_acks=st.expected_acks if st else None, parallelism=md.parallelism,
        parent_id=md.parent_id, location=location, records=records, operators=ops,
        checkpointed_bytes=st.checkpointed_bytes if st else None,
        s3_requests=st.s3_requests.to_dict() if st is not None and st.s3_requests is not None else None)


def _failure_text(d: Mapping[str, Any] | None) -> str | None:
    if not d:
        return None
    text = f"{d.get('reason')}: {d.get('reason_message') or ''}".rstrip(": ")
    if d.get("cause"):
        text += f" - {d['cause']}"
    return text + f" (at {d.get('failed_at')}, runner {d.get('runner') or '?'})"


class CheckpointHistory:
    """Read-only view of one job's checkpoints and savepoints."""

    def __init__(self, fileio: FileIO, checkpoint_root: str, job: str, *,
                 fileio_for=None) -> None:
        from pipeline.checkpoint.store import CompletedCheckpointStore
        self.fileio = fileio
        self.job = job
        self.job_root = join_uri(checkpoint_root, job)
        self.checkpoint_root = checkpoint_root
        self.store = CompletedCheckpointStore(fileio, self.job_root, job=job)
        self._fileio_for = fileio_for or (lambda uri: fileio)

    def exists(self) -> bool:
        return self.fileio.exists(JobLayout(self.job_root).job_json())

    def job_info(self) -> dict[str, Any]:
        try:
            return json.loads(self.fileio.read_bytes(JobLayout(self.job_root).job_json()))
        except (ObjectNotFoundError, ValueError):
            return {}

    def control(self) -> dict[str, Any]:
        from pipeline.orchestration.control import ControlStore
        try:
            return ControlStore(self.fileio, self.checkpoint_root, self.job).control().to_dict()
        except (StorageError, ValueError):
            return {}

    def _pending_row(self, info) -> CheckpointRow:
        from pipeline.checkpoint.pending import PendingManifest
        try:
            m = PendingManifest.from_json(self.fileio.read_bytes(pending_uri(info.location)),
                                          pending_uri(info.location))
        except (ObjectNotFoundError, CheckpointError, StorageError):
            return CheckpointRow(info.checkpoint_id, "checkpoint", "PENDING", None, None, None, None, None, None,
                                 None, None, None, None, None, info.location, problem="no _metadata (in progress, "
                                 "aborted or crashed)")
        return CheckpointRow(m.checkpoint_id, m.kind, "PENDING", m.epoch, m.barrier_time, m.trigger_time, None, None,
                             None, None, None, len(m.expected_tasks), m.parallelism, m.parent_id, info.location,
                             problem="no _metadata yet (in progress, aborted or crashed)")

    def checkpoints(self) -> list[CheckpointRow]:
        """Every checkpoint directory, newest first."""
        from pipeline.checkpoint.store import CheckpointDirStatus
        rows = []
        for info in self.store.inspect():
            if info.status is CheckpointDirStatus.COMPLETED and info.checkpoint is not None:
                rows.append(_row_from_metadata(info.checkpoint.metadata, info.location))
            elif info.status is CheckpointDirStatus.PENDING:
                rows.append(self._pending_row(info))
            else:
                rows.append(CheckpointRow(info.checkpoint_id, "checkpoint", "CORRUPT", None, None, None, None, None,
                                          None, None, None, None, None, None, info.location, problem=info.problem))
        failed = {d.get("checkpoint_id"): d for d in self.failed() if d.get("kind", "checkpoint") == "checkpoint"}
        out = []
        for r in rows:  # a pending directory whose abort was recorded (deletion failed or not yet collected)
            d = failed.pop(r.checkpoint_id, None)
            out.append(replace(r, status="FAILED", problem=_failure_text(d)) if d and r.status == "PENDING" else r)
        for cid, d in failed.items():  # aborted and deleted: only the record is left
            out.append(CheckpointRow(int(cid), "checkpoint", "FAILED", d.get("epoch"), d.get("barrier_time"),
                                     d.get("trigger_time") or None, None, None, None, None, None, None,
                                     d.get("parallelism"), d.get("parent_id"), "", problem=_failure_text(d)))
        return sorted(out, key=lambda r: r.checkpoint_id, reverse=True)

    def failed(self) -> list[dict]:
        """Recorded failures (aborted, declined, expired, fenced), newest first."""
        from pipeline.checkpoint.failed import FailedCheckpointLog
        try:
            return FailedCheckpointLog(self.fileio, self.job_root).list()
        except StorageError:
            return []

    def _savepoint_locations(self) -> list[str]:
        from pipeline.orchestration.control import ControlStore
        locs = [join_uri(self.store.savepoints_uri, n) for n in self.fileio.list_dirs(self.store.savepoints_uri)]
        try:
            locs += ControlStore(self.fileio, self.checkpoint_root, self.job).savepoint_locations()
        except StorageError:
            pass
        return list(dict.fromkeys(loc.rstrip("/") for loc in locs))

    def savepoints(self) -> list[CheckpointRow]:
        """Savepoints of the job, newest first (unreadable ones are listed as CORRUPT)."""
        from pipeline.checkpoint.completed import CompletedCheckpoint
        rows = []
        for loc in self._savepoint_locations():
            try:
                cp = CompletedCheckpoint.load(self._fileio_for(loc), loc)
            except ObjectNotFoundError:
                continue
            except (CheckpointError, StorageError) as e:
                rows.append(CheckpointRow(-1, "savepoint", "CORRUPT", None, None, None, None, None, None, None, None,
                                          None, None, None, loc, problem=str(e)))
                continue
            if cp.metadata.job != self.job:
                continue
            rows.append(_row_from_metadata(cp.metadata, cp.location))
        return sorted(rows, key=lambda r: r.checkpoint_id, reverse=True)

    def head_id(self) -> int | None:
        latest = self.store.latest()
        return latest.checkpoint_id if latest is not None else None

    def detail(self, checkpoint_id: int, *, kind: str = "checkpoint") -> dict[str, Any]:
        """Everything about one checkpoint (or savepoint with that id): summary row, per-operator stats,
        state handles, positions and barriers per source partition, sink files, backlog, dead letters."""
        from pipeline.checkpoint.completed import CompletedCheckpoint
        if kind == "savepoint":
            cp = None
            for loc in self._savepoint_locations():
                try:
                    c = CompletedCheckpoint.load(self._fileio_for(loc), loc)
                except (ObjectNotFoundError, CheckpointError, StorageError):
                    continue
                if c.metadata.checkpoint_id == checkpoint_id and c.metadata.job == self.job:
                    cp = c
                    break
            if cp is None:
                raise ObjectNotFoundError(f"job {self.job!r} has no savepoint {checkpoint_id}")
            status = "COMPLETED"
        else:
            info = next((i for i in self.store.inspect() if i.checkpoint_id == checkpoint_id), None)
            if info is None:
                raise ObjectNotFoundError(f"job {self.job!r} has no checkpoint {checkpoint_id} under "
                                          f"{self.store.checkpoints_uri}")
            if info.checkpoint is None:
                row = self._pending_row(info) if info.problem is None else CheckpointRow(
                    checkpoint_id, "checkpoint", "CORRUPT", None, None, None, None, None, None, None, None, None,
                    None, None, info.location, problem=info.problem)
                return {"summary": row.to_dict(), "operators": [], "state": [], "sources": [], "sinks": [],
                        "backlog": {}, "dead_letters": {}, "metadata": None}
            cp, status = info.checkpoint, "COMPLETED"
        md = cp.metadata
        row = _row_from_metadata(md, cp.location, status)
        sources = []
        for src in sorted(set(md.positions) | set(md.barriers)):
            parts = sorted(set(md.positions.get(src, {})) | set(md.barriers.get(src, {})), key=lambda p: int(p))
            for p in parts:
                pos, bar = md.positions.get(src, {}).get(p), md.barriers.get(src, {}).get(p)
                sources.append({"source": src, "partition": p,
                                "position": f"{pos.seq}:{pos.row}" if pos else None,
                                "barrier": f"{bar.seq}:{bar.row}" if bar else None})
        state = [{"operator": h.operator_uid, "subtask": h.subtask, "name": h.name,
                  "key_groups": f"{h.kg_start}-{h.kg_end}", "rows": h.file.rows if h.file else 0,
                  "bytes": h.file.bytes if h.file else 0, "file": h.file.uri if h.file else None,
                  "sha256": (h.file.sha256[:12] + "...") if h.file else None}
                 for h in md.state_handles()]
        sinks = [{"table": t, "full": s.full, "files": len(s.files), "rows": sum(f.rows for f in s.files),
                  "bytes": sum(f.bytes for f in s.files)} for t, s in sorted(md.sinks.items())]
        st = md.stats
        return {"summary": row.to_dict(), "operators": [asdict(o) for o in row.operators], "state": state,
                "subtasks": [t.to_dict() for t in st.subtasks] if st else [],
                "sources": sources, "sinks": sinks,
                "backlog": dict(st.backlog) if st else {}, "dead_letters": dict(st.dead_letters) if st else {},
                "rounds": st.rounds if st else None, "sync_ms": st.sync_ms if st else None,
                "async_ms": st.async_ms if st else None, "checkpoint_mode": md.checkpoint_mode,
                "alignment": md.alignment, "max_parallelism": md.max_parallelism, "created_at": md.created_at,
                "metadata": json.loads(md.to_json()) if hasattr(md, "to_json") else None}


def list_jobs(fileio: FileIO, checkpoint_root: str, known: list[str] | None = None) -> list[str]:
    """Jobs that have a ``job.json`` under the checkpoint root (plus ``known`` registered jobs)."""
    names = set(known or [])
    try:
        for name in fileio.list_dirs(checkpoint_root):
            if fileio.exists(JobLayout.of(checkpoint_root, name).job_json()):
                names.add(name)
    except StorageError:
        pass
    return sorted(names)
