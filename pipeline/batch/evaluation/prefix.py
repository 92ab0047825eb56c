"""The source prefix a checkpoint covers, read as Spark DataFrames for the batch evaluation.

A :class:`Prefix` names, for every source partition, the barrier position of checkpoint ``n`` (rows before
it are in the prefix) and the barrier positions of every earlier epoch from the write-ahead barrier log
(``<checkpoint root>/<job>/barriers/epoch-<k>.json``). From those it tags each row ``x`` with its
**processing epoch** ``p(x)``: the first logged epoch ``k`` whose barrier lies after ``x`` in its partition,
i.e. the checkpoint in whose rounds the runtime consumed ``x``. ``p(x)`` is ``e(x) = floor(_ingest_ts / E)``
for rows that arrived in time, and later for rows of a partition that was idle when its barrier was cut. An epoch
an unaligned checkpoint completed while a partition lagged is not in the barrier log; the lag log
(``barriers/lagged/``, :func:`lag_log`) says where that checkpoint stopped reading each partition, and those
positions count as its barriers (the runtime tags what a checkpoint reads past every logged barrier with its epoch).

Rows are read with the runtime's source reader (same file listing, same bad-record rules), but bad records
are only counted here, never written to the dead-letter location: the batch evaluation has no side effects.

**Unaligned checkpoints with pending channel state** (``Prefix.consumed``): the rows before the checkpoint's restore
positions, not its barriers - the rest of the pre-barrier data (in-flight files and source ranges) is consumed by
later checkpoints, so it is in neither the checkpoint's state nor its committed output (docs/batch.md "Prefix").

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

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.exceptions import StorageError
from pipeline.fileio import LocalFileIO, join_uri
from pipeline.job import Job, SourceNode
from pipeline.runtime.spark.dataflow import schema_ddl
from pipeline.runtime.spark.task_requests import counted_in_span
from pipeline.source._formats import CONTENT_ERRORS
from pipeline.source.layout import SourceFile, list_source_files
from pipeline.source.planner import Split
from pipeline.source.reader import META_FIELDS, SplitReader
from pipeline.source.summary import summarize_file

__all__ = ["Prefix", "PEPOCH", "NATIVE_ENV", "scan_settings", "SCAN_TASKS_PER_SUBTASK", "ordinal", "processing_epochs", "barrier_log", "lag_log", "native_files", "native_type",
           "source_dataframe"]

PEPOCH = "_pepoch"          # processing epoch of a row (see the module docstring)
_EPOCH_FILE = re.compile(r"epoch-(\d+)\.json$")
_BIG = 1 << 62
NATIVE_ENV = "EPOCHAL_BATCH_NATIVE_READ"    # "0": every file through the runtime's reader
_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9/._=+,-]+$")   # paths Spark reports verbatim in ``_metadata.file_path``
_NATIVE_TESTS = (pa.types.is_string, pa.types.is_large_string, pa.types.is_float64, pa.types.is_float32,
                 pa.types.is_int64, pa.types.is_int32, pa.types.is_int16, pa.types.is_int8, pa.types.is_boolean,
                 pa.types.is_date32, pa.types.is_binary, pa.types.is_large_binary, pa.types.is_decimal128)


#: file-split tasks of a native read per subtask (:func:`scan_settings`)
SCAN_TASKS_PER_SUBTASK = 4


@contextmanager
def scan_settings(spark, parallelism: int) -> Iterator[None]:
    """Spark's file-split settings for the plan's native read, while the plan runs (Spark reads them when an action
    plans the scan, not when the DataFrame is declared; restored after). Spark's defaults count 4 MB of "open
    cost" per file and pack up to 128 MB per task: made for big HDFS files, they cut a long history of small local
    files (1,536 files of ~48 KB per source at 192 epochs) into ~48 scan tasks per source, whose per-task work
    (scheduling, a reader set up per task, a shuffle file per task) cost more than the rows. Here the bytes of a
    source are split evenly into ``SCAN_TASKS_PER_SUBTASK x parallelism`` tasks (no open cost; at most 128 MB per
    task still): the same rows, fewer tasks (docs/batch.md "Cost")."""
    conf = {"spark.sql.files.openCostInBytes": "0",
            "spark.sql.files.minPartitionNum": str(SCAN_TASKS_PER_SUBTASK * max(1, parallelism))}
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def ordinal(seq: int, row: int) -> int:
    """A position as one sortable integer (the quality suites use the same form)."""
    return (int(seq) << 32) + int(row)


@dataclass(frozen=True)
class Prefix:
    """Checkpoint ``epoch``'s barriers and the barrier log before it, for one job."""

    epoch: int                                        # n
    epoch_seconds: int                                # E
    barriers: Mapping[str, Mapping[int, tuple[int, int]]]          # source -> partition -> (seq, row)
    log: Mapping[int, Mapping[str, Mapping[int, tuple[int, int]]]] = field(default_factory=dict)  # epoch k < n
    # the low watermark L of the inputs at checkpoint n (``_metadata.extra.low_epoch``): state expired with the
    # cutoff end(L) - ttl; None: n (aligned inputs)
    low_epoch: int | None = None
    # the validated checkpoint's id: which logged rounds belong to its lineage (pipeline.batch.evaluation.rounds); None: any
    checkpoint_id: int | None = None
    # where the rows the checkpoint's state and committed output cover end, per partition, when that is before
    # the barrier: an unaligned checkpoint's restore positions (``_metadata.positions``, the cut) while source
    # ranges ``[positions, barriers)`` and in-flight files are pending (channel state, consumed by later
    # checkpoints). None: the barriers. ``p(x)`` is still computed from the barriers.
    consumed: Mapping[str, Mapping[int, tuple[int, int]]] | None = None

    def stops(self, source: str) -> Mapping[int, tuple[int, int]]:
        """Per partition of ``source``: the position before which rows are in the prefix (see ``consumed``)."""
        return (self.consumed if self.consumed is not None else self.barriers).get(source, {})

    @property
    def ttl_epoch(self) -> int:
        """The epoch whose end the TTL cutoff of checkpoint n's state is computed from (``L``, at most n)."""
        return self.epoch if self.low_epoch is None else min(self.low_epoch, self.epoch)

    @property
    def epoch_us(self) -> int:
        return self.epoch_seconds * 1_000_000

    def end_us(self, k: int) -> int:
        return (k + 1) * self.epoch_us

    def lookup(self, source: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per partition: increasing barrier ordinals and their epochs (``p(x)`` by ``searchsorted``)."""
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        epochs = sorted(k for k in self.log if k < self.epoch) + [self.epoch]
        parts = set(self.barriers.get(source, {})) | set(self.stops(source))
        for k in epochs[:-1]:
            parts |= set(self.log[k].get(source, {}))
        for p in parts:
            ords, eps, best = [], [], -1
            for k in epochs:
                pos = (self.barriers.get(source, {}).get(p) if k == self.epoch
                       else self.log[k].get(source, {}).get(p))
                if pos is None and k == self.epoch:   # a lagging partition: its rows past every point are n's
                    pos = (_BIG >> 32, 0)
                if pos is None:
                    continue
                o = max(best, ordinal(*pos))
                ords.append(o)
                eps.append(k)
                best = o
            out[int(p)] = (np.asarray(ords, np.int64), np.asarray(eps, np.int64))
        return out


def processing_epochs(bar_o: np.ndarray, bar_e: np.ndarray, ords: np.ndarray, own: np.ndarray,
                      last: int) -> np.ndarray:
    """``p(x)`` of rows at ordinals ``ords`` with ``e(x) = own``, from one partition's :meth:`Prefix.lookup` entry
    (``last`` = n). The native read computes the same in Spark SQL (``_native_frame``)."""
    if len(bar_e) <= 1:      # no log (or only barrier n): e(x), capped at n
        return np.minimum(own, last)
    # the barrier log of earlier epochs (and the lag log) says where x was consumed
    idx = np.searchsorted(bar_o, ords, side="right")
    pe = np.where(idx < len(bar_e), bar_e[np.minimum(idx, len(bar_e) - 1)], last)
    # before the first logged barrier k0: e(x), at most k0 (= k0 for a job that ran from its first epoch; e(x)
    # for a job bootstrapped at k0, docs/batch.md)
    return np.where(idx == 0, np.minimum(own, bar_e[0]), pe)


def barrier_log(ckpt_fio, job_root: str, upto: int) -> dict[int, dict[str, dict[int, tuple[int, int]]]]:
    """Barrier positions of every logged epoch ``< upto`` (missing log: empty; rows then default to e(x))."""
    root = join_uri(job_root, "barriers")
    out: dict[int, dict[str, dict[int, tuple[int, int]]]] = {}
    try:
        files = ckpt_fio.list(root, recursive=False)
    except StorageError:
        return out
    for f in files:
        m = _EPOCH_FILE.search(f.uri)
        if not m or int(m.group(1)) >= upto:
            continue
        doc = json.loads(ckpt_fio.read_bytes(f.uri))
        out[int(m.group(1))] = {s: {int(p): (int(v["seq"]), int(v["row"])) for p, v in parts.items()}
                                for s, parts in doc.get("barriers", {}).items()}
    return out


_LAG_FILE = re.compile(r"epoch-(\d+)-chk-(\d+)\.json$")


def lag_log(ckpt_fio, job_root: str, upto: int, upto_id: int | None) -> dict[int, dict[str, dict[int, tuple[int, int]]]]:
    """Per epoch ``m < upto`` that a checkpoint completed while a partition lagged (so ``m`` is not in the barrier
    log): where that checkpoint stopped reading each partition (``barriers/lagged/epoch-<m>-chk-<id>.json``,
    written by the runtime before the checkpoint's last round; ``BarrierLog.log_lagged``). The runtime tags the rows
    a checkpoint of epoch ``m`` reads past every logged barrier with ``m`` (a lagging partition's, and an unlogged
    epoch's), so these positions act as barriers of epoch ``m`` (docs/batch.md "Lagging partitions"). Among the
    attempts of an epoch, the newest whose id is at most ``upto_id`` (the validated checkpoint's lineage, as the
    round log); None: the newest."""
    root = join_uri(job_root, "barriers", "lagged")
    try:
        files = ckpt_fio.list(root, recursive=False)
    except StorageError:
        return {}
    chosen: dict[int, tuple[int, str]] = {}
    for f in files:
        m = _LAG_FILE.search(f.uri)
        if not m or int(m.group(1)) >= upto or (upto_id is not None and int(m.group(2)) > upto_id):
            continue
        ep, cid = int(m.group(1)), int(m.group(2))
        if ep not in chosen or cid > chosen[ep][0]:
            chosen[ep] = (cid, f.uri)
    out: dict[int, dict[str, dict[int, tuple[int, int]]]] = {}
    for ep, (_cid, uri) in chosen.items():
        doc = json.loads(ckpt_fio.read_bytes(uri))
        out[ep] = {s: {int(p): (int(v["seq"]), int(v["row"])) for p, v in parts.items()}
                   for s, parts in doc.get("read", {}).items()}
    return out


@dataclass(frozen=True)
class _CountingReader(SplitReader):
    """The runtime's split reader, minus the side effect: bad records are left where they are (the epoch
    runtime dead-letters them; the batch evaluation reads the same good rows)."""

    def write_dead_letters(self, split, lines) -> None:  # noqa: D401 - no side effects here
        return None


def _files(runner, source: SourceNode, stops: Mapping[int, tuple[int, int]]) -> list[tuple]:
    """``(SourceFile fields..., stop row or None)`` of every file with rows before the barrier: listing only (the
    footers are read by the executors, which turn each file into its split)."""
    files = list_source_files(runner.src_fio, runner.config.source_uri, source.name, policy="dead_letter")
    out: list[tuple] = []
    for p, fs in files.items():
        if int(p) not in stops:
            continue
        bseq, brow = stops[int(p)]
        for f in fs:
            if f.seq < bseq:
                out.append((f.source, f.partition, f.seq, f.uri, f.format, f.size, None))
            elif f.seq == bseq and brow > 0:
                out.append((f.source, f.partition, f.seq, f.uri, f.format, f.size, brow))
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
    if (os.environ.get(NATIVE_ENV, "1") == "0" or not all(native_type(f.type) for f in source.schema)
            or any(n.startswith(("_metadata", "__")) for n in names)):
        return [], list(files)
    cand: list[tuple[tuple, str]] = []
    rest: list[tuple] = []
    for t in files:
        uri, fmt = t[3], t[4]
        path = LocalFileIO.path_of(uri) if uri.startswith("file:") and fmt == "parquet" else ""
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
    for (_src, part, seq, _uri, _fmt, _size, stop), path in files:
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
    native, splits = native_files(source, _files(runner, source, stops))
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
                for src, part, seq, uri, fmt, size, stop in groups[task]:
                    f = SourceFile(src, part, seq, uri, fmt, size)
                    summary = summarize_file(f)
                    if summary.corrupt:
                        split = Split(src, part, seq, uri, fmt, 0, None)
                    else:
                        split = Split(src, part, seq, uri, fmt, 0, summary.rows if stop is None
                                      else min(stop, summary.rows))
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
