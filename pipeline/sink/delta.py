"""Delta Lake sink tables (delta-rs, the ``deltalake`` package) at ``<sink root>/<job>/<table>/``.

* The table root is the sink table's folder: ``_delta_log/`` sits next to ``data/txn-<n>/`` (the staged
  files) and Epochal's ``_commits/`` index.
* append: the staged files are **registered** as ``add`` actions (``create_write_transaction``): the data never
  passes through the driver and is not rewritten.
* upsert: ``MERGE`` on the key (``when_matched_update_all`` / ``when_not_matched_insert_all``) with the staged
  rows (the changed keys of this checkpoint) as the source; delta-rs rewrites the target files that hold a
  matched key (copy-on-write). A deleting sink's tombstones (:mod:`pipeline.sink.deletes`) are
  ``when_matched_delete`` in the same ``MERGE``. Keys match null-safely (``IS NOT DISTINCT FROM``): an aggregate's NULL group is
  one row, updated in place, not inserted again every checkpoint.
* Every commit carries ``txn`` (app id ``epochal:<job>:<table>``, version = checkpoint id, as Spark's Delta
  sink does) and commitInfo markers ``epochal.checkpoint-id`` / ``epochal.parent-id``; rewinds are Delta
  ``RESTORE`` commits marked with the checkpoint id they restore.
* S3: delta-rs 1.x commits with S3 conditional writes (``If-None-Match`` on ``_delta_log/<v>.json``), so no
  lock service (DynamoDB) and no ``AWS_S3_ALLOW_UNSAFE_RENAME``; it works on moto.
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline import settings
from pipeline.exceptions import SinkError
from pipeline.sink.deletes import DELETED
from pipeline.sink.open_table import MARK_CHECKPOINT, MARK_EMPTY, MARK_JOB, OpenFormatTable
from pipeline.sink.partitions import partition_values
from pipeline.sink.table import CommitEntry
from pipeline.storage_retry import is_transient_table_error

if TYPE_CHECKING:  # pragma: no cover
    from deltalake import CommitProperties, DeltaTable
    from deltalake.transaction import RemoveAction

    from pipeline.config import PipelineConfig
    from pipeline.fileio import FileIO

__all__ = ["DeltaLakeTable", "delta_storage_options"]


def delta_storage_options(uri: str) -> dict[str, str]:
    """delta-rs (object_store) options from the standard ``AWS_*`` environment."""
    if not uri.startswith("s3://"):
        return {}
    out = {}
    for k in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        v = settings.raw(k)
        if v:
            out[k] = v
    region = settings.raw("AWS_REGION") or settings.raw("AWS_DEFAULT_REGION")
    if region:
        out["AWS_REGION"] = region
    if out.get("AWS_ENDPOINT_URL", "").startswith("http://"):
        out["AWS_ALLOW_HTTP"] = "true"
    return out


class DeltaLakeTable(OpenFormatTable):
    format_name = "Delta"

    def __init__(self, fileio: FileIO, config: PipelineConfig, job: str, table: str, *, mode: str = "append",
                 key: Sequence[str] = (), partition_by: Sequence[str] = ()) -> None:
        super().__init__(fileio, config, job, table, mode=mode, key=key, partition_by=partition_by)
        self.storage_options = delta_storage_options(self.table_uri)
        self.location = self.table_uri if self.table_uri.startswith("s3://") else self.table_uri[len("file://"):]
        self.app_id = f"epochal:{job}:{table}"
        self._latest: Any = None  # the loaded DeltaTable (see _dt)
        # (table version, its current checkpoint): the answer of current_checkpoint at that version, kept so that a
        # warm process's next commit does not read the log's history again (set after this object's own commits)
        self._current: tuple[int, int | None] | None = None

    def _dt(self, version: int | None = None) -> DeltaTable:
        """The table at ``version``, or its latest version. The latest is loaded once per object and brought up
        to date incrementally (delta-rs reads only the commits after the loaded one): a commit touches the table
        several times and each full load lists and reads the log again (measured on moto S3: 548 ms per
        append commit with a fresh load per call)."""
        from deltalake import DeltaTable
        if version is not None:
            return DeltaTable(self.location, version=version, storage_options=self.storage_options)
        if self._latest is not None:
            try:
                self._latest.update_incremental()
                return self._latest
            except Exception as e:  # noqa: BLE001 - the log no longer continues the loaded snapshot: load it afresh
                # (the object lives as long as the runner: its newest log entries may have been removed since, e.g. a
                # commit that never completed; delta-rs refuses to go back: "newest version ... is older than").
                # A transient storage error is the caller's to retry (with_retries), as before.
                if is_transient_table_error(e):
                    raise
                self._latest, self._current = None, None
        self._latest = DeltaTable(self.location, storage_options=self.storage_options)
        return self._latest

    def _props(self, checkpoint_id: int | None, parent_id: int | None = None, *, txn: bool = True) -> CommitProperties:
        from deltalake import CommitProperties, Transaction
        apps = [Transaction(self.app_id, checkpoint_id)] if txn and checkpoint_id is not None else None
        return CommitProperties(custom_metadata=self.markers(checkpoint_id, parent_id), app_transactions=apps)

    # -- OpenFormatTable ---------------------------------------------------------------------------
    def refresh(self) -> None:
        self._latest = None  # a failed update_incremental/commit may have left it half-updated: load it again
        self._current = None

    def exists(self) -> bool:
        from deltalake import DeltaTable
        if self._latest is not None:
            return True
        return DeltaTable.is_deltatable(self.location, storage_options=self.storage_options)

    def create(self, schema: pa.Schema) -> None:
        from deltalake import DeltaTable
        try:
            DeltaTable.create(self.location, schema, mode="ignore", storage_options=self.storage_options,
                              partition_by=list(self.partition_by) or None,
                              name=self.table, description=f"Epochal sink {self.table} of job {self.job}")
        except Exception as e:  # delta-rs raises plain Python errors
            raise SinkError(f"{self.what}: cannot create the table: {e}") from e

    def table_schema(self) -> pa.Schema:
        return pa.schema(self._dt().schema().to_arrow())

    def table_partition_columns(self) -> tuple[str, ...]:
        return tuple(self._dt().metadata().partition_columns)

    def add_columns(self, fields: list[pa.Field]) -> None:
        from deltalake import Field, Schema
        dfields = list(Schema.from_arrow(pa.schema(fields)).fields)
        self._dt().alter.add_columns([Field(f.name, f.type, nullable=True) for f in dfields])

    def _history(self, limit: int | None = None) -> list[dict[str, Any]]:
        return self._dt().history(limit)  # newest first

    def current_checkpoint(self) -> int | None:
        """The checkpoint of the newest commit this job made (other writers' commits are looked through). Known
        without reading the history when the table is still at the version this object last answered for or
        committed (:attr:`_current`)."""
        before = self._dt().version()
        if self._current is not None and self._current[0] == before:
            return self._current[1]
        cur = self._current_from_history()
        if self._dt().version() == before:
            self._current = (before, cur)
        return cur

    def _current_from_history(self) -> int | None:
        # the newest commit is almost always Epochal's own: read a few commits first, the whole log only if
        # other writers (OPTIMIZE, VACUUM, ...) committed since (requests stay O(1) as the history grows)
        for limit in (4, None):
            hist = self._history(limit)
            for h in hist:
                if h.get(MARK_JOB) != self.job:
                    continue  # a commit by someone else: look further back
                if h.get(MARK_EMPTY):
                    return None
                if h.get(MARK_CHECKPOINT) is not None:
                    return int(h[MARK_CHECKPOINT])
            if limit is not None and len(hist) < limit:
                break  # that was the whole history
        return None

    def has_data(self) -> bool:
        return bool(self._dt().file_uris())

    def find(self, checkpoint_id: int) -> int | None:
        tv = self.transaction_version()
        if tv is None or tv < checkpoint_id:
            return None  # the txn version is the newest checkpoint ever committed: n never was (no log scan)
        for h in self._history():
            if (h.get(MARK_JOB) == self.job and h.get(MARK_CHECKPOINT) == str(checkpoint_id)
                    and h.get("operation") != "RESTORE"):
                return int(h["version"])
        return None

    def make_current(self, ref: int, checkpoint_id: int) -> None:
        self._current = None
        self._dt().restore(ref, commit_properties=self._props(checkpoint_id, txn=False))

    def reset_empty(self) -> None:
        self._current = None
        self._dt().restore(0, commit_properties=self._props(None))

    def append_files(self, entry: CommitEntry, schema: pa.Schema) -> None:
        from deltalake.transaction import AddAction
        now = int(time.time() * 1000)
        root = self.table_uri.rstrip("/") + "/"
        actions: list[AddAction | RemoveAction] = []
        for f in entry.files:
            if not f.uri.startswith(root):
                raise SinkError(f"{self.what}: staged file {f.uri} is outside the table root {root}")
            actions.append(AddAction(f.uri[len(root):], f.bytes, partition_values(f.uri, self.partition_by), now, True,
                                     json.dumps({"numRecords": f.rows})))
        self._dt().create_write_transaction(actions, "append", schema,
                                           commit_properties=self._props(entry.checkpoint_id, entry.parent_id))
        self._committed(entry.checkpoint_id)

    def _committed(self, checkpoint_id: int) -> None:
        """After this object's own commit of ``checkpoint_id``: the table's version now has it current (a commit
        by another writer in between is one current_checkpoint looks through anyway)."""
        self._current = None
        self._current = (self._dt().version(), checkpoint_id)

    def upsert_files(self, entry: CommitEntry, schema: pa.Schema) -> None:
        src = self.read_staged(entry, schema)
        if src.num_rows == 0:  # nothing changed: commit only the markers and the txn
            self._dt().create_write_transaction([], "append", schema,
                                               commit_properties=self._props(entry.checkpoint_id, entry.parent_id))
            self._committed(entry.checkpoint_id)
            return
        pred = " AND ".join(f"t.`{k}` IS NOT DISTINCT FROM s.`{k}`" for k in entry.key)
        merge = self._dt().merge(src, pred, source_alias="s", target_alias="t",
                                 commit_properties=self._props(entry.checkpoint_id, entry.parent_id))
        if DELETED in src.column_names:   # a deleting sink: a tombstone deletes its key (pipeline.sink.deletes)
            cols = {c: f"s.`{c}`" for c in schema.names}
            merge = (merge.when_matched_delete(f"s.`{DELETED}`")
                     .when_matched_update(cols, f"NOT s.`{DELETED}`")
                     .when_not_matched_insert(cols, f"NOT s.`{DELETED}`"))
        else:
            merge = merge.when_matched_update_all().when_not_matched_insert_all()
        merge.execute()
        self._committed(entry.checkpoint_id)

    def current_files(self) -> list[str]:
        uris = self._dt().file_uris()
        return [u if "://" in u else f"file://{u}" for u in uris]

    def version_id(self) -> str:
        return f"version {self._dt().version()}"

    def transaction_version(self) -> int | None:
        """The Delta ``txn`` version of this sink's app id (the newest checkpoint id ever committed)."""
        return self._dt().transaction_version(self.app_id)

    def open_read(self) -> pa.Table:
        return self._dt().to_pyarrow_table()
