"""Read side: committed sink rows and operator state, written as Parquet through Epochal's FileIO.

``export`` and ``state`` write to any target Epochal's storage layer knows: ``s3://bucket/prefix``,
``file:///abs/dir``, or a plain path, which means a directory on **the driver's** disk (where the command
runs). Spark's own ``DataFrameWriter`` is not used: on a cluster it writes a ``file:`` path on each
executor's disk, so a driver-side directory ends up with nothing but ``_SUCCESS``.

Protocol of one export (:func:`write_parquet`):

1. Resolve the target and choose who writes (:class:`WriteSide`): the executors for ``s3://`` and for local
   targets when the executors run on the driver's machine (``local[...]`` masters); otherwise (a ``file:``
   target on a cluster) the executors hand Arrow batches to the driver, partition by partition
   (``toLocalIterator``), and the driver writes them.
2. Clear the target (the command replaces the directory, like before).
3. Each task writes its partition as one Parquet file named ``part-<partition>-<export>-<attempt>.parquet``
   (attempt-unique: a retried or speculative attempt never overwrites another attempt's file) and returns
   ``(uri, rows, bytes)``: the acknowledgement of the attempt Spark kept.
4. The driver reads back the footer of every acknowledged file through FileIO and checks that its row count
   is the one the task reported and that the total is what the caller expected (committed rows of the table's
   lineage, rows of the state handles). A file the driver cannot see is an error, never a reported row.
5. Files under the target that no kept attempt acknowledged (failed or speculative attempts) are deleted,
   then ``_SUCCESS`` is written last.
"""
from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.checkpoint.handles import StateHandle
from pipeline.exceptions import ConfigError, StorageError
from pipeline.fileio import file_io_for, join_uri
from pipeline.fileio import file_io_for as fio_for
from pipeline.fileio import join_uri as join
from pipeline.layout import EXPORT_DONE_FILE
from pipeline.runtime.spark.dataflow import schema_ddl
from pipeline.runtime.spark.task_requests import counted_in_span
from pipeline.sink.deletes import DELETED
from pipeline.sink.open_table import OpenFormatTable
from pipeline.state.backend import load_chain
from pipeline.state.chain import StateChain

__all__ = ["export_table", "export_state", "files_with_tag_dataframe", "resolve_target", "write_parquet", "write_empty",
           "WriteSide", "WrittenFile", "ExportResult"]

_ACK_DDL = "uri string, rows long, bytes long"
_IPC_DDL = "part int, data binary"


class WriteSide(enum.Enum):
    """Which process writes the Parquet files of an export."""

    EXECUTORS = "executors"  # data never goes through the driver
    DRIVER = "driver"  # a directory on the driver's disk that the executors cannot reach


@dataclass(frozen=True, slots=True)
class WrittenFile:
    uri: str
    rows: int
    bytes: int


@dataclass(frozen=True, slots=True)
class ExportResult:
    target: str
    side: WriteSide
    files: tuple[WrittenFile, ...]

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)


def resolve_target(to: str) -> str:
    """The target as a URI: ``s3://`` and ``file:`` URIs as given, a plain path as a ``file://`` URI of the
    driver's disk (relative to the current directory)."""
    if not to:
        raise ConfigError("export target is empty: give --to DIR, file:///abs/dir or s3://bucket/prefix")
    if "://" in to or to.startswith("file:"):
        file_io_for(to)  # unsupported schemes -> ConfigError before anything is written
        return to.rstrip("/")
    return Path(to).expanduser().resolve().as_uri()


def _master(spark) -> str:
    try:
        return str(spark.conf.get("spark.master"))
    except Exception:  # noqa: BLE001 - a Connect session may not expose it
        return ""


def write_side(spark, target: str) -> WriteSide:
    """Executors write when they can reach the target: always for object stores, for ``file:`` only when
    they run on the driver's machine (``local`` / ``local-cluster`` masters)."""
    if not target.lower().startswith("file:"):
        return WriteSide.EXECUTORS
    return WriteSide.EXECUTORS if _master(spark).startswith("local") else WriteSide.DRIVER


def _part_name(partition: int, token: str, attempt: int) -> str:
    return f"part-{partition:05d}-{token}-a{attempt}.parquet"


