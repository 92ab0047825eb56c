"""Apache Iceberg sink tables (pyiceberg) with location ``<sink root>/<job>/<table>/``.

Catalog (``PIPELINE_ICEBERG_CATALOG``):

* empty (default): an **embedded SQL catalog on SQLite** (no server). Its file is
  ``PIPELINE_ICEBERG_CATALOG_URI`` (a SQLAlchemy URI) or by default ``<sink root>/_iceberg_catalog.db`` for a
  ``file://`` sink root. SQLite cannot live on S3 (it needs POSIX locks), so for an ``s3://`` sink root the
  default file is ``$EPOCHAL_HOME/iceberg_catalog.db`` on the local disk: fine for one machine (demo, tests),
  not for a fleet; there use a catalog service:
* a catalog name: ``pyiceberg.catalog.load_catalog(name)`` with pyiceberg's own configuration
  (``~/.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__<NAME>__TYPE=rest|glue|hive|sql`` and friends).

Namespace = job name, table = sink table name. Operations:

* append: the staged files are registered with ``add_files`` (no data through the driver, nothing rewritten);
* upsert: in one transaction, ``delete`` the rows whose key is in this checkpoint's staged rows
  (copy-on-write rewrite of the data files holding such keys) and ``add_files`` the staged files (a deleting
  sink, :mod:`pipeline.sink.deletes`: its tombstones' keys are deleted too and the live rows appended); keys are
  compared null-safely (an aggregate's NULL group is one key: ``IS NULL`` matches it, :func:`key_match_filter`);
* every snapshot carries the summary properties ``epochal.job``, ``epochal.checkpoint-id``,
  ``epochal.parent-id`` (Flink's Iceberg committer keeps its max committed checkpoint id the same way);
* rewind / restore: ``manage_snapshots().set_current_snapshot`` to the checkpoint's snapshot.
"""
from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from pipeline import settings
from pipeline.exceptions import ConfigError, SinkError
from pipeline.sink.deletes import DELETED, live_rows
from pipeline.sink.open_table import MARK_CHECKPOINT, MARK_EMPTY, MARK_JOB, OpenFormatTable
from pipeline.sink.table import CommitEntry

if TYPE_CHECKING:  # pragma: no cover
    from pyiceberg.catalog import Catalog
    from pyiceberg.expressions import BooleanExpression
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

    from pipeline.config import PipelineConfig
    from pipeline.fileio import FileIO

__all__ = ["IcebergTable", "iceberg_catalog", "default_catalog_uri", "key_match_filter", "iceberg_commits_counted",
           "s3_properties"]

#: the ``py-io-impl`` catalog property naming pyiceberg's file IO on Epochal's counted S3 client
COUNTED_IO_IMPL = "pipeline.sink.iceberg_io.CountedPyArrowFileIO"


def iceberg_commits_counted(config: PipelineConfig) -> bool:
    """Whether an Iceberg sink's commits go through Epochal's counted S3 client (:mod:`pipeline.sink.iceberg_io`):
    the embedded catalog on an ``s3://`` sink root, unless ``EPOCHAL_ICEBERG_COUNTED_IO=0``."""
    return (not config.iceberg_catalog and config.sink_uri.lower().startswith("s3://")
            and settings.value("EPOCHAL_ICEBERG_COUNTED_IO") != "0")

_CATALOGS: dict[tuple, Any] = {}
_LOCK = threading.Lock()


def default_catalog_uri(sink_uri: str) -> str:
    """The embedded SQLite catalog's SQLAlchemy URI for a sink root (see the module docstring)."""
    if sink_uri.startswith("file://"):
        path = Path(sink_uri[len("file://"):]) / "_iceberg_catalog.db"
    else:
        path = Path(settings.value("EPOCHAL_HOME") or Path.cwd() / ".epochal").resolve() / "iceberg_catalog.db"
    return f"sqlite:///{path}"


def s3_properties() -> dict[str, str]:
    """pyiceberg's S3 properties from the AWS_* settings (endpoint, credentials, region), unset ones left out."""
    out = {}
    for env, prop in (("AWS_ENDPOINT_URL", "s3.endpoint"), ("AWS_ACCESS_KEY_ID", "s3.access-key-id"),
                      ("AWS_SECRET_ACCESS_KEY", "s3.secret-access-key"), ("AWS_SESSION_TOKEN", "s3.session-token")):
        v = settings.raw(env)
        if v:
            out[prop] = v
    region = settings.raw("AWS_REGION") or settings.raw("AWS_DEFAULT_REGION")
    if region:
        out["s3.region"] = region
    return out


