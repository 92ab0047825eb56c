"""Rows committed twice for one epoch: the row-level check of the committed output's lineage.

``epochal_committed_files`` finds an epoch's output committed twice only when the same *bytes* are committed
again. A re-emission written with another parallelism (a restore or savepoint at P=3 re-completing an epoch
first committed at P=2) holds the same *rows* split differently into files: other bytes, other checksums. For an
append sink the recovery suites see it (the rows are counted twice against the batch evaluation), but an upsert
sink's readers resolve the newest row per key, so the same rows committed twice look like one, and a sink the
batch evaluation does not model is not compared at all.

The rule (any sink mode, modelled or not): on the commit lineage readers see, every epoch is committed once. A
later commit of an epoch that already has a commit - a restore point or a savepoint re-completes the epoch of the
checkpoint it starts from, with no new input - commits no row that an earlier commit of that epoch holds. Rows are
compared as a multiset over all columns (floats in cents, a null equal to a null,
:func:`pipeline.quality.rowdiff.row_overlap`).

Cost: only commits of an epoch committed more than once, with rows on both sides, are read; on a lineage without
restores or savepoints nothing is read. A commit whose checkpoint is no longer known (deleted by retention) has
no known epoch: reported in the figures, not compared. A ``full`` upsert commit restates the table and is not
compared.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from pipeline.quality.collect_base import MAX_EXAMPLES
from pipeline.quality.rowdiff import row_overlap

__all__ = ["CommittedRows", "committed_rows", "COLUMNS"]

COLUMNS = ["table", "commit_id", "epoch", "rows", "earlier_commits", "duplicate_rows"]


@dataclass
class CommittedRows:
    """The ``committed_rows`` dataset's records, example rows of the duplicates and what could not be compared."""

    records: list[dict] = field(default_factory=list)
    examples: list[dict] = field(default_factory=list)
    unknown_epoch: list[str] = field(default_factory=list)   # "<table>@<commit id>": checkpoint not known
    files_read: int = 0


def committed_rows(views: Mapping[str, Sequence[Any]], epoch_of: Mapping[int, int],
                   read: Callable[[str], pa.Table]) -> CommittedRows:
    """``views``: per sink table, the commit entries readers see, in lineage order
    (:class:`~pipeline.sink.table.CommitEntry`); ``epoch_of``: checkpoint id -> epoch of every known checkpoint
    or savepoint; ``read(uri)``: a committed Parquet file. One record per commit with a known epoch."""
    out = CommittedRows()
    cache: dict[str, pa.Table] = {}

    def rows_of(entry) -> pa.Table:
        parts = []
        for f in entry.files:
            if f.uri not in cache:
                cache[f.uri] = read(f.uri)
                out.files_read += 1
            parts.append(cache[f.uri])
        return pa.concat_tables(parts, promote_options="permissive") if len(parts) > 1 else parts[0]

    for table, view in sorted(views.items()):
        seen: dict[int, list] = {}          # epoch -> earlier commits of it (with rows)
        for e in view:
            epoch = epoch_of.get(e.checkpoint_id)
            if epoch is None:
                out.unknown_epoch.append(f"{table}@{e.checkpoint_id}")
                continue
            earlier = [x for x in seen.get(epoch, []) if x.rows]
            dup: int | None = 0
            if e.rows and earlier and not e.full:
                later_rows = rows_of(e)
                dup = 0
                for x in earlier:
                    ov = row_overlap(later_rows, rows_of(x))
                    dup += ov["rows"]
                    out.examples += [{"table": table, "epoch": epoch, "commit_id": e.checkpoint_id,
                                      "also_in_commit": x.checkpoint_id, **r} for r in ov["examples"]]
            out.records.append({"table": table, "commit_id": e.checkpoint_id, "epoch": epoch, "rows": e.rows,
                                "earlier_commits": ",".join(str(x.checkpoint_id) for x in seen.get(epoch, [])) or None,
                                "duplicate_rows": dup})
            if not e.full:
                seen.setdefault(epoch, []).append(e)
    out.examples = out.examples[:MAX_EXAMPLES]
    return out
