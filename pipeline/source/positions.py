"""Positions in a source partition, and the barrier rule of the epoch contract (driver side).

Positions
    A :class:`~pipeline.checkpoint.handles.Position` ``(seq, row)`` is the *next row to read* in a
    partition: every row of files with a smaller seq, and rows ``< row`` of file ``seq``, come before it.
    ``(seq, rows_in_file)`` normalises to ``(seq + 1, 0)`` ("just after file seq"). This does not depend on
    which later files exist, so a position written ahead (barrier log, pending manifest) never changes
    meaning when more files arrive. The very first position of a partition is ``(0, 0)``.

Barriers
    Barrier n of a partition is the position of the first row with ``_ingest_ts >= end of epoch n``.
    Rows whose ``_ingest_ts`` is null or unusable never start a barrier (they stay with the rows before
    them; the reader dead-letters them). :func:`barrier_or_idle` is the one lag/idle rule.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from pipeline.checkpoint.handles import Position
from pipeline.exceptions import SourceError
from pipeline.source import summary
from pipeline.source.summary import FileSummary, file_label

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.fileio import FileIO

__all__ = ["position_key", "ordered_summaries", "normalize_in", "normalize_position", "partition_label",
           "barrier_position", "barrier_or_idle", "resolve_barrier", "barrier_positions", "end_position",
           "end_positions"]


def position_key(p: Position) -> tuple[int, int]:
    return (p.seq, p.row)


def ordered_summaries(summaries: Sequence[FileSummary]) -> list[FileSummary]:
    out = sorted(summaries, key=lambda s: s.seq)
    for a, b in zip(out, out[1:]):
        if a.seq == b.seq:
            raise SourceError(f"two summaries for seq {a.seq}: {a.uri} and {b.uri}")
        if (a.file.source, a.file.partition) != (b.file.source, b.file.partition):
            raise SourceError(f"summaries of different partitions mixed: {a.uri} and {b.uri}")
    return out


def normalize_in(by_seq: Mapping[int, FileSummary], pos: Position, where: str) -> Position:
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
            raise SourceError(f"position ({pos.seq}, {pos.row}) is beyond the end of {file_label(s.file)} "
                              f"({s.rows} rows): was the file replaced?")
        if pos.row < s.rows:
            return pos
        pos = Position(seq=pos.seq + 1, row=0)


def partition_label(summaries: Sequence[FileSummary], source: str | None = None,
                partition: int | None = None) -> str:
    if summaries:
        f = summaries[0].file
        return f"source {f.source}, partition {f.partition}"
    return f"source {source}, partition {partition}"


def normalize_position(summaries: Sequence[FileSummary], pos: Position) -> Position:
    """``(seq, rows_in_file)`` -> ``(seq + 1, 0)``, repeatedly (empty files); validates the position."""
    ordered = ordered_summaries(summaries)
    return normalize_in({s.seq: s for s in ordered}, pos, partition_label(ordered))



def _first_at_or_after(s: FileSummary, boundary_us: int, fileio: FileIO | None) -> int | None:
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
        ts = summary.read_group_ts(s, gi, fileio)
        hits = np.flatnonzero(ts >= boundary_us)
        if len(hits):
            return offset + int(hits[0])
        offset += g.rows
    return None


def barrier_position(summaries: Sequence[FileSummary], boundary_us: int, *,
                     fileio: FileIO | None = None) -> Position | None:
    """Position of the first row with ``_ingest_ts >= boundary_us``; None if the partition has none yet.

    With None the caller decides, from the clock and the allowed lateness, whether the partition is idle
    (then barrier = :func:`end_position`) or lagging (wait).
    """
    for s in ordered_summaries(summaries):
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
                    allowed_lateness_us: int = 0, fileio: FileIO | None = None) -> tuple[Position | None, bool]:
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
                    allowed_lateness_us: int = 0, fileio: FileIO | None = None) -> Position | None:
    """Barrier of one partition per the epoch contract, or None while the partition lags
    (:func:`barrier_or_idle` without the idle flag)."""
    return barrier_or_idle(summaries, boundary_us, now_us=now_us, allowed_lateness_us=allowed_lateness_us,
                           fileio=fileio)[0]


def barrier_positions(summaries_by_partition: Mapping[int, Sequence[FileSummary]], boundary_us: int, *,
                      fileio: FileIO | None = None) -> dict[int, Position | None]:
    return {p: barrier_position(s, boundary_us, fileio=fileio) for p, s in sorted(summaries_by_partition.items())}


def end_positions(summaries_by_partition: Mapping[int, Sequence[FileSummary]]) -> dict[int, Position]:
    return {p: end_position(s) for p, s in sorted(summaries_by_partition.items())}