def _write_on_executors(df, target: str, token: str) -> list[WrittenFile]:
    def write(batches):
        from pyspark import TaskContext

        ctx = TaskContext.get()
        uri = join(target, _part_name(ctx.partitionId(), token, ctx.taskAttemptId()))
        writer = out = None
        rows = 0
        try:
            for b in batches:
                if writer is None:
                    out = fio_for(uri).open_output(uri)
                    writer = pq.ParquetWriter(out, b.schema)
                writer.write_batch(b)
                rows += b.num_rows
        finally:
            if writer is not None:
                writer.close()
            if out is not None:
                out.close()  # atomic: the file appears under its name only now
        if writer is not None:
            yield pa.RecordBatch.from_pydict({"uri": [uri], "rows": [rows], "bytes": [fio_for(uri).size(uri)]})

    acks = df.mapInArrow(counted_in_span(write), _ACK_DDL).collect()
    return [WrittenFile(r["uri"], int(r["rows"]), int(r["bytes"])) for r in acks]


def _write_on_driver(df, target: str, token: str) -> list[WrittenFile]:
    """Executors serialise Arrow batches (IPC); the driver streams them into one file per partition."""
    def serialise(batches):
        from pyspark import TaskContext
        part = TaskContext.get().partitionId()
        for b in batches:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, b.schema) as w:
                w.write_batch(b)
            yield pa.RecordBatch.from_pydict({"part": [part], "data": [sink.getvalue().to_pybytes()]},
                                             schema=pa.schema([("part", pa.int32()), ("data", pa.binary())]))

    fio = file_io_for(target)
    written: list[WrittenFile] = []
    cur: tuple[int, str, object, object] | None = None  # (part, uri, stream, writer)
    rows = 0

    def finish() -> None:
        nonlocal cur, rows
        if cur is not None:
            _, uri, out, writer = cur
            writer.close()  # type: ignore[attr-defined]
            out.close()  # type: ignore[attr-defined]
            written.append(WrittenFile(uri, rows, fio.size(uri)))
        cur, rows = None, 0

    try:
        for row in df.mapInArrow(counted_in_span(serialise), _IPC_DDL).toLocalIterator():
            batch = pa.ipc.open_stream(row["data"]).read_all()
            if cur is None or cur[0] != row["part"]:
                finish()
                uri = join_uri(target, _part_name(int(row["part"]), token, 0))
                out = fio.open_output(uri)
                cur = (int(row["part"]), uri, out, pq.ParquetWriter(out, batch.schema))
            cur[3].write_table(batch)  # type: ignore[attr-defined]
            rows += batch.num_rows
        finish()
    except BaseException:
        if cur is not None:
            for closer in (cur[3], cur[2]):
                try:
                    closer.close()  # type: ignore[attr-defined]
                except Exception:  # noqa: BLE001
                    pass
        raise
    return written


def _verify(target: str, files: Sequence[WrittenFile]) -> None:
    """Read back the footer of every acknowledged file: it must exist and hold the rows its task reported."""
    fio = file_io_for(target)
    for f in files:
        try:
            with fio.open_input(f.uri) as src:
                n = pq.read_metadata(src).num_rows
        except StorageError as e:
            raise StorageError(f"export to {target}: {f.uri} was reported written ({f.rows} rows) but cannot be "
                               f"read back from the driver ({e}); do the executors share this disk?") from e
        if n != f.rows:
            raise StorageError(f"export to {target}: {f.uri} holds {n} rows, its task reported {f.rows}")


