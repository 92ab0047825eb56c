"""OpenFormatTable: a :class:`CommittedTable` that also commits every checkpoint into an open table format.

Protocol of ``commit(entry)`` for checkpoint ``n`` with parent ``p`` (idempotent, re-run by recoverAndCommit)::

    Step 1  Epochal's own commit log entry (``_commits/``): create-only, SUCCESS or DUPLICATE.
    Step 2  cur = the checkpoint id the table's *current* snapshot/version carries (its own transaction
            marker: an Iceberg snapshot summary property / a Delta commitInfo + ``txn`` app version).
            cur == n                      -> DUPLICATE (the table already has n: never commit twice)
    Step 3  n committed earlier, but not current (restore of checkpoint n after a rewind):
                                          -> make that snapshot/version current again (rollback / restore)
    Step 4  cur != p (a rewind: n re-processes epochs after p): make p's snapshot/version current
            (rollback / restore), or an empty table when p is None, so re-processed output replaces the old.
    Step 5  commit n's staged files (append: register them; upsert: the format's upsert) with the markers.

The markers are ``epochal.job``, ``epochal.checkpoint-id``, ``epochal.parent-id`` (and ``epochal.empty`` for a
reset to the empty table). History stays in the table: rewound snapshots/versions remain readable by time travel.
"""
from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.checkpoint.ack import AckResult
from pipeline.exceptions import IncompatibleSinkSchemaError, SinkError
from pipeline.faults import fault_point
from pipeline.sink.deletes import strip
from pipeline.sink.table import CommitEntry, CommittedTable
from pipeline.storage_retry import is_transient_table_error, one_line, with_retries

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import PipelineConfig
    from pipeline.fileio import FileIO

__all__ = ["OpenFormatTable", "MARK_JOB", "MARK_CHECKPOINT", "MARK_PARENT", "MARK_EMPTY", "check_schema"]

log = logging.getLogger(__name__)

MARK_JOB = "epochal.job"
MARK_CHECKPOINT = "epochal.checkpoint-id"
MARK_PARENT = "epochal.parent-id"
MARK_EMPTY = "epochal.empty"


def _norm_type(t: pa.DataType) -> str:
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_timestamp(t):
        return f"timestamp[{'tz' if t.tz else 'ntz'}]"
    return str(t)


def check_schema(what: str, existing: pa.Schema, wanted: pa.Schema) -> list[pa.Field]:
    """Compatible iff every existing column is in ``wanted`` with the same type; returns the added columns
    (must be nullable). Raises :class:`IncompatibleSinkSchemaError` naming the table and the columns."""
    problems = []
    for f in existing:
        if f.name not in wanted.names:
            problems.append(f"column {f.name!r} ({_norm_type(f.type)}) is missing from the job's output")
        elif _norm_type(wanted.field(f.name).type) != _norm_type(f.type):
            problems.append(f"column {f.name!r} changes type {_norm_type(f.type)} -> "
                            f"{_norm_type(wanted.field(f.name).type)}")
    added = [f for f in wanted if f.name not in existing.names]
    for f in added:
        if not f.nullable:
            problems.append(f"added column {f.name!r} is not nullable")
    if problems:
        raise IncompatibleSinkSchemaError(
            f"{what}: the job's sink schema is incompatible with the existing table: {'; '.join(problems)} "
            "(only added nullable columns are compatible; write to a new table or migrate it)")
    return added


