"""Checkpoint history of a job, the way Flink's web UI shows it (read-only; used by the Airflow plugin).

Lists every ``chk-<id>`` directory of the job (COMPLETED, PENDING = in progress or aborted, CORRUPT) and
its savepoints (the job's ``savepoints/`` directory plus savepoints taken through Airflow to other
targets), with id, status, trigger time, duration, size, alignment time and acknowledgements per operator.
Nothing here writes anything.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from pipeline.checkpoint.channel import partition_of
from pipeline.checkpoint.completed import CompletedCheckpoint
from pipeline.checkpoint.failed import FailedCheckpointLog
from pipeline.checkpoint.history import CheckpointRow, row_from_metadata
from pipeline.checkpoint.ids import CheckpointIdCounter, airflow_task_of
from pipeline.checkpoint.pending import PendingManifest
from pipeline.checkpoint.restores import RestoreLog
from pipeline.checkpoint.store import CheckpointDirStatus, CompletedCheckpointStore
from pipeline.exceptions import CheckpointError, ObjectNotFoundError, StorageError
from pipeline.fileio import FileIO, join_uri
from pipeline.layout import JobLayout, pending_uri
from pipeline.orchestration.control import ControlStore

__all__ = ["CheckpointHistory", "list_jobs"]


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
        try:
            return ControlStore(self.fileio, self.checkpoint_root, self.job).control().to_dict()
        except (StorageError, ValueError):
            return {}

    def _pending_row(self, info) -> CheckpointRow:
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
        rows = []
        for info in self.store.inspect():
            if info.status is CheckpointDirStatus.COMPLETED and info.checkpoint is not None:
                rows.append(row_from_metadata(info.checkpoint.metadata, info.location))
            elif info.status is CheckpointDirStatus.PENDING:
                rows.append(self._pending_row(info))
            else:
                rows.append(CheckpointRow(info.checkpoint_id, "checkpoint", "CORRUPT", None, None, None, None, None,
                                          None, None, None, None, None, None, info.location, problem=info.problem))
        failed = {int(d["checkpoint_id"]): d for d in self.failed()
                  if d.get("kind", "checkpoint") == "checkpoint" and d.get("checkpoint_id") is not None}
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
        try:
            return FailedCheckpointLog(self.fileio, self.job_root).list()
        except StorageError:
            return []

    def restores(self) -> list[dict]:
        """Recorded restores and rewinds, newest first (:mod:`pipeline.checkpoint.restores`)."""
        try:
            return [e.to_dict() for e in RestoreLog(self.fileio, self.job_root).list()]
        except StorageError:
            return []

    def triggered(self) -> int | None:
        """The newest claimed checkpoint id: how many checkpoints were ever triggered (ids are claimed from 1)."""
        try:
            return CheckpointIdCounter(self.fileio, self.job_root).latest_claimed()
        except StorageError:
            return None

    def _savepoint_locations(self) -> list[str]:
        locs = [join_uri(self.store.savepoints_uri, n) for n in self.fileio.list_dirs(self.store.savepoints_uri)]
        try:
            locs += ControlStore(self.fileio, self.checkpoint_root, self.job).savepoint_locations()
        except StorageError:
            pass
        return list(dict.fromkeys(loc.rstrip("/") for loc in locs))

    def savepoints(self) -> list[CheckpointRow]:
        """Savepoints of the job, newest first (unreadable ones are listed as CORRUPT)."""
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
            rows.append(row_from_metadata(cp.metadata, cp.location))
        return sorted(rows, key=lambda r: r.checkpoint_id, reverse=True)

    def head_id(self) -> int | None:
        latest = self.store.latest()
        return latest.checkpoint_id if latest is not None else None

    def detail(self, checkpoint_id: int, *, kind: str = "checkpoint") -> dict[str, Any]:
        """Everything about one checkpoint (or savepoint with that id): summary row, per-operator stats,
        state handles, positions and barriers per source partition, sink files, backlog, dead letters."""
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
        row = row_from_metadata(md, cp.location, status)
        sources = []
        for src in sorted(set(md.positions) | set(md.barriers)):
            parts = sorted(set(md.positions.get(src, {})) | set(md.barriers.get(src, {})), key=partition_of)
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
        try:   # who took it: the runner in the write-ahead manifest kept beside _metadata (one GET)
            runner = PendingManifest.from_json(self._fileio_for(cp.location).read_bytes(pending_uri(cp.location)),
                                               pending_uri(cp.location)).runner
        except (ObjectNotFoundError, CheckpointError, StorageError):
            runner = None
        return {"summary": row.to_dict(), "operators": [o.to_dict() for o in row.operators], "state": state,
                "taken_by": {"runner": runner, "airflow": airflow_task_of(runner)} if runner else None,
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