def write_parquet(spark, df, to: str, *, expected_rows: int | None = None, what: str = "rows") -> ExportResult:
    """Write ``df`` as Parquet files under ``to`` (see the module docstring); returns what was verifiably
    written. ``expected_rows``: the rows the caller knows must be there; any other count is an error."""
    from pyspark.sql.pandas.types import to_arrow_schema

    # Step 1: target and writer side
    target = resolve_target(to)
    side = write_side(spark, target)
    fio = file_io_for(target)
    token = uuid.uuid4().hex[:12]
    # Step 2: replace the directory
    fio.delete_prefix(target)
    # Step 3: write, one file per partition and attempt
    files = (_write_on_executors if side is WriteSide.EXECUTORS else _write_on_driver)(df, target, token)
    if not files:  # no rows: one empty file that carries the schema
        uri = join_uri(target, _part_name(0, token, 0))
        schema = to_arrow_schema(df.schema, timezone="UTC")
        with fio.open_output(uri) as out:
            pq.ParquetWriter(out, schema).close()
        files = [WrittenFile(uri, 0, fio.size(uri))]
    # Step 4: read back and check
    _verify(target, files)
    result = ExportResult(target, side, tuple(sorted(files, key=lambda f: f.uri)))
    if expected_rows is not None and result.rows != expected_rows:
        raise StorageError(f"export to {target}: wrote {result.rows} {what}, expected {expected_rows}")
    # Step 5: drop what no kept attempt acknowledged, then mark success
    kept = {f.uri for f in files}
    for info in fio.list(target):
        if info.uri not in kept:
            fio.delete(info.uri)
    fio.write_bytes(join_uri(target, EXPORT_DONE_FILE), b"")
    return result


def write_empty(to: str) -> ExportResult:
    """An export of nothing whose schema is unknown: the cleared target with ``_SUCCESS`` only."""
    target = resolve_target(to)
    fio = file_io_for(target)
    fio.delete_prefix(target)
    if target.lower().startswith("file:"):
        Path(fio.path_of(target)).mkdir(parents=True, exist_ok=True)  # type: ignore[attr-defined]
    fio.write_bytes(join_uri(target, EXPORT_DONE_FILE), b"")
    return ExportResult(target, WriteSide.DRIVER, ())


def _schema_of(uri: str) -> pa.Schema:
    with file_io_for(uri).open_input(uri) as f:
        return pq.read_schema(f)


def files_with_tag_dataframe(spark, files: Sequence[tuple[str, int]], schema: pa.Schema):
    """Rows of Parquet files plus an ``_txn`` column (the checkpoint id that committed each file)."""
    out_schema = schema.append(pa.field("_txn", pa.int64()))

    files = list(files)
    n = max(1, min(len(files), 16))

    def read(batches):
        for b in batches:
            for task in b.column(0).to_pylist():
                for uri, txn in files[task::n]:
                    with file_io_for(uri).open_input(uri) as f:
                        t = pq.read_table(f)
                    if DELETED in schema.names and DELETED not in t.column_names:   # written before it deleted
                        t = t.append_column(DELETED, pa.repeat(pa.scalar(False), t.num_rows))   # (a bootstrap)
                    t = t.select(schema.names).cast(schema)
                    t = t.append_column("_txn", pa.repeat(pa.scalar(txn, pa.int64()), t.num_rows))
                    yield from t.to_batches(max_chunksize=50_000)

    return spark.range(0, n, 1, n).mapInArrow(counted_in_span(read), schema_ddl(out_schema))


def chains_dataframe(spark, handles, schema: pa.Schema, what: str):
    """Rows of state snapshots that may be chains (base + deltas, checksums verified) plus ``_txn`` = subtask."""
    import json

    out_schema = schema.append(pa.field("_txn", pa.int64()))
    items = [(json.dumps(h.to_dict()), h.subtask) for h in handles if h.file is not None]
    n = max(1, min(len(items), 16))

    def read(batches):
        for b in batches:
            for task in b.column(0).to_pylist():
                for hj, sub in items[task::n]:
                    chain = StateChain.of(StateHandle.from_dict(json.loads(hj)))
                    assert chain is not None
                    t = load_chain(file_io_for(chain.base.uri), chain, what, warm=False)
                    t = t.select(schema.names).cast(schema)
                    t = t.append_column("_txn", pa.repeat(pa.scalar(sub, pa.int64()), t.num_rows))
                    yield from t.to_batches(max_chunksize=50_000)

    return spark.range(0, n, 1, n).mapInArrow(counted_in_span(read), schema_ddl(out_schema))


def _describe(result: ExportResult) -> dict:
    return {"to": result.target, "rows": result.rows, "bytes": result.bytes, "written_files": len(result.files),
            "written_by": result.side.value}


