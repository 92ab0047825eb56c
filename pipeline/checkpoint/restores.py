"""Restores and rewinds, kept for the checkpoint history (Flink's "latest restore", for every one of them).

A restore (``epochal restore``, the restore DAG) makes a checkpoint or savepoint the job's restore point; a rewind
(a re-run of an interval already processed: a backfill with ``--reprocess-behavior completed``, *Clear* in
Airflow) goes back to the retained checkpoint before the interval. Either abandons the completed checkpoints
after its source: they stay listed, but are no longer on the head's lineage. Parent links show only the latest
such fork while the checkpoints are retained, so each event is recorded when it happens, as one small document
``<job root>/restores/<time>-<seq>.json`` (written once, never rewritten; the newest :data:`KEEP` are kept).
Recording never fails the restore or the rewind.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pipeline.exceptions import EpochalError
from pipeline.fileio import FileIO, join_uri
from pipeline.layout import RESTORES_DIR, restore_event_name

__all__ = ["RestoreEvent", "RestoreLog", "KEEP"]

log = logging.getLogger(__name__)
KEEP = 200


@dataclass(frozen=True)
class RestoreEvent:
    """One restore or rewind: what it went back to and what it left behind."""

    kind: Literal["restore", "rewind"]
    at: str                        #: UTC time, ISO 8601
    from_kind: str                 #: ``checkpoint`` or ``savepoint`` (``start``: a rewind to the sources' start)
    from_id: int | None            #: the checkpoint or savepoint id gone back to (None: the start)
    from_epoch: int | None
    from_location: str | None
    abandoned: tuple[int, ...]     #: completed checkpoints newer than the source, left off the new lineage
    checkpoint_id: int | None = None   #: a restore's new checkpoint (a rewind's is the next epoch's)
    parallelism: int | None = None
    rerun_epoch: int | None = None     #: a rewind: the epoch re-run

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["abandoned"] = list(self.abandoned)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RestoreEvent:
        kind = d["kind"]
        if kind not in ("restore", "rewind"):
            raise ValueError(f"unknown restore event kind {kind!r}")
        return cls(kind=kind, at=str(d["at"]), from_kind=str(d["from_kind"]), from_id=d.get("from_id"),
                   from_epoch=d.get("from_epoch"), from_location=d.get("from_location"),
                   abandoned=tuple(int(i) for i in d.get("abandoned") or ()), checkpoint_id=d.get("checkpoint_id"),
                   parallelism=d.get("parallelism"), rerun_epoch=d.get("rerun_epoch"))

    def describe(self) -> str:
        src = ("the start of the sources" if self.from_id is None
               else f"{self.from_kind} {self.from_id}" + (f" (epoch {self.from_epoch})" if self.from_epoch else ""))
        if self.kind == "rewind":
            what = f"rewound to {src} to re-run epoch {self.rerun_epoch}"
        else:
            what = f"restored from {src}" + (f" as checkpoint {self.checkpoint_id}" if self.checkpoint_id else "")
            if self.parallelism:
                what += f" at parallelism {self.parallelism}"
        gone = f"; abandoned checkpoints {list(self.abandoned)}" if self.abandoned else ""
        return f"{self.at}: {what}{gone}"


def utc_now() -> str:
    return datetime.now(tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class RestoreLog:
    def __init__(self, fileio: FileIO, job_root: str, *, keep: int = KEEP) -> None:
        self.fileio = fileio
        self.root = join_uri(job_root, RESTORES_DIR)
        self.keep = keep

    def _names(self) -> list[str]:
        return sorted(fi.uri.rsplit("/", 1)[-1] for fi in self.fileio.list(self.root) if fi.uri.endswith(".json"))

    def record(self, event: RestoreEvent) -> None:
        """Record ``event``; never raises (the history is a view)."""
        try:
            names = self._names()
            name = restore_event_name(event.at, len(names))
            self.fileio.write_bytes(join_uri(self.root, name),
                                    (json.dumps(event.to_dict(), indent=1, sort_keys=True) + "\n").encode())
            for old in names[: max(0, len(names) + 1 - self.keep)]:
                self.fileio.delete(join_uri(self.root, old))
        except (EpochalError, OSError, ValueError) as e:
            log.warning("could not record %s: %s", event.describe(), e)

    def list(self) -> list[RestoreEvent]:
        """Recorded restores and rewinds, newest first (unreadable records are skipped)."""
        out = []
        for name in reversed(self._names()):
            try:
                out.append(RestoreEvent.from_dict(json.loads(self.fileio.read_bytes(join_uri(self.root, name)))))
            except (EpochalError, ValueError, KeyError, TypeError):
                continue
        return out
