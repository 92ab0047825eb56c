"""Coordinator-side (driver) planning over source files: summaries, barrier positions, bounded segments.

Positions
    A :class:`~pipeline.checkpoint.handles.Position` ``(seq, row)`` is the *next row to read* in a
    partition: every row of files with a smaller seq, and rows ``< row`` of file ``seq``, come before it.
    ``(seq, rows_in_file)`` normalises to ``(seq + 1, 0)`` ("just after file seq"). This does not depend on
    which later files exist, so a position written ahead (barrier log, pending manifest) never changes
    meaning when more files arrive. The very first position of a partition is ``(0, 0)``.

Summaries
    Per file: rows and min/max ``_ingest_ts`` (microseconds) from the Parquet footer statistics (per row
    group). Only when a boundary falls inside a row group (or statistics are missing) is the
    ``_ingest_ts`` column of that row group read, never the other columns. JSON Lines files are small and
    are read fully. Summaries are cached per process by ``(uri, size)`` (files are immutable).

Corrupt files
    A file whose bytes cannot be parsed is summarised as :attr:`FileStatus.CORRUPT` with zero rows. It
    occupies the slot ``[(seq, 0), (seq + 1, 0))``: a segment covering that slot contains a whole-file
    :class:`Split` with ``row_end=None`` that the reader dead-letters (or fails on, per policy). It never
    blocks a barrier and never disappears silently. I/O errors (network, permissions, a file that vanished)
    are not corruption: they raise :class:`~pipeline.exceptions.SourceError` naming the file.

Barriers
    Barrier n of a partition is the position of the first row with ``_ingest_ts >= end of epoch n``.
    Rows whose ``_ingest_ts`` is null or unusable never start a barrier (they stay with the rows before
    them; the reader dead-letters them).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.checkpoint.handles import Position
from pipeline.exceptions import ObjectNotFoundError, SourceError, StorageError
from pipeline.source._formats import CONTENT_ERRORS, NO_TS, TS_US, TypeMismatch, cast_lenient, ingest_us, read_jsonl
from pipeline.source.layout import SourceFile, SourceFormat

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.fileio import FileIO

__all__ = [
    "FileStatus", "RowGroupStats", "FileSummary", "Split", "Segment", "SPLIT_SCHEMA", "SPLIT_DDL",
    "summarize_file", "summarize_files", "summarize_source", "clear_summary_cache",
    "normalize_position", "barrier_position", "barrier_or_idle", "resolve_barrier", "barrier_positions", "end_position", "end_positions",
    "count_rows", "plan_segment", "plan_segments", "allocate_records", "splits_table",
]

INGEST_TS = "_ingest_ts"

SPLIT_SCHEMA = pa.schema([
    pa.field("source", pa.string()), pa.field("partition", pa.int32()), pa.field("seq", pa.int64()),
    pa.field("uri", pa.string()), pa.field("format", pa.string()), pa.field("row_start", pa.int64()),
    pa.field("row_end", pa.int64()),  # null: whole file, unreadable when planned
])
SPLIT_DDL = ("source string, partition int, seq bigint, uri string, format string, "
             "row_start bigint, row_end bigint")


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


@dataclass(frozen=True, slots=True, order=True)
class Split:
    """Rows ``[row_start, row_end)`` of one source file; ``row_end=None`` = whole (unreadable) file."""

    source: str
    partition: int
    seq: int
    uri: str
    format: SourceFormat
    row_start: int
    row_end: int | None

    @property
    def rows(self) -> int:
        return 0 if self.row_end is None else self.row_end - self.row_start

    def as_dict(self) -> dict:
        return {"source": self.source, "partition": self.partition, "seq": self.seq, "uri": self.uri,
                "format": self.format, "row_start": self.row_start, "row_end": self.row_end}

    @classmethod
    def from_dict(cls, d: Mapping) -> "Split":
        return cls(str(d["source"]), int(d["partition"]), int(d["seq"]), str(d["uri"]), d["format"],
                   int(d["row_start"]), None if d.get("row_end") is None else int(d["row_end"]))


@dataclass(frozen=True, slots=True)
class Segment:
    """What one round reads from one partition: ``splits`` cover ``[start, reached)`` within ``[start, stop)``."""

    source: str
    partition: int
    start: Position
    stop: Position
    reached: Position
    splits: tuple[Split, ...]
    records: int  # rows in the splits
    backlog: int  # rows in [reached, stop) still to read in later rounds

    @property
    def done(self) -> bool:
        return _key(self.reached) == _key(self.stop)


def splits_table(splits: Iterable[Split]) -> pa.Table:
    """Splits as an Arrow table with :data:`SPLIT_SCHEMA` (the input of the reader)."""
    rows = [s.as_dict() for s in splits]
    return pa.Table.from_pylist(rows, schema=SPLIT_SCHEMA)


# ----------------------------------------------------------------------------------------------------
# Summaries (cached per process; files are immutable)
# ----------------------------------------------------------------------------------------------------
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


def _where(f: SourceFile) -> str:
    return f"{f.uri} (source {f.source}, partition {f.partition}, seq {f.seq})"


def _io_for(f: SourceFile, fileio: "FileIO | None") -> "FileIO":
    if fileio is not None:
        return fileio
    from pipeline.fileio import file_io_for

    return file_io_for(f.uri)


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
    if isinstance(e, ObjectNotFoundError):
        return SourceError(f"source file disappeared (source files must never be deleted or replaced): {_where(f)}")
    return SourceError(f"cannot read source file {_where(f)}: {e}")


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


def _summarize_parquet(f: SourceFile, fio: "FileIO") -> FileSummary:
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
    exact = all(g.min_ts is not None for g in known)
    lo = min((g.min_ts for g in known), default=None) if exact else None
    hi = max((g.max_ts for g in known), default=None) if exact else None
    return FileSummary(f, FileStatus.OK, rows, lo, hi, tuple(groups))


def _summarize_jsonl(f: SourceFile, fio: "FileIO") -> FileSummary:
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


def summarize_file(file: SourceFile, *, fileio: "FileIO | None" = None) -> FileSummary:
    """Summary of one file (cached by ``(uri, size)``)."""
    key = (file.uri, file.size)
    with _lock:
        hit = _summaries.get(key)
        if hit is not None:
            _summaries.move_to_end(key)
            return hit if hit.file == file else _rebind(hit, file)
    fio = _io_for(file, fileio)
    summary = _summarize_parquet(file, fio) if file.format == "parquet" else _summarize_jsonl(file, fio)
    with _lock:
        _summaries[key] = summary
        while len(_summaries) > _CACHE_MAX:
            _summaries.popitem(last=False)
    return summary


def _rebind(s: FileSummary, f: SourceFile) -> FileSummary:
    return FileSummary(f, s.status, s.rows, s.min_ts, s.max_ts, s.row_groups, s.error)


def summarize_files(files: Sequence[SourceFile], *, fileio: "FileIO | None" = None,
                    max_workers: int = 8) -> tuple[FileSummary, ...]:
    """Summaries of ``files`` in the same order (footers read in parallel threads)."""
    if len(files) <= 1 or max_workers <= 1:
        return tuple(summarize_file(f, fileio=fileio) for f in files)
    with ThreadPoolExecutor(max_workers=min(max_workers, len(files))) as pool:
        return tuple(pool.map(lambda f: summarize_file(f, fileio=fileio), files))


def summarize_source(files_by_partition: Mapping[int, Sequence[SourceFile]], *,
                     since: Mapping[int, Position] | None = None, fileio: "FileIO | None" = None,
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


# ----------------------------------------------------------------------------------------------------
# Positions
# ----------------------------------------------------------------------------------------------------
def _key(p: Position) -> tuple[int, int]:
    return (p.seq, p.row)


def _ordered(summaries: Sequence[FileSummary]) -> list[FileSummary]:
    out = sorted(summaries, key=lambda s: s.seq)
    for a, b in zip(out, out[1:]):
        if a.seq == b.seq:
            raise SourceError(f"two summaries for seq {a.seq}: {a.uri} and {b.uri}")
        if (a.file.source, a.file.partition) != (b.file.source, b.file.partition):
            raise SourceError(f"summaries of different partitions mixed: {a.uri} and {b.uri}")
    return out


def _normalize(by_seq: Mapping[int, FileSummary], pos: Position, where: str) -> Position:
    while True:
        s = by_seq.get(pos.seq)
        if pos.row < 0 or pos.seq < 0:
            raise SourceError(f"invalid position ({pos.seq}, {pos.row}) in {where}")
        if s is None or s.corrupt:
            if pos.row != 0:
                what = "an unreadable file" if s is not None else "a file that does not exist"
                raise SourceError(f"position ({pos.seq}, {pos.row}) in {where} points into {what}"
                                  + (f": {s.uri}" if s is not None else ""))
            return pos
        if pos.row > s.rows:
            raise SourceError(f"position ({pos.seq}, {pos.row}) is beyond the end of {_where(s.file)} "
                              f"({s.rows} rows): was the file replaced?")
        if pos.row < s.rows:
            return pos
        pos = Position(seq=pos.seq + 1, row=0)


def _where_part(summaries: Sequence[FileSummary], source: str | None = None,
                partition: int | None = None) -> str:
    if summaries:
        f = summaries[0].file
        return f"source {f.source}, partition {f.partition}"
    return f"source {source}, partition {partition}"


def normalize_position(summaries: Sequence[FileSummary], pos: Position) -> Position:
    """``(seq, rows_in_file)`` -> ``(seq + 1, 0)``, repeatedly (empty files); validates the position."""
    ordered = _ordered(summaries)
    return _normalize({s.seq: s for s in ordered}, pos, _where_part(ordered))


def _read_group_ts(s: FileSummary, group: int, fileio: "FileIO | None") -> np.ndarray:
    key = (s.uri, s.file.size, group)
    with _lock:
        hit = _ts_arrays.get(key)
    if hit is not None:
        return hit
    f = s.file
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


def _first_at_or_after(s: FileSummary, boundary_us: int, fileio: "FileIO | None") -> int | None:
    offset = 0
    for gi, g in enumerate(s.row_groups):
        if g.rows == 0:
            continue
        if g.min_ts is not None and g.max_ts is not None:
            if g.max_ts < boundary_us:
                offset += g.rows
                continue
            if g.min_ts >= boundary_us and g.nulls == 0:
                return offset
        elif g.nulls == g.rows:
            offset += g.rows
            continue
        ts = _read_group_ts(s, gi, fileio)
        hits = np.flatnonzero(ts >= boundary_us)
        if len(hits):
            return offset + int(hits[0])
        offset += g.rows
    return None


def barrier_position(summaries: Sequence[FileSummary], boundary_us: int, *,
                     fileio: "FileIO | None" = None) -> Position | None:
    """Position of the first row with ``_ingest_ts >= boundary_us``; None if the partition has none yet.

    With None the caller decides, from the clock and the allowed lateness, whether the partition is idle
    (then barrier = :func:`end_position`) or lagging (wait).
    """
    for s in _ordered(summaries):
        if s.corrupt or s.rows == 0:
            continue
        if s.max_ts is not None and s.max_ts < boundary_us:
            continue
        row = _first_at_or_after(s, boundary_us, fileio)
        if row is not None:
            return Position(seq=s.seq, row=row)
    return None


def end_position(summaries: Sequence[FileSummary]) -> Position:
    """The position after the last available row (after the last file): ``(last seq + 1, 0)``."""
    if not summaries:
        return Position(seq=0, row=0)
    return Position(seq=max(s.seq for s in summaries) + 1, row=0)


def barrier_or_idle(summaries: Sequence[FileSummary], boundary_us: int, *, now_us: int,
                    allowed_lateness_us: int = 0, fileio: "FileIO | None" = None) -> tuple[Position | None, bool]:
    """The one lag/idle rule of the epoch contract: ``(barrier, idle)`` of one partition.

    The first row with ``_ingest_ts >= boundary_us`` if there is one (``idle`` False); otherwise, once the clock
    has passed ``boundary_us + allowed_lateness_us``, the partition is idle and its barrier is
    :func:`end_position` (``idle`` True); before that it lags: ``(None, False)``.
    """
    pos = barrier_position(summaries, boundary_us, fileio=fileio)
    if pos is not None:
        return pos, False
    if now_us >= boundary_us + allowed_lateness_us:
        return end_position(summaries), True
    return None, False


def resolve_barrier(summaries: Sequence[FileSummary], boundary_us: int, *, now_us: int,
                    allowed_lateness_us: int = 0, fileio: "FileIO | None" = None) -> Position | None:
    """Barrier of one partition per the epoch contract, or None while the partition lags
    (:func:`barrier_or_idle` without the idle flag)."""
    return barrier_or_idle(summaries, boundary_us, now_us=now_us, allowed_lateness_us=allowed_lateness_us,
                           fileio=fileio)[0]


def barrier_positions(summaries_by_partition: Mapping[int, Sequence[FileSummary]], boundary_us: int, *,
                      fileio: "FileIO | None" = None) -> dict[int, Position | None]:
    return {p: barrier_position(s, boundary_us, fileio=fileio) for p, s in sorted(summaries_by_partition.items())}


def end_positions(summaries_by_partition: Mapping[int, Sequence[FileSummary]]) -> dict[int, Position]:
    return {p: end_position(s) for p, s in sorted(summaries_by_partition.items())}


# ----------------------------------------------------------------------------------------------------
# Segments
# ----------------------------------------------------------------------------------------------------
def _bounds(ordered: list[FileSummary], start: Position, stop: Position,
            source: str | None, partition: int | None) -> tuple[Position, Position, str]:
    where = _where_part(ordered, source, partition)
    if _key(start) == _key(stop):
        # an empty range reads nothing: its files need not be listed (a savepoint or restore of a checkpoint
        # whose barrier lies inside a file has no summary of that file, since everything before it was read)
        return start, stop, where
    by_seq = {s.seq: s for s in ordered}
    a = _normalize(by_seq, start, where)
    b = _normalize(by_seq, stop, where)
    if _key(b) < _key(a):
        raise SourceError(f"segment stop ({stop.seq}, {stop.row}) is before start ({start.seq}, {start.row}) "
                          f"in {where}")
    return a, b, where


def _range_in(s: FileSummary, a: Position, b: Position) -> tuple[int, int] | None:
    """Row range of file ``s`` inside ``[a, b)``; None if the file is outside (corrupt: (0, 0) slot)."""
    if s.seq < a.seq or s.seq > b.seq or (s.seq == b.seq and b.row == 0):
        return None
    lo = a.row if s.seq == a.seq else 0
    hi = b.row if s.seq == b.seq else s.rows
    return lo, max(lo, hi)


def count_rows(summaries: Sequence[FileSummary], start: Position, stop: Position) -> int:
    """Rows in ``[start, stop)`` (corrupt files count zero)."""
    ordered = _ordered(summaries)
    a, b, _ = _bounds(ordered, start, stop, None, None)
    total = 0
    for s in ordered:
        r = _range_in(s, a, b)
        if r is not None and not s.corrupt:
            total += r[1] - r[0]
    return total


def plan_segment(summaries: Sequence[FileSummary], start: Position, stop: Position, max_records: int, *,
                 source: str | None = None, partition: int | None = None) -> Segment:
    """Splits covering rows in ``[start, stop)``, at most ``max_records`` rows.

    Unreadable files in the range cost nothing and are included as whole-file splits (``row_end=None``)
    when the segment reaches them. ``reached`` is where the next round starts; ``reached == stop`` when
    everything before ``stop`` is planned (``Segment.done``).
    """
    if max_records < 0:
        raise ValueError("max_records must be >= 0")
    ordered = _ordered(summaries)
    if ordered:
        source = ordered[0].file.source
        partition = ordered[0].file.partition
    if source is None or partition is None:
        raise ValueError("plan_segment needs source= and partition= when there are no summaries")
    a, b, _where_p = _bounds(ordered, start, stop, source, partition)
    budget = max_records
    splits: list[Split] = []
    taken = 0
    total = 0
    reached = a
    capped = False
    for s in ordered:
        r = _range_in(s, a, b)
        if r is None:
            continue
        f = s.file
        if s.corrupt:
            if not capped:
                splits.append(Split(f.source, f.partition, f.seq, f.uri, f.format, 0, None))
                reached = Position(seq=f.seq + 1, row=0)
            continue
        lo, hi = r
        n = hi - lo
        total += n
        if capped or n == 0:
            if not capped:
                reached = Position(seq=f.seq + 1, row=0) if hi == s.rows else Position(seq=f.seq, row=hi)
            continue
        take = min(n, budget)
        if take > 0:
            splits.append(Split(f.source, f.partition, f.seq, f.uri, f.format, lo, lo + take))
            taken += take
            budget -= take
            reached = Position(seq=f.seq, row=lo + take)
        if take < n:
            capped = True
    backlog = total - taken
    if backlog == 0:
        reached = b
    else:
        reached = _normalize({s.seq: s for s in ordered}, reached, _where_p)
    return Segment(source, partition, a, b, reached, tuple(splits), taken, backlog)


def allocate_records(backlogs: Sequence[int] | np.ndarray, max_records: int) -> np.ndarray:
    """Share ``max_records`` between partitions (water-filling, deterministic).

    Every partition gets ``min(backlog, L)`` for the largest level ``L`` that fits; the remainder goes one
    record each to the lowest-indexed partitions that still have backlog.
    """
    b = np.asarray(backlogs, dtype=np.int64)
    if max_records < 0:
        raise ValueError("max_records must be >= 0")
    if b.sum() <= max_records:
        return b.copy()
    s = np.sort(b)
    n = len(s)
    prefix = np.concatenate([[0], np.cumsum(s)])
    # level L such that sum(min(b, L)) <= max_records: try each sorted prefix as "fully served"
    level = 0
    for i in range(n):
        need = prefix[i] + s[i] * (n - i)
        if need > max_records:
            level = (max_records - prefix[i]) // (n - i)
            break
    alloc = np.minimum(b, level)
    rest = max_records - int(alloc.sum())
    if rest > 0:
        more = np.flatnonzero(b > alloc)[:rest]
        alloc[more] += 1
    return alloc


def plan_segments(summaries_by_partition: Mapping[int, Sequence[FileSummary]],
                  starts: Mapping[int, Position], stops: Mapping[int, Position], max_records: int, *,
                  source: str, per_partition: bool = False) -> dict[int, Segment]:
    """Segments of many partitions of one source at once.

    ``max_records`` caps the whole input (``PIPELINE_MAX_RECORDS_PER_EPOCH`` is per input per round) and is
    shared with :func:`allocate_records`; with ``per_partition=True`` it caps each partition instead.
    Partitions are those of ``stops``; a partition missing from ``starts`` starts at ``(0, 0)``.
    """
    parts = sorted(stops)
    empty: tuple[FileSummary, ...] = ()
    backlogs = np.array([count_rows(summaries_by_partition.get(p, empty), starts.get(p, Position(seq=0, row=0)),
                                    stops[p]) for p in parts], dtype=np.int64)
    alloc = (np.minimum(backlogs, max_records) if per_partition
             else allocate_records(backlogs, max_records)) if len(parts) else backlogs
    return {p: plan_segment(summaries_by_partition.get(p, empty), starts.get(p, Position(seq=0, row=0)),
                            stops[p], int(alloc[i]), source=source, partition=p)
            for i, p in enumerate(parts)}
