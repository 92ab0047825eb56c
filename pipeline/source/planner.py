"""Bounded segments (driver side): which rows of each source partition one round reads, as splits.

A :class:`Segment` covers ``[start, reached)`` of ``[start, stop)`` in one partition, at most a record budget;
:func:`allocate_records` shares a round's budget over partitions by backlog. Positions and summaries are in
:mod:`pipeline.source.positions` and :mod:`pipeline.source.summary`.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from pipeline.checkpoint.handles import Position
from pipeline.exceptions import SourceError
from pipeline.source.layout import SourceFormat
from pipeline.source.positions import normalize_in, ordered_summaries, partition_label, position_key
from pipeline.source.summary import FileSummary

__all__ = ["Split", "Segment", "SPLIT_SCHEMA", "SPLIT_DDL", "count_rows", "plan_segment", "plan_segments",
           "allocate_records", "splits_table"]

SPLIT_SCHEMA = pa.schema([
    pa.field("source", pa.string()), pa.field("partition", pa.int32()), pa.field("seq", pa.int64()),
    pa.field("uri", pa.string()), pa.field("format", pa.string()), pa.field("row_start", pa.int64()),
    pa.field("row_end", pa.int64()),  # null: whole file, unreadable when planned
    pa.field("ingest_ts", pa.int64()),  # a lake file's commit time (µs), null: the file's own column
])
SPLIT_DDL = ("source string, partition int, seq bigint, uri string, format string, "
             "row_start bigint, row_end bigint, ingest_ts bigint")


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
    ingest_ts: int | None = None  # a lake file (pipeline/source/lake.py): every row's _ingest_ts, µs

    @property
    def rows(self) -> int:
        return 0 if self.row_end is None else self.row_end - self.row_start

    def as_dict(self) -> dict:
        return {"source": self.source, "partition": self.partition, "seq": self.seq, "uri": self.uri,
                "format": self.format, "row_start": self.row_start, "row_end": self.row_end,
                "ingest_ts": self.ingest_ts}

    @classmethod
    def from_dict(cls, d: Mapping) -> Split:
        return cls(str(d["source"]), int(d["partition"]), int(d["seq"]), str(d["uri"]), d["format"],
                   int(d["row_start"]), None if d.get("row_end") is None else int(d["row_end"]),
                   None if d.get("ingest_ts") is None else int(d["ingest_ts"]))


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
        return position_key(self.reached) == position_key(self.stop)


def splits_table(splits: Iterable[Split]) -> pa.Table:
    """Splits as an Arrow table with :data:`SPLIT_SCHEMA` (the input of the reader)."""
    rows = [s.as_dict() for s in splits]
    return pa.Table.from_pylist(rows, schema=SPLIT_SCHEMA)


def _bounds(ordered: list[FileSummary], start: Position, stop: Position,
            source: str | None, partition: int | None) -> tuple[Position, Position, str]:
    where = partition_label(ordered, source, partition)
    if position_key(start) == position_key(stop):
        # an empty range reads nothing: its files need not be listed (a savepoint or restore of a checkpoint
        # whose barrier lies inside a file has no summary of that file, since everything before it was read)
        return start, stop, where
    by_seq = {s.seq: s for s in ordered}
    a = normalize_in(by_seq, start, where)
    b = normalize_in(by_seq, stop, where)
    if position_key(b) < position_key(a):
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
    ordered = ordered_summaries(summaries)
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
    ordered = ordered_summaries(summaries)
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
                splits.append(Split(f.source, f.partition, f.seq, f.uri, f.format, 0, None, f.ingest_ts))
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
            splits.append(Split(f.source, f.partition, f.seq, f.uri, f.format, lo, lo + take, f.ingest_ts))
            taken += take
            budget -= take
            reached = Position(seq=f.seq, row=lo + take)
        if take < n:
            capped = True
    backlog = total - taken
    if backlog == 0:
        reached = b
    else:
        reached = normalize_in({s.seq: s for s in ordered}, reached, _where_p)
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
