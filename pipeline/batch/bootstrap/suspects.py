"""The source splits that may hold a bad record, and reading them again with the runtime's reader in Spark tasks.

Bootstrap writes the dead letters of the epochs it computes (:mod:`pipeline.batch.bootstrap.dead_letters`), and the
``users_read`` check recomputes the records the runtime rejects (:mod:`pipeline.quality.source_dead_letters`); both
read only the splits of files that may hold a bad record (:func:`suspect_splits`: a local Parquet file whose footer
proves it clean is skipped, :func:`clean_file`) and read them the same way (:func:`read_suspect_splits`): the
runtime's :class:`~pipeline.source.reader.SplitReader` per source in Spark tasks, each split's dead-letter lines
written by the reader or handed to a callback.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.arrow_ddl import schema_ddl
from pipeline.fileio import LocalFileIO
from pipeline.job import SourceNode
from pipeline.runtime.spark.dataflow import rethrow_task_error
from pipeline.runtime.spark.task_requests import counted_in_span
from pipeline.source.planner import Split
from pipeline.source.reader import SplitReader

__all__ = ["clean_file", "suspect_splits", "read_suspect_splits", "LinesToRows"]


def clean_file(path: str, source: SourceNode) -> bool:
    """A local Parquet file that holds no bad record: every declared column once with exactly its type, and the
    statistics of every row group show no null key, no ``""`` key and no null ``_ingest_ts``. Anything unknown
    (no statistics, an unreadable footer): not clean."""
    try:
        pf = pq.ParquetFile(path)
        fs = pf.schema_arrow
        for f in source.schema:
            if fs.get_field_index(f.name) < 0 or fs.field(f.name).type != f.type:
                return False
        md = pf.metadata
        cols = {md.schema.column(i).path: i for i in range(md.num_columns)}
        for name in [c for c in (source.key, "_ingest_ts") if c]:
            i = cols.get(name)
            if i is None:
                return False
            for rg in range(md.num_row_groups):
                st = md.row_group(rg).column(i).statistics
                if st is None or not st.has_null_count or st.null_count:
                    return False
                if name == source.key and pa.types.is_string(source.schema.field(name).type):
                    if md.row_group(rg).num_rows and (not st.has_min_max or st.min in ("", b"")):
                        return False
    except (OSError, ValueError, pa.ArrowException):
        return False
    return True


def suspect_splits(source: SourceNode, splits: Sequence[Split]) -> list[Split]:
    """The splits of files that may hold a bad record (:func:`clean_file`), one footer read per file."""
    local = sorted({s.uri for s in splits if s.row_end is not None and s.format == "parquet"
                    and s.uri.startswith("file:")})
    with ThreadPoolExecutor(8) as pool:
        verdict = dict(zip(local, pool.map(lambda u: clean_file(LocalFileIO.path_of(u), source), local)))
    return [s for s in splits if not verdict.get(s.uri, False)]


#: what a suspect split's dead-letter lines become in :func:`read_suspect_splits`: rows of its result
LinesToRows = Callable[[Split, list[str]], list[tuple]]


_NO_ROWS = pa.schema([("task", pa.int64())])   # the result of reading suspects whose dead letters are written


def _read_group(splits: Sequence[Split], readers: Mapping[str, SplitReader], prepare: Callable[[Split], Split] | None,
                lines_to_rows: LinesToRows | None) -> list[tuple]:
    """One Spark task of :func:`read_suspect_splits`: its splits read in order; the rows of their dead letters."""
    rows: list[tuple] = []

    def collect(split: Split, lines: list[str]) -> None:
        assert lines_to_rows is not None
        rows.extend(lines_to_rows(split, lines))

    for split in splits:
        if prepare is not None:
            split = prepare(split)
        for _ in readers[split.source].read_split(split, collect if lines_to_rows is not None else None):
            pass
    return rows


def read_suspect_splits(runner, readers: Mapping[str, SplitReader], todo: Sequence[Split], *,
                        prepare: Callable[[Split], Split] | None = None, lines_to_rows: LinesToRows | None = None,
                        schema: pa.Schema | None = None, max_tasks: int = 16) -> pa.Table:
    """Read ``todo`` with the runtime's reader of each split's source (``readers``: source -> reader) in Spark
    tasks (at most ``max_tasks``; ``prepare`` completes a split inside its task). Without ``lines_to_rows`` each
    reader writes its dead letters (or raises, policy ``fail``: Epochal's error comes out whole) and the result has
    no rows; with it, each split's dead-letter lines go to it instead (nothing written) and the rows it returns
    (columns ``schema``) are the result."""
    out = schema if schema is not None else _NO_ROWS
    n_tasks = max(1, min(len(todo), max_tasks))
    groups = [list(todo[i::n_tasks]) for i in range(n_tasks)]

    def read(batches):
        for b in batches:
            for task in b.column(0).to_pylist():
                rows = _read_group(groups[task], readers, prepare, lines_to_rows)
                yield pa.RecordBatch.from_pylist([dict(zip(out.names, r)) for r in rows], schema=out)

    try:
        return runner.spark.range(0, n_tasks, 1, n_tasks).mapInArrow(counted_in_span(read), schema_ddl(out)).toArrow()
    except Exception as e:  # noqa: BLE001 - Epochal's own error (MalformedInputError, StorageError) comes out whole
        rethrow_task_error(e)
        raise