def iceberg_catalog(config: PipelineConfig) -> Catalog:
    """The configured catalog (cached per process)."""
    name = config.iceberg_catalog
    uri = config.iceberg_catalog_uri or default_catalog_uri(config.sink_uri)
    counted = iceberg_commits_counted(config)
    key = (name, uri, tuple(sorted(s3_properties().items())), counted)
    with _LOCK:
        cat = _CATALOGS.get(key)
        if cat is None:
            if name:
                from pyiceberg.catalog import load_catalog
                try:
                    cat = load_catalog(name)
                except Exception as e:  # pyiceberg raises ValueError & co for bad configs
                    raise ConfigError(f"PIPELINE_ICEBERG_CATALOG={name!r}: cannot load the catalog with pyiceberg's "
                                      f"configuration (~/.pyiceberg.yaml or PYICEBERG_CATALOG__*): {e}") from e
            else:
                from pyiceberg.catalog.sql import SqlCatalog
                if uri.startswith("sqlite:///"):
                    Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
                io = {"py-io-impl": COUNTED_IO_IMPL} if counted else {}  # commits counted (iceberg_io)
                cat = SqlCatalog("epochal", uri=uri, warehouse=config.sink_uri, **s3_properties(), **io)
            _CATALOGS[key] = cat
        return cat


def key_match_filter(keys: pa.Table, columns: list[str]) -> BooleanExpression:
    """The Iceberg row filter selecting the rows whose ``columns`` equal one of ``keys``' rows, **null-safely**
    (``IS NOT DISTINCT FROM``): a null key value matches ``IS NULL``, so the NULL group of an aggregate is
    replaced like any other key. (pyiceberg's ``create_match_filter`` cannot take a null literal.)"""
    from pyiceberg import expressions
    ex: Any = expressions  # pyiceberg's expression constructors are not typed for positional use
    AlwaysFalse, And, EqualTo, In, IsNull, Or = ex.AlwaysFalse, ex.And, ex.EqualTo, ex.In, ex.IsNull, ex.Or
    distinct = keys.select(columns).group_by(columns, use_threads=False).aggregate([])
    if len(columns) == 1:
        values = distinct[columns[0]].to_pylist()
        present = [v for v in values if v is not None]
        parts = ([In(columns[0], present)] if present else []) + ([IsNull(columns[0])] if None in values else [])
        return Or(*parts) if len(parts) > 1 else (parts[0] if parts else AlwaysFalse())
    rows = [And(*[IsNull(c) if r[c] is None else EqualTo(c, r[c]) for c in columns])
            for r in distinct.to_pylist()]
    return Or(*rows) if len(rows) > 1 else (rows[0] if rows else AlwaysFalse())


