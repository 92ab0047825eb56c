"""Failed checkpoints, kept for the checkpoint view (Flink's "failed checkpoints" with their reason).

An aborted checkpoint's directory is deleted (it is garbage), so its reason would be lost. The coordinator
records every abort - declined, expired, fenced by another runner, trigger failures - as a small document
``<job root>/failed/chk-<id>.json`` (the newest :data:`KEEP` are kept). Recording never fails a checkpoint.
"""
from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from pipeline.exceptions import EpochalError
from pipeline.fileio import FileIO, join_uri
from pipeline.layout import JobLayout, failed_record_id_of, failed_record_name

__all__ = ["FailedCheckpointLog", "KEEP"]

log = logging.getLogger(__name__)
KEEP = 100


class FailedCheckpointLog:
    def __init__(self, fileio: FileIO, job_root: str, *, keep: int = KEEP) -> None:
        self.fileio = fileio
        self.root = JobLayout(job_root).failed()
        self.keep = keep

    def record(self, pending: Any, reason: Any, cause: BaseException | None) -> None:
        """Record why ``pending`` (a PendingCheckpoint) was aborted; never raises."""
        try:
            m = pending.manifest
            doc = {"checkpoint_id": m.checkpoint_id, "kind": m.kind, "epoch": m.epoch, "barrier_time": m.barrier_time,
                   "trigger_time": m.trigger_time, "runner": m.runner, "parallelism": m.parallelism,
                   "parent_id": m.parent_id,
                   "failed_at": datetime.now(tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                   "reason": getattr(reason, "name", str(reason)), "reason_message": getattr(reason, "message", ""),
                   "counts_as_failure": bool(getattr(reason, "counts_as_failure", True)),
                   "cause": f"{type(cause).__name__}: {cause}" if cause is not None else None}
            self.fileio.write_bytes(join_uri(self.root, failed_record_name(m.checkpoint_id)),
                                    (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
            self._trim()
        except (EpochalError, OSError, AttributeError, ValueError) as e:  # a view: never fail the checkpoint
            log.warning("could not record the failure of checkpoint %s: %s", getattr(pending, "checkpoint_id", "?"), e)

    def _ids(self) -> list[int]:
        out = []
        for fi in self.fileio.list(self.root):
            name = fi.uri.rsplit("/", 1)[-1]
            cid = failed_record_id_of(name)
            if cid is not None:
                out.append(cid)
        return sorted(out)

    def _trim(self) -> None:
        ids = self._ids()
        for cid in ids[: max(0, len(ids) - self.keep)]:
            self.fileio.delete(join_uri(self.root, failed_record_name(cid)))

    def list(self) -> list[dict]:
        """Recorded failures, newest first (unreadable records are skipped)."""
        out = []
        for cid in reversed(self._ids()):
            try:
                out.append(json.loads(self.fileio.read_bytes(join_uri(self.root, failed_record_name(cid)))))
            except (EpochalError, ValueError):
                continue
        return out
