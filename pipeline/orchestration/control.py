"""Durable orchestration state on the checkpoint store (next to the job's checkpoints).

Layout under ``<checkpoint root>/<job>/orchestration/``::

    control.json                      JobControl: stopped-with-savepoint, parallelism, rewind high-water mark
    savepoints/<savepoint id>.json    savepoints taken through Airflow (also those with custom targets)

``control.json`` is a small document written whole (an atomic PUT / rename). Only the savepoint and
restore DAGs and the epoch DAG's ``process`` task write it, and the DAGs never run those concurrently.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

from pipeline.exceptions import ObjectNotFoundError
from pipeline.fileio import FileIO, join_uri
from pipeline.layout import CONTROL_FILE, SAVEPOINTS_DIR, JobLayout, control_savepoint_name

__all__ = ["JobControl", "ControlStore", "utc_now_iso"]


def utc_now_iso() -> str:
    return datetime.now(tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass(frozen=True, slots=True)
class JobControl:
    """Operator-set state of a job that Airflow runs honour."""

    stopped: bool = False                 # stop-with-savepoint: epoch runs are skipped until a restore
    stopped_savepoint: str | None = None  # the savepoint the job was stopped with
    parallelism: int | None = None        # set by a restore with another parallelism; None = config
    reprocess_until: int | None = None    # rewind high-water mark: epoch the job had reached before a rewind
    restored_from: str | None = None
    updated_at: str = ""
    updated_by: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> JobControl:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}  # type: ignore[attr-defined]
        return cls(**known)


class ControlStore:
    """Reads and writes the orchestration documents of one job."""

    def __init__(self, fileio: FileIO, checkpoint_root: str, job: str) -> None:
        self.fileio = fileio
        self.job = job
        self.root = JobLayout.of(checkpoint_root, job).orchestration()

    # -- control ------------------------------------------------------------------------------------
    @property
    def control_uri(self) -> str:
        return join_uri(self.root, CONTROL_FILE)

    def control(self) -> JobControl:
        try:
            return JobControl.from_dict(json.loads(self.fileio.read_bytes(self.control_uri)))
        except ObjectNotFoundError:
            return JobControl()

    def update_control(self, by: str, **changes: Any) -> JobControl:
        new = replace(self.control(), **changes, updated_at=utc_now_iso(), updated_by=by)
        self.fileio.write_bytes(self.control_uri, (json.dumps(new.to_dict(), indent=1, sort_keys=True) + "\n").encode())
        return new

    # -- savepoints taken through Airflow -----------------------------------------------------------
    def record_savepoint(self, savepoint_id: int, location: str, *, by: str, stop: bool) -> None:
        doc = {"savepoint_id": savepoint_id, "location": location, "taken_by": by, "stop": stop,
               "created_at": utc_now_iso()}
        self.fileio.write_bytes(join_uri(self.root, SAVEPOINTS_DIR, control_savepoint_name(savepoint_id)),
                                (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())

    def savepoint_locations(self) -> list[str]:
        """Locations of savepoints recorded by :meth:`record_savepoint` (oldest first)."""
        out = []
        for fi in self.fileio.list(join_uri(self.root, SAVEPOINTS_DIR)):
            if not fi.uri.endswith(".json"):
                continue
            try:
                out.append(str(json.loads(self.fileio.read_bytes(fi.uri))["location"]))
            except (ObjectNotFoundError, ValueError, KeyError):
                continue
        return out