class IcebergTable(OpenFormatTable):
    format_name = "Iceberg"

    def __init__(self, fileio: FileIO, config: PipelineConfig, job: str, table: str, *, mode: str = "append",
                 key: Sequence[str] = (), partition_by: Sequence[str] = ()) -> None:
        super().__init__(fileio, config, job, table, mode=mode, key=key, partition_by=partition_by)
        self.identifier = (job, table)

    @property
    def catalog(self) -> Catalog:
        return iceberg_catalog(self.config)

    def _tbl(self) -> Table:
        return self.catalog.load_table(self.identifier)

    # -- OpenFormatTable ---------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.catalog.table_exists(self.identifier)

    def create(self, schema: pa.Schema) -> None:
        self.catalog.create_namespace_if_not_exists(self.job)
        from pyiceberg.exceptions import TableAlreadyExistsError
        try:
            tbl = self.catalog.create_table(self.identifier, schema=schema, location=self.table_uri,
                                            properties={MARK_JOB: self.job})
        except TableAlreadyExistsError:
            return
        if self.partition_by:  # identity partitions: each staged file holds one value per partition column
            with tbl.update_spec() as upd:
                for c in self.partition_by:
                    upd.add_identity(c)

    def table_partition_columns(self) -> tuple[str, ...]:
        tbl = self._tbl()
        schema = tbl.schema()
        names = [schema.find_column_name(f.source_id) for f in tbl.spec().fields]
        if None in names:
            raise SinkError(f"{self.what}: a partition field of the table's spec has no source column in its schema")
        return tuple(n for n in names if n is not None)

    def table_schema(self) -> pa.Schema:
        return self._tbl().schema().as_arrow()

    def add_columns(self, fields: list[pa.Field]) -> None:
        with self._tbl().update_schema() as upd:
            upd.union_by_name(pa.schema(fields))

    def _marked(self, snap: Snapshot) -> dict[str, str] | None:
        props = snap.summary.additional_properties if snap.summary is not None else {}
        return props if props.get(MARK_JOB) == self.job else None

    def current_checkpoint(self) -> int | None:
        tbl = self._tbl()
        snap = tbl.current_snapshot()
        while snap is not None:
            props = self._marked(snap)
            if props is not None:
                if props.get(MARK_EMPTY):
                    return None
                if props.get(MARK_CHECKPOINT) is not None:
                    return int(props[MARK_CHECKPOINT])
            snap = tbl.snapshot_by_id(snap.parent_snapshot_id) if snap.parent_snapshot_id is not None else None
        return None

    def has_data(self) -> bool:
        snap = self._tbl().current_snapshot()
        if snap is None or snap.summary is None:
            return False
        return int(snap.summary.get("total-records") or 0) > 0

    def find(self, checkpoint_id: int) -> int | None:
        best = None
        for s in self._tbl().snapshots():
            props = self._marked(s)
            if props is not None and props.get(MARK_CHECKPOINT) == str(checkpoint_id):
                # a format-v1 table has no sequence numbers: 0 (the Iceberg spec's value for v1 snapshots)
                if best is None or (s.sequence_number or 0) > (best.sequence_number or 0):
                    best = s
        return None if best is None else best.snapshot_id

    def make_current(self, ref: int, checkpoint_id: int) -> None:
        self._tbl().manage_snapshots().set_current_snapshot(ref).commit()

    def reset_empty(self) -> None:
        from pyiceberg.expressions import AlwaysTrue
        self._tbl().delete(AlwaysTrue(), snapshot_properties=self.markers(None))

    def _uris(self, entry: CommitEntry) -> list[str]:
        return [f.uri for f in entry.files]

    def append_files(self, entry: CommitEntry, schema: pa.Schema) -> None:
        props = self.markers(entry.checkpoint_id, entry.parent_id)
        tbl = self._tbl()
        if entry.files:
            tbl.add_files(self._uris(entry), snapshot_properties=props, check_duplicate_files=False)
        else:  # an empty snapshot still records that the table has checkpoint n
            tbl.append(schema.empty_table(), snapshot_properties=props)  # pyiceberg writes a snapshot of no files

    def upsert_files(self, entry: CommitEntry, schema: pa.Schema) -> None:
        props = self.markers(entry.checkpoint_id, entry.parent_id)
        tbl = self._tbl()
        if not entry.files:
            self.append_files(entry, schema)
            return
        deleting = DELETED in (self._file_schema(entry, raw=True) or schema).names  # tombstones (pipeline.sink.deletes)
        staged = self.read_staged(entry, schema) if deleting else None
        keys = (staged.select(list(entry.key)) if staged is not None
                else pa.concat_tables([self._read_columns(f.uri, list(entry.key)) for f in entry.files]))
        with tbl.transaction() as tx:
            if keys.num_rows and tbl.current_snapshot() is not None:
                with warnings.catch_warnings():   # a tombstone of a key the table does not hold is no news
                    warnings.filterwarnings("ignore", "Delete operation did not match any records")
                    tx.delete(key_match_filter(keys, list(entry.key)), snapshot_properties=props)
            if staged is not None:   # the staged files carry the flag: append the live rows (written by pyiceberg)
                live = live_rows(staged).select(schema.names).cast(schema)
                if live.num_rows:
                    tx.append(live, snapshot_properties=props)
                elif not keys.num_rows or tbl.current_snapshot() is None:
                    tx.append(schema.empty_table(), snapshot_properties=props)
            else:
                tx.add_files(self._uris(entry), snapshot_properties=props, check_duplicate_files=False)

    def _read_columns(self, uri: str, columns: list[str]) -> pa.Table:
        import pyarrow.parquet as pq
        with self.fileio.open_input(uri) as f:
            return pq.read_table(f, columns=columns)

    def current_files(self) -> list[str]:
        tasks = list(self._tbl().scan().plan_files())
        if any(t.delete_files for t in tasks):
            raise SinkError(f"{self.what}: the current snapshot has delete files (written by another engine); "
                            "read it with an Iceberg engine")
        return [t.file.file_path for t in tasks]

    def version_id(self) -> str:
        snap = self._tbl().current_snapshot()
        return f"snapshot {snap.snapshot_id if snap else None}"

    def snapshot_id(self) -> int | None:
        snap = self._tbl().current_snapshot()
        return snap.snapshot_id if snap else None

    def metadata_location(self) -> str:
        return self._tbl().metadata_location

    def open_read(self) -> pa.Table:
        return self._tbl().scan().to_arrow()