def export_table(spark, table, to: str) -> dict:
    """``table``: a :class:`pipeline.sink.table.CommittedTable`. Upsert tables keep the newest row per key.
    Its S3 requests are counted by the caller's :class:`~pipeline.runtime.spark.task_requests.RequestSpan`
    (``JobRunner.export``: the table's own reads included); the task functions are wrapped for it."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    resolve_target(to)  # bad target -> ConfigError before any Spark work
    if isinstance(table, OpenFormatTable) and table.exists():
        return _export_open_table(spark, table, to)
    chain = table.lineage()
    files = [(f.uri, e.checkpoint_id) for e in chain for f in e.files]
    head = chain[-1] if chain else None
    base = {"table": table.table, "files": len(files), "head": head.checkpoint_id if head else None,
            "lineage": [e.checkpoint_id for e in chain]}
    if not files:  # nothing committed yet: an empty directory (no schema to write)
        return {**base, **_describe(write_empty(to))}
    schema = _schema_of(files[0][0])
    if len(files) > 1 and DELETED not in schema.names:   # a deleting sink's newer files carry its tombstones
        last = _schema_of(files[-1][0])
        schema = schema.append(last.field(DELETED)) if DELETED in last.names else schema
    df = files_with_tag_dataframe(spark, files, schema)
    expected: int | None = sum(e.rows for e in chain)
    assert head is not None  # files were found, so the table has a committed head
    if head.mode == "upsert":
        w = Window.partitionBy(*head.key).orderBy(F.col("_txn").desc())
        df = df.withColumn("_rn", F.row_number().over(w)).filter("_rn = 1").drop("_rn")
        if DELETED in df.columns:   # a deleting sink: a key whose newest row is a tombstone is gone
            df = df.filter(f"NOT coalesce(`{DELETED}`, false)").drop(DELETED)
        expected = None  # the newest row per key: known only once written (and then verified)
    res = write_parquet(spark, df.drop("_txn"), to, expected_rows=expected, what=f"rows of {table.table}")
    return {**base, **_describe(res)}


def _export_open_table(spark, table, to: str) -> dict:
    """An Iceberg/Delta sink: the data files of the table's current snapshot/version are exactly its rows."""
    files = [(u, 0) for u in table.current_files()]
    base = {"table": table.table, "files": len(files), "head": table.current_checkpoint(),
            "format": table.format_name, "version": table.version_id()}
    if not files:
        return {**base, **_describe(write_empty(to))}
    df = files_with_tag_dataframe(spark, files, table.table_schema()).drop("_txn")
    return {**base, **_describe(write_parquet(spark, df, to, what=f"rows of {table.table}"))}


def export_state(spark, snapshot, operator_uid: str, to: str) -> dict:
    """One operator's state of a checkpoint/savepoint, all state names, with ``_state`` and ``_kg`` columns.
    Its S3 requests are counted by the caller's :class:`~pipeline.runtime.spark.task_requests.RequestSpan`
    (``JobRunner.export_state``: reading the snapshot's ``_metadata`` included)."""
    from pyspark.sql import functions as F
    resolve_target(to)
    handles = [h for h in snapshot.metadata.operators[operator_uid] if h.file is not None]
    names = sorted({h.name for h in handles})
    dfs = []
    for name in names:
        of_name = [h for h in handles if h.name == name]
        assert of_name[0].file is not None  # filtered above
        schema = _schema_of(of_name[0].file.uri)
        if any(h.deltas for h in of_name):  # incremental snapshots: base + deltas, applied on the executors
            df = chains_dataframe(spark, of_name, schema, snapshot.describe())
        else:
            df = files_with_tag_dataframe(spark, [(h.file.uri, h.subtask) for h in of_name if h.file], schema)
        dfs.append(df.withColumnRenamed("_txn", "_subtask").withColumn("_state", F.lit(name)))
    if dfs:
        df = dfs[0]
        for d in dfs[1:]:
            df = df.unionByName(d, allowMissingColumns=True)
    else:
        df = spark.createDataFrame([], "_state string")
    res = write_parquet(spark, df, to, expected_rows=sum(h.rows for h in handles),
                        what=f"state rows of {operator_uid} ({snapshot.describe()})")
    return {"checkpoint": snapshot.describe(), "operator": operator_uid, "states": names, **_describe(res)}