class OpenFormatTable(CommittedTable):
    """Base of :class:`~pipeline.sink.iceberg.IcebergTable` and :class:`~pipeline.sink.delta.DeltaLakeTable`."""

    format_name = "open"

    def __init__(self, fileio: FileIO, config: PipelineConfig, job: str, table: str, *, mode: str = "append",
                 key: Sequence[str] = (), partition_by: Sequence[str] = ()) -> None:
        super().__init__(fileio, config.sink_uri, job, table)
        self.config = config
        self.mode = mode
        self.key = tuple(key)
        self.partition_by = tuple(partition_by)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.table_uri})"

    @property
    def what(self) -> str:
        return f"{self.format_name} table {self.table} of job {self.job!r} ({self.table_uri})"

    def markers(self, checkpoint_id: int | None, parent_id: int | None = None) -> dict[str, str]:
        out = {MARK_JOB: self.job}
        if checkpoint_id is None:
            out[MARK_EMPTY] = "true"
        else:
            out[MARK_CHECKPOINT] = str(checkpoint_id)
            if parent_id is not None:
                out[MARK_PARENT] = str(parent_id)
        return out

    # -- format operations (subclasses) ------------------------------------------------------------
    @abstractmethod
    def exists(self) -> bool: ...

    @abstractmethod
    def create(self, schema: pa.Schema) -> None: ...

    @abstractmethod
    def table_schema(self) -> pa.Schema: ...

    @abstractmethod
    def add_columns(self, fields: list[pa.Field]) -> None: ...

    @abstractmethod
    def current_checkpoint(self) -> int | None:
        """The checkpoint id the current snapshot/version carries (None: empty or no marker yet)."""

    @abstractmethod
    def has_data(self) -> bool: ...

    @abstractmethod
    def find(self, checkpoint_id: int) -> Any:
        """The newest snapshot/version that committed ``checkpoint_id`` (None if never)."""

    @abstractmethod
    def make_current(self, ref: Any, checkpoint_id: int) -> None: ...

    @abstractmethod
    def reset_empty(self) -> None: ...

    @abstractmethod
    def append_files(self, entry: CommitEntry, schema: pa.Schema) -> None: ...

    @abstractmethod
    def upsert_files(self, entry: CommitEntry, schema: pa.Schema) -> None: ...

    @abstractmethod
    def current_files(self) -> list[str]:
        """URIs of the data files of the current snapshot/version (exactly the committed rows)."""

    @abstractmethod
    def version_id(self) -> str:
        """The current snapshot id / table version (for logs and Airflow asset events)."""

    # -- schema ------------------------------------------------------------------------------------
    def prepare(self, schema: pa.Schema) -> None:
        """Called when the job's plan is built, before any data: create the table with the job's schema,
        or check the job's schema against the existing table (added nullable columns are added)."""
        if not self.exists():
            self.create(schema)
            log.info("%s: created", self.what)
            return
        have = self.table_partition_columns()
        if have != self.partition_by:
            raise IncompatibleSinkSchemaError(
                f"{self.what}: the table is partitioned by {list(have)}, the job's sink by {list(self.partition_by)} "
                "(write to a new table or migrate it)")
        added = check_schema(self.what, self.table_schema(), schema)
        if added:
            self.add_columns(added)
            log.info("%s: added nullable column(s) %s", self.what, [f.name for f in added])

    def table_partition_columns(self) -> tuple[str, ...]:
        """The existing table's partition columns (identity partitions), in order."""
        return ()

    def _file_schema(self, entry: CommitEntry, *, raw: bool = False) -> pa.Schema | None:
        """The staged files' columns (``raw``: with a deleting sink's tombstone flag, which the table lacks)."""
        if not entry.files:
            return None
        with self.fileio.open_input(entry.files[0].uri) as f:
            return pq.read_schema(f) if raw else strip(pq.read_schema(f))

    def read_staged(self, entry: CommitEntry, schema: pa.Schema) -> pa.Table:
        parts = []
        for f in entry.files:
            with self.fileio.open_input(f.uri) as fh:
                parts.append(pq.read_table(fh))
        if not parts:
            return schema.empty_table()
        return pa.concat_tables(parts, promote_options="default")

    # -- commit ------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Drop any cached view of the table (before a commit is retried after a transient failure)."""

    def commit(self, entry: CommitEntry) -> AckResult:
        # Step 1: Epochal's own lineage index
        logged = super().commit(entry)
        fault_point("after_commit_log_before_table_commit")
        # Steps 2-5 do their own S3 requests (delta-rs, pyiceberg), outside Epochal's retried FileIO. They are
        # idempotent (step 2 sees what already landed), so a transient S3 failure re-runs them, logged, within
        # PIPELINE_S3_RETRY_SECONDS, like Epochal's own storage calls (issue 34, item 2)
        what = f"{self.what}: commit of checkpoint {entry.checkpoint_id}"
        try:
            return with_retries(lambda: self._commit_table(entry, logged), what,
                                transient=is_transient_table_error, before_retry=self.refresh)
        except Exception as e:
            if not is_transient_table_error(e):
                raise
            first = one_line(e)
            raise SinkError(f"{what} failed: S3 kept failing within PIPELINE_S3_RETRY_SECONDS "
                            f"({type(e).__name__}: {first}); the checkpoint is complete and its commit log entry "
                            "written, so the next run or restore commits it to the table (recoverAndCommit)") from e

    def _commit_table(self, entry: CommitEntry, logged: AckResult) -> AckResult:
        """Steps 2-5 of :meth:`commit` (idempotent)."""
        n, p = entry.checkpoint_id, entry.parent_id
        file_schema = self._file_schema(entry)
        if not self.exists():
            if file_schema is None:
                return logged  # nothing to show yet; the table is created with the first rows or at plan time
            self.create(file_schema)
        # Step 2: does the table already have n (its own transaction marker)?
        cur = self.current_checkpoint()
        if cur == n:
            return logged  # the table has n: SUCCESS only if the lineage entry was missing and is now written
        # Step 3: n was committed before but is not current (restoring checkpoint n): make it current
        ref = self.find(n)
        if ref is not None:
            self.make_current(ref, n)
            log.info("%s: made checkpoint %d current again (%s)", self.what, n, self.version_id())
            return logged
        # Step 4: rewind: the table must be at the parent's commit
        if cur != p:
            pref = self.find(p) if p is not None else None
            if pref is not None and p is not None:
                self.make_current(pref, p)
                log.info("%s: rewound to checkpoint %s before committing %d", self.what, p, n)
            elif self.has_data():
                if p is not None and cur is not None:
                    raise SinkError(
                        f"{self.what}: cannot commit checkpoint {n}: its parent checkpoint {p} is not in the table's "
                        f"history (current: checkpoint {cur}); were its snapshots expired, or was the sink's format "
                        "changed for an existing job?")
                self.reset_empty()
                log.info("%s: reset to empty before committing %d (parent %s)", self.what, n, p)
        # Step 5: commit n's files with the markers
        schema = self.table_schema()
        if entry.mode == "upsert":
            self.upsert_files(entry, schema)
        else:
            self.append_files(entry, schema)
        log.info("%s: committed checkpoint %d (%d files) as %s", self.what, n, len(entry.files), self.version_id())
        return AckResult.SUCCESS

    def open_read(self) -> pa.Table:
        """The committed rows read through the format's own reader (tests, small tables)."""
        raise NotImplementedError
