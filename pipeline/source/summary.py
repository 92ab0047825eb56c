"""What a source file holds, as far as the epoch contract needs it: its rows and ``_ingest_ts`` statistics.

Summaries
    Per file: rows and min/max ``_ingest_ts`` (microseconds) from the Parquet footer statistics (per row
    group). Only when a boundary falls inside a row group (or statistics are missing) is the
    ``_ingest_ts`` column of that row group read (:func:`read_group_ts`), never the other columns. JSON Lines
    files are small and are read fully. Summaries and those columns are cached per process by ``(uri, size)``
    (files are immutable).

Corrupt files
    A file whose bytes cannot be parsed is summarised as :attr:`FileStatus.CORRUPT` with zero rows. It
    occupies the slot ``[(seq, 0), (seq + 1, 0))``: a segment covering that slot contains a whole-file
    split with ``row_end=None`` that the reader dead-letters (or fails on, per policy). It never
    blocks a barrier and never disappears silently. I/O errors (network, permissions, a file that vanished)
    are not corruption: they raise :class:`~pipeline.exceptions.SourceError` naming the file.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.checkpoint.handles import Position
from pipeline.exceptions import ObjectNotFoundError, SourceError, StorageError
from pipeline.fileio import file_io_serving
from pipeline.source._formats import (
    CONTENT_ERRORS,
    INGEST_TS,
    NO_TS,
    TS_US,
    TypeMismatch,
    cast_lenient,
    ingest_us,
    read_jsonl,
)
from pipeline.source.layout import SourceFile

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.fileio import FileIO

__all__ = ["FileStatus", "RowGroupStats", "FileSummary", "summarize_file", "summarize_files", "summarize_source",
           "clear_summary_cache", "read_group_ts", "file_label"]


class FileStatus(str, Enum):
    OK = "ok"
    CORRUPT = "corrupt"


@dataclass(frozen=True, slots=True)
class RowGroupStats:
    """``_ingest_ts`` facts of one row group (a JSON Lines file is one group).

    ``min_ts``/``max_ts`` are over rows with a usable timestamp (None: unknown, or no such row).
    ``nulls`` counts rows without a usable timestamp (None: unknown).
    """

    rows: int
    min_ts: int | None
    max_ts: int | None
    nulls: int | None


@dataclass(frozen=True, slots=True)
class FileSummary:
    file: SourceFile
    status: FileStatus
    rows: int
    min_ts: int | None  # over the whole file; None when unknown from statistics or no usable timestamp
    max_ts: int | None
    row_groups: tuple[RowGroupStats, ...] = ()
    error: str | None = None

    @property
    def seq(self) -> int:
        return self.file.seq

    @property
    def uri(self) -> str:
        return self.file.uri

    @property
    def corrupt(self) -> bool:
        return self.status is FileStatus.CORRUPT


_CACHE_MAX = 200_000
_TS_CACHE_MAX_VALUES = 20_000_000
_lock = threading.Lock()
_summaries: OrderedDict[tuple[str, int], FileSummary] = OrderedDict()
_ts_arrays: OrderedDict[tuple[str, int, int], np.ndarray] = OrderedDict()
_ts_values = 0


def clear_summary_cache() -> None:
    global _ts_values
    with _lock:
        _summaries.clear()
        _ts_arrays.clear()
        _ts_values = 0


def file_label(f: SourceFile) -> str:
    of = f", {f.origin}" if f.origin else ""
    return f"{f.uri} (source {f.source}, partition {f.partition}, seq {f.seq}{of})"


def _io_for(f: SourceFile, fileio: FileIO | None) -> FileIO:
    return file_io_serving(fileio, f.uri)


def _remember_ts(key: tuple[str, int, int], arr: np.ndarray) -> None:
    global _ts_values
    with _lock:
        if key in _ts_arrays:
            return
        _ts_arrays[key] = arr
        _ts_values += len(arr)
        while _ts_values > _TS_CACHE_MAX_VALUES and len(_ts_arrays) > 1:
            _, old = _ts_arrays.popitem(last=False)
            _ts_values -= len(old)


def _io_error(f: SourceFile, e: BaseException) -> SourceError:
    if isinstance(e, ObjectNotFoundError) and f.origin:
        return SourceError(f"data file of a lake table disappeared: {file_label(f)}; table retention (VACUUM, "
                           "snapshot expiry, orphan-file removal) deleted a file the job has not read yet. Read the "
                           "table from a new job, or retain data files longer than the job may lag")
    if isinstance(e, ObjectNotFoundError):
        return SourceError(f"source file disappeared (source files must never be deleted or replaced): {file_label(f)}")
    return SourceError(f"cannot read source file {file_label(f)}: {e}")


def _stat_to_us(raw: object, unit: str | None) -> int | None:
    if not isinstance(raw, (int, np.integer)):
        return None
    v = int(raw)
    if unit == "s":
        return v * 1_000_000
    if unit == "ms":
        return v * 1_000
    if unit == "us":
        return v
    if unit == "ns":
        return v // 1_000  # floor: ts_ns >= B*1000  <=>  floor(ts_ns / 1000) >= B
    return None


def _ts_unit(t: pa.DataType) -> str | None:
    """Unit in which footer statistics of ``_ingest_ts`` can be read, None if they cannot be used."""
    if pa.types.is_timestamp(t):
        return t.unit
    if pa.types.is_int64(t):
        return "us"  # plain int64 is cast to timestamp[us] by the reader: microseconds
    return None


def _summarize_parquet(f: SourceFile, fio: FileIO) -> FileSummary:
    try:
        with fio.open_input(f.uri) as stream:
            pf = pq.ParquetFile(stream)
            md = pf.metadata
            arrow_schema = pf.schema_arrow
    except StorageError as e:
        raise _io_error(f, e) from e
    except CONTENT_ERRORS as e:
        return FileSummary(f, FileStatus.CORRUPT, 0, None, None, (), f"unreadable parquet: {e}")
    except OSError as e:  # footers are parsed with ArrowInvalid errors; OSError is I/O trouble
        raise _io_error(f, e) from e
    groups: list[RowGroupStats] = []
    idx = arrow_schema.get_field_index(INGEST_TS)
    ts_type = arrow_schema.field(idx).type if idx >= 0 else None
    usable = ts_type is not None
    if usable:
        try:
            cast_lenient(pa.array([], type=ts_type), TS_US)
        except TypeMismatch:
            usable = False
    leaf = -1
    if usable:
        for j in range(md.num_columns):
            if md.schema.column(j).path == INGEST_TS:
                leaf = j
                break
    unit = _ts_unit(ts_type) if usable else None
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        n = rg.num_rows
        if not usable:
            groups.append(RowGroupStats(n, None, None, n))
            continue
        st = rg.column(leaf).statistics if leaf >= 0 else None
        nulls = st.null_count if st is not None and st.has_null_count else None
        if (st is None or not st.has_min_max or unit is None
                or rg.column(leaf).physical_type != "INT64"):
            groups.append(RowGroupStats(n, None, None, nulls if nulls == n else None))
            continue
        lo, hi = _stat_to_us(st.min_raw, unit), _stat_to_us(st.max_raw, unit)
        groups.append(RowGroupStats(n, lo, hi, nulls if lo is not None and hi is not None else None))
    return _file_summary(f, groups)


def _file_summary(f: SourceFile, groups: list[RowGroupStats]) -> FileSummary:
    rows = sum(g.rows for g in groups)
    known = [g for g in groups if g.rows and not (g.nulls == g.rows)]
    mins = [g.min_ts for g in known if g.min_ts is not None]
    maxs = [g.max_ts for g in known if g.max_ts is not None]
    exact = len(mins) == len(maxs) == len(known)
    lo = min(mins, default=None) if exact else None
    hi = max(maxs, default=None) if exact else None
    return FileSummary(f, FileStatus.OK, rows, lo, hi, tuple(groups))


def _summarize_jsonl(f: SourceFile, fio: FileIO) -> FileSummary:
    try:
        data = fio.read_bytes(f.uri)
    except StorageError as e:
        raise _io_error(f, e) from e
    try:
        table = read_jsonl(data)
    except CONTENT_ERRORS as e:
        return FileSummary(f, FileStatus.CORRUPT, 0, None, None, (), f"unreadable JSON Lines: {e}")
    n = table.num_rows
    col = table.column(INGEST_TS) if INGEST_TS in table.column_names else None
    ts = ingest_us(col, n)
    _remember_ts((f.uri, f.size, 0), ts)
    valid = ts[ts != NO_TS]
    nulls = int(n - len(valid))
    lo = int(valid.min()) if len(valid) else None
    hi = int(valid.max()) if len(valid) else None
    return _file_summary(f, [RowGroupStats(n, lo, hi, nulls)])


def summarize_file(file: SourceFile, *, fileio: FileIO | None = None) -> FileSummary:
    """Summary of one file (cached by ``(uri, size)``)."""
    key = (file.uri, file.size)
    with _lock:
        hit = _summaries.get(key)
        if hit is not None:
            _summaries.move_to_end(key)
    if hit is None:
        fio = _io_for(file, fileio)
        hit = _summarize_parquet(file, fio) if file.format == "parquet" else _summarize_jsonl(file, fio)
        with _lock:
            _summaries[key] = hit
            while len(_summaries) > _CACHE_MAX:
                _summaries.popitem(last=False)
    if file.ingest_ts is not None and not hit.corrupt:  # a lake file: every row has the commit time
        t = file.ingest_ts
        return _file_summary(file, [RowGroupStats(g.rows, t, t, 0) for g in hit.row_groups])
    return hit if hit.file == file and hit.file.ingest_ts is None else _rebind(hit, file)


def _rebind(s: FileSummary, f: SourceFile) -> FileSummary:
    return FileSummary(f, s.status, s.rows, s.min_ts, s.max_ts, s.row_groups, s.error)


def summarize_files(files: Sequence[SourceFile], *, fileio: FileIO | None = None,
                    max_workers: int = 8) -> tuple[FileSummary, ...]:
    """Summaries of ``files`` in the same order (footers read in parallel threads)."""
    if len(files) <= 1 or max_workers <= 1:
        return tuple(summarize_file(f, fileio=fileio) for f in files)
    with ThreadPoolExecutor(max_workers=min(max_workers, len(files))) as pool:
        return tuple(pool.map(lambda f: summarize_file(f, fileio=fileio), files))


def summarize_source(files_by_partition: Mapping[int, Sequence[SourceFile]], *,
                     since: Mapping[int, Position] | None = None, fileio: FileIO | None = None,
                     max_workers: int = 8) -> dict[int, tuple[FileSummary, ...]]:
    """Summaries per partition. With ``since``, files before ``since[p].seq`` are left out (they are
    behind the start position and never needed again)."""
    flat: list[SourceFile] = []
    for p in sorted(files_by_partition):
        lo = since[p].seq if since is not None and p in since else None
        flat.extend(f for f in files_by_partition[p] if lo is None or f.seq >= lo)
    out: dict[int, list[FileSummary]] = {p: [] for p in sorted(files_by_partition)}
    for s in summarize_files(flat, fileio=fileio, max_workers=max_workers):
        out[s.file.partition].append(s)
    return {p: tuple(v) for p, v in out.items()}

def read_group_ts(s: FileSummary, group: int, fileio: FileIO | None) -> np.ndarray:
    """``_ingest_ts`` of row group ``group`` of a summarised file, in microseconds (cached per process)."""
    key = (s.uri, s.file.size, group)
    with _lock:
        hit = _ts_arrays.get(key)
    if hit is not None:
        return hit
    f = s.file
    if f.ingest_ts is not None:  # a lake file: the commit time (never read: summaries have it exactly)
        return np.full(s.row_groups[group].rows, f.ingest_ts, dtype=np.int64)
    fio = _io_for(f, fileio)
    try:
        if f.format == "parquet":
            with fio.open_input(f.uri) as stream:
                pf = pq.ParquetFile(stream)
                n = pf.metadata.row_group(group).num_rows
                if INGEST_TS in pf.schema_arrow.names:
                    col = pf.read_row_group(group, columns=[INGEST_TS]).column(INGEST_TS)
                else:
                    col = None
        else:
            table = read_jsonl(fio.read_bytes(f.uri))
            n = table.num_rows
            col = table.column(INGEST_TS) if INGEST_TS in table.column_names else None
    except StorageError as e:
        raise _io_error(f, e) from e
    except CONTENT_ERRORS:
        # footer was fine, the column is not: no usable timestamps here (the reader dead-letters the rows)
        arr = np.full(s.row_groups[group].rows, NO_TS, dtype=np.int64)
        _remember_ts(key, arr)
        return arr
    except OSError as e:
        raise _io_error(f, e) from e
    arr = ingest_us(col, n)
    _remember_ts(key, arr)
    return arr
