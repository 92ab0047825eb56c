"""Reading a source prefix (:class:`~pipeline.batch.evaluation.prefix.Prefix`) as a Spark DataFrame, each row with its
processing epoch (:func:`source_dataframe`).

Rows are read with the runtime's source reader (same file listing, same bad-record rules), but bad records
are only counted here, never written to the dead-letter location: the batch evaluation has no side effects.

**Native reading.** A ``file://`` Parquet file whose footer shows every declared column with exactly the declared
type (the runtime's reader then has nothing to cast, so its only bad-record rules are a null/empty key and a null
``_ingest_ts``) is read by Spark's own Parquet reader instead (:func:`native_files`): the positions come from the
file listing (``_partition``, ``_seq``, by the file's path) and Spark's ``_metadata.row_index`` (``_row``), the
processing epoch from the same barrier arithmetic, in Spark SQL. The rows are the same; no row crosses Python.
Every other file (S3, JSON Lines, a footer that cannot be read, a missing or differently typed column, a type
outside :func:`native_type`) goes through the runtime's reader, and both are unioned. ``EPOCHAL_BATCH_NATIVE_READ=0``
reads everything through the runtime's reader. One difference remains: a file whose footer is readable but whose
data pages are corrupt makes the native read fail (Spark names the file), where the runtime dead-letters the
row group - an error, never a different result.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import settings
from pipeline.batch.evaluation.prefix import PEPOCH, Prefix, processing_epochs
from pipeline.exceptions import StorageError
from pipeline.fileio import LocalFileIO
from pipeline.job import Job, SourceNode
from pipeline.runtime.spark.dataflow import schema_ddl
from pipeline.runtime.spark.task_requests import counted_in_span
from pipeline.source._formats import CONTENT_ERRORS
from pipeline.source.lake import list_lake_files
from pipeline.source.layout import SourceFile, list_source_files
from pipeline.source.planner import Split
from pipeline.source.reader import META_FIELDS, SplitReader
from pipeline.source.summary import summarize_file

__all__ = ["NATIVE_ENV", "native_files", "native_type", "prefix_files", "source_dataframe"]


NATIVE_ENV = "EPOCHAL_BATCH_NATIVE_READ"    # "0": every file through the runtime's reader

_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9/._=+,-]+$")   # paths Spark reports verbatim in ``_metadata.file_path``

_NATIVE_TESTS = (pa.types.is_string, pa.types.is_large_string, pa.types.is_float64, pa.types.is_float32,
                 pa.types.is_int64, pa.types.is_int32, pa.types.is_int16, pa.types.is_int8, pa.types.is_boolean,
                 pa.types.is_date32, pa.types.is_binary, pa.types.is_large_binary, pa.types.is_decimal128)


@dataclass(frozen=True)
class _CountingReader(SplitReader):
    """The runtime's split reader, minus the side effect: bad records are left where they are (the epoch
    runtime dead-letters them; the batch evaluation reads the same good rows)."""

    def write_dead_letters(self, split, lines) -> None:  # noqa: D401 - no side effects here
        return None


def prefix_files(runner, source: SourceNode, stops: Mapping[int, tuple[int, int]]) -> list[tuple]:
    """``(SourceFile fields..., stop row or None)`` of every file with rows before the barrier: listing only (the
    footers are read by the executors, which turn each file into its split)."""
    if source.table is not None:   # a lake table: every commit from its first version (lineage as now)
        files = list_lake_files(source.name, source.table.resolved(runner.config.source_uri), source.schema, 0,
                                ingest_time=source.ingest_time)
    else:
        files = list_source_files(runner.src_fio, runner.config.source_uri, source.name, policy="dead_letter")
    out: list[tuple] = []
    for p, fs in files.items():
        if int(p) not in stops:
            continue
        bseq, brow = stops[int(p)]
        for f in fs:
            if f.seq < bseq:
                out.append((f.source, f.partition, f.seq, f.uri, f.format, f.size, None, f.ingest_ts))
            elif f.seq == bseq and brow > 0:
                out.append((f.source, f.partition, f.seq, f.uri, f.format, f.size, brow, f.ingest_ts))
    out.sort(key=lambda t: -t[5])   # biggest first: balanced tasks
    return out


def native_type(t: pa.DataType) -> bool:
    """Spark's Parquet reader returns the same values as the runtime's reader for a column of type ``t`` stored
    with exactly that type (timestamps: an instant - a time zone - in ms or µs)."""
    if pa.types.is_timestamp(t):
        return t.unit in ("ms", "us") and t.tz is not None
    return any(test(t) for test in _NATIVE_TESTS)


def _native_footer(path: str, schema: pa.Schema, stop: int | None) -> bool:
    """The file's footer is readable and has every declared column once (Spark matches names ignoring case), with
    exactly the declared type, and at least ``stop`` rows (else the runtime's reader names the problem)."""
    try:
        pf = pq.ParquetFile(path)
        fs, rows = pf.schema_arrow, pf.metadata.num_rows
    except CONTENT_ERRORS + (OSError,):
        return False
    lower = [n.lower() for n in fs.names]
    for f in schema:
        if lower.count(f.name.lower()) != 1 or f.name not in fs.names or fs.field(f.name).type != f.type:
            return False
    return stop is None or stop <= rows


def native_files(source: SourceNode, files: list[tuple]) -> tuple[list[tuple[tuple, str]], list[tuple]]:
    """``files`` (:func:`_files` tuples) split into those Spark reads natively (with their local paths) and those
    the runtime's reader reads (see the module docstring)."""
    names = [f.name for f in source.schema]
    if (settings.value(NATIVE_ENV) == "0" or not all(native_type(f.type) for f in source.schema)
            or any(n.startswith(("_metadata", "__")) for n in names)):
        return [], list(files)
    cand: list[tuple[tuple, str]] = []
    rest: list[tuple] = []
    for t in files:
        uri, fmt = t[3], t[4]
        # a lake file's _ingest_ts is its commit time, added by the runtime's reader
        path = LocalFileIO.path_of(uri) if uri.startswith("file:") and fmt == "parquet" and t[7] is None else ""
        if _PLAIN_PATH.match(path):
            cand.append((t, path))
        else:
            rest.append(t)
    cand_ok: list[tuple[tuple, str]] = []
    if cand:
        with ThreadPoolExecutor(8) as pool:
            oks = list(pool.map(lambda c: _native_footer(c[1], source.schema, c[0][6]), cand))
        for c, ok in zip(cand, oks):
            if ok:
                cand_ok.append(c)
            else:
                rest.append(c[0])
    return cand_ok, rest


def _native_frame(spark, source: SourceNode, files: list[tuple[tuple, str]], prefix: Prefix, read_schema: pa.Schema):
    """The rows of ``files`` read by Spark's Parquet reader, with the columns of ``read_schema`` (positions from the
    listing and ``_metadata.row_index``, ``_pepoch`` as :func:`source_dataframe` computes it in Python)."""
    from pyspark.sql import functions as F
    lookup = prefix.lookup(source.name)
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    info = []
    for (_src, part, seq, _uri, _fmt, _size, stop, _ts), path in files:
        bar_o, bar_e = lookup.get(part, empty)
        lo = int(seq) << 32
        # idx(row) = #barriers <= ordinal(seq, row) = c0 + #{in-file barrier rows <= row}; a barrier at row 0
        # of the file counts for every row (folded into c0), so most files have no in-file threshold
        c0 = int(np.searchsorted(bar_o, lo + 1, side="left"))
        c1 = int(np.searchsorted(bar_o, (int(seq) + 1) << 32, side="left"))
        thr = [int(o) - lo for o in bar_o[c0:c1]]
        info.append((path, int(part), int(seq), None if stop is None else int(stop), c0, thr,
                     [int(e) for e in bar_e]))
    declared = [f.name for f in source.schema]
    conf = "spark.sql.sources.parallelPartitionDiscovery.threshold"
    old = spark.conf.get(conf)
    spark.conf.set(conf, str(len(files) + 1))   # the listing of known files on the driver, not as a Spark job
    try:
        raw = spark.read.schema(schema_ddl(source.schema)).parquet(*[p for _, p in files])
    finally:
        spark.conf.set(conf, old)
    # the join key: ``partition=<p>/<name>``, the path's last two components (unique within a source by the
    # layout), the same whichever form Spark reports ``_metadata.file_path`` in (``file:/``, ``file:///``)
    keys = ["/".join(i[0].rsplit("/", 2)[-2:]) for i in info]
    if len(set(keys)) != len(keys):   # pragma: no cover - the layout makes them unique
        raise StorageError(f"source {source.name}: two files with the same partition and name: {sorted(keys)[:3]}")
    K = max((len(i[5]) for i in info), default=0)
    info_df = spark.createDataFrame([(k,) + i[1:] for k, i in zip(keys, info)],
                                    "__path string, _partition int, _seq bigint, __stop bigint, __c0 int, "
                                    "__thr array<bigint>, __be array<bigint>")
    raw = raw.select(*[raw[n] for n in declared],
                     F.substring_index(F.col("_metadata.file_path"), "/", -2).alias("__path"),
                     F.col("_metadata.row_index").alias("_row"))
    # a row of a file missing from the table would be lost silently: it fails the query instead
    df = raw.join(F.broadcast(info_df), "__path", "left").withColumn("_seq", F.when(
        F.col("_seq").isNull(), F.raise_error(F.concat(F.lit(f"source {source.name}: file not in the listing: "),
                                                       F.col("__path")))).otherwise(F.col("_seq")))
    ok = F.col("__stop").isNull() | (F.col("_row") < F.col("__stop"))
    ok = ok & F.col("_ingest_ts").isNotNull()
    if source.key:
        ok = ok & F.col(source.key).isNotNull()
        kt = source.schema.field(source.key).type
        if pa.types.is_string(kt) or pa.types.is_large_string(kt) or pa.types.is_binary(kt):
            ok = ok & (F.length(F.col(source.key)) > 0)
    df = df.filter(ok)
    E, last = prefix.epoch_us, prefix.epoch
    own = F.expr(f"(unix_micros(_ingest_ts) - pmod(unix_micros(_ingest_ts), {E}L)) div {E}L")   # floor(t / E)
    idx = F.col("__c0")
    for j in range(K):   # K: the most barriers inside one file (rows > 0), usually 0
        idx = idx + F.coalesce((F.col("_row") >= F.get(F.col("__thr"), j)).cast("int"), F.lit(0))
    n_e = F.size("__be")
    pe = (F.when(n_e <= 1, F.least(own, F.lit(last)))
          .when(idx == 0, F.least(own, F.element_at("__be", 1)))
          .when(idx < n_e, F.element_at("__be", idx + 1))
          .otherwise(F.lit(last)))
    df = df.withColumn(PEPOCH, pe.cast("long"))
    return df.select(*[df[c] for c in read_schema.names])


def source_dataframe(spark, runner, job: Job, source: SourceNode, prefix: Prefix, *, max_tasks: int = 16):
    """The valid rows of ``source`` before checkpoint ``prefix.epoch``'s barriers, with the declared columns,
    the position columns (``_source``, ``_partition``, ``_seq``, ``_row``) and ``_pepoch``."""
    stops = prefix.stops(source.name)
    native, splits = native_files(source, prefix_files(runner, source, stops))
    reader = _CountingReader(source.schema, (source.key,) if source.key else (), "dead_letter",
                             "file:///nonexistent", job.name)
    lookup = prefix.lookup(source.name)
    out_schema = pa.schema(list(source.schema) + list(META_FIELDS) + [pa.field(PEPOCH, pa.int64())])
    # ``_source`` is one constant per source: added by Spark after the read (a literal the optimizer drops when
    # nothing reads it), not converted from Arrow row by row
    read_schema = pa.schema([f for f in out_schema if f.name != "_source"])
    n_tasks = max(1, min(len(splits), max_tasks))
    groups = [splits[i::n_tasks] for i in range(n_tasks)]
    epoch_us = prefix.epoch_us
    last = prefix.epoch

    def read(batches):
        import pyarrow.compute as pc
        for b in batches:
            for task in b.column(0).to_pylist():
                for src, part, seq, uri, fmt, size, stop, lake_ts in groups[task]:
                    f = SourceFile(src, part, seq, uri, fmt, size, lake_ts)
                    summary = summarize_file(f)
                    if summary.corrupt:
                        split = Split(src, part, seq, uri, fmt, 0, None, lake_ts)
                    else:
                        split = Split(src, part, seq, uri, fmt, 0, summary.rows if stop is None
                                      else min(stop, summary.rows), lake_ts)
                    for rb in reader.read_split(split):
                        t = pa.Table.from_batches([rb])
                        ords = (t["_seq"].to_numpy().astype(np.int64) << 32) + t["_row"].to_numpy().astype(np.int64)
                        bar_o, bar_e = lookup.get(part, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
                        ts = pc.cast(pc.cast(t["_ingest_ts"], pa.timestamp("us", tz="UTC")), pa.int64())
                        own = ts.to_numpy(zero_copy_only=False) // epoch_us       # e(x): no barrier logged
                        pe = processing_epochs(bar_o, bar_e, ords, own, last)
                        t = t.append_column(PEPOCH, pa.array(pe.astype(np.int64)))
                        yield from t.select(read_schema.names).cast(read_schema).to_batches()

    from pyspark.sql import functions as F
    def runtime_read():   # the runtime's reader over ``splits``
        return spark.range(0, n_tasks, 1, n_tasks).mapInArrow(counted_in_span(read), schema_ddl(read_schema))

    if native:
        df = _native_frame(spark, source, native, prefix, read_schema)
        if splits:
            df = df.unionByName(runtime_read())
    else:
        df = runtime_read()
    return df.select(*[F.lit(source.name).alias(c) if c == "_source" else df[c] for c in out_schema.names])
