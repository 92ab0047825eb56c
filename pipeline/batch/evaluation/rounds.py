"""Processing rounds: in which round of its checkpoint the runtime consumed a source row.

A checkpoint whose epoch has a backlog (more than ``PIPELINE_MAX_RECORDS_PER_EPOCH`` rows of an input) takes
several rounds. Before round ``k >= 1`` reads anything, the runtime logs where it starts, per source partition
(``<checkpoint root>/<job>/barriers/rounds/epoch-<m>-chk-<id>-r<k>.json``, beside the barrier log and, like
it, never deleted by retention). A row ``x`` of processing epoch ``p(x) = m`` was consumed in round

    r(x) = #{ k >= 1 : start_k(partition of x) <= position of x }

of the checkpoint that processed epoch ``m`` in the validated lineage: among the logged checkpoints of epoch
``m``, the newest whose id is at most the validated checkpoint's (a re-run of an epoch after a crash or a
rewind gets a higher id; its rounds are cut the same way from the same barriers and settings). An epoch with
no logged round took one round: ``r(x) = 0``.

Round 0 of an unaligned checkpoint that processes a new epoch is logged too (``-r0.json``, session 11): it starts
where the previous checkpoint stopped reading, not at a barrier, and after a backlog drain a deduplicate follows
the *consumption* order (checkpoint, round) rather than ``(p(x), r(x))`` (:func:`consumption_task`).

Only the operators whose result depends on round boundaries read it (``deduplicate``: "the first row of its
key" is decided per round, docs/operators.md); everything else in the batch evaluation is a function of
``p(x)`` alone.

**Rows an operator emits** (a dedup fed by a join's output): in an aligned lineage every round of checkpoint ``m``
expires state with the same cutoff ``end(m) - ttl``, so a join emits

* a pair ``(l, r)`` in the round its later row arrives: ``(p, r)`` of the pair = the larger of ``(p(l), r(l))``
  and ``(p(r), r(r))`` (lexicographic; :func:`pair_round`);
* an unmatched outer row either on arrival (it is already past its cutoff: its emission epoch
  ``max(p(x), floor((t_x + ttl) / E))`` is ``p(x)``) in its own round ``r(x)``, or when it expires, in the first
  round - round 0 - of the checkpoint of its emission epoch (:func:`emitted_round`);

and a deduplicate passes a row on in the round it consumed it (its ``r`` is carried). A window (``emit="final"``, the
only window whose output an operator may read) fires in the round that completes the checkpoint of its firing epoch
(docs/windows.md "Runtime"): the last logged round of that checkpoint (:func:`fired_round`). The plan carries
:data:`ROUND` beside ``_pepoch`` through selects, joins and deduplicates (docs/batch.md "deduplicate").
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from pipeline.checkpoint.channel import partition_of
from pipeline.exceptions import StorageError
from pipeline.layout import JobLayout
from pipeline.layout.logs import ROUND_LOG_NAME

__all__ = ["RoundLog", "read_round_log", "round_task", "consumption_task", "pair_round", "emitted_round", "fired_round",
           "ROUND", "CONSUMED", "CONSUMED_ROUND"]

ROUND = "__round"          # the batch plan's column: r(x)
CONSUMED, CONSUMED_ROUND = "__ce", "__cr"   # the epoch of the checkpoint that consumed a row, and its round
_ROUND_FILE = ROUND_LOG_NAME


@dataclass(frozen=True)
class RoundLog:
    """Round starts of the lineage: ``starts[m][k-1][source][partition] = (seq, row)`` for rounds ``k >= 1`` of
    the checkpoint that processed epoch ``m``; ``checkpoints[m]`` its id."""

    starts: Mapping[int, tuple[Mapping[str, Mapping[int, tuple[int, int]]], ...]] = field(default_factory=dict)
    checkpoints: Mapping[int, int] = field(default_factory=dict)
    # round 0's starts of the unaligned checkpoints (logged since session 11): ``zero[m][source][partition]``
    zero: Mapping[int, Mapping[str, Mapping[int, tuple[int, int]]]] = field(default_factory=dict)

    @property
    def multi_round_epochs(self) -> tuple[int, ...]:
        return tuple(sorted(m for m, s in self.starts.items() if s))

    def ordinals(self) -> dict[tuple[str, int, int], np.ndarray]:
        """``(source, partition, epoch) -> sorted start ordinals`` of its rounds ``1..k``."""
        out: dict[tuple[str, int, int], np.ndarray] = {}
        for m, rounds in self.starts.items():
            keys = {(s, p) for r in rounds for s, parts in r.items() for p in parts}
            for s, p in keys:
                # one start per round k = 1..K (a partition missing from a round's log - the runtime logs every
                # channel - takes its neighbour's start: that round read nothing of it)
                ords: list[int | None] = [(int(r[s][p][0]) << 32) + int(r[s][p][1]) if p in r.get(s, {}) else None
                                          for r in rounds]
                known = [o for o in ords if o is not None]
                filled, last = [], known[0]
                for o in ords:
                    last = o if o is not None else last
                    filled.append(last)
                out[(s, p, m)] = np.maximum.accumulate(np.asarray(filled, np.int64))
        return out


def read_round_log(ckpt_fio, job_root: str, *, upto_epoch: int, upto_id: int | None) -> RoundLog:
    """The round log of the lineage of checkpoint ``upto_id`` (epochs ``<= upto_epoch``; ``upto_id`` None: every
    logged checkpoint). One LIST of ``barriers/rounds/``, then the documents of the chosen checkpoints."""
    root = JobLayout(job_root).round_log()
    try:
        files = ckpt_fio.list(root, recursive=True)
    except StorageError:
        return RoundLog()
    found: dict[int, dict[int, dict[int, str]]] = {}      # epoch -> checkpoint id -> round -> uri
    for f in files:
        m = _ROUND_FILE.search(f.uri)
        if not m:
            continue
        epoch, cid, rnd = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if epoch > upto_epoch or (upto_id is not None and cid > upto_id):
            continue
        found.setdefault(epoch, {}).setdefault(cid, {})[rnd] = f.uri
    starts: dict[int, tuple] = {}
    chosen: dict[int, int] = {}
    zero: dict[int, dict] = {}

    def doc_of(uri: str) -> dict:
        doc = json.loads(ckpt_fio.read_bytes(uri))
        return {s: {partition_of(p): (int(v["seq"]), int(v["row"])) for p, v in parts.items()}
                for s, parts in doc["starts"].items()}
    for epoch, by_id in found.items():
        cid = max(by_id)
        rounds = by_id[cid]
        docs = []
        for k in range(1, max(rounds) + 1):
            if k not in rounds:   # a gap: the log of this checkpoint is incomplete; rounds after it are unusable
                break
            docs.append(doc_of(rounds[k]))
        if 0 in rounds:
            zero[epoch] = doc_of(rounds[0])
        starts[epoch] = tuple(docs)
        chosen[epoch] = cid
    return RoundLog(starts, chosen, zero)


def _segments(*cols):
    """The row indices of each distinct combination of ``cols`` (equal-length arrays): one sort of the rows, then one
    slice per combination - O(rows log rows) whatever the number of logged (source, partition, epoch) entries, where
    a mask per entry cost O(rows x entries) with many multi-round epochs."""
    n = len(cols[0])
    codes = [np.unique(np.asarray(c, dtype=object) if c.dtype == object else c, return_inverse=True) for c in cols]
    code = np.zeros(n, np.int64)
    for values, inv in codes:
        code = code * len(values) + inv.reshape(-1).astype(np.int64)
    order = np.argsort(code, kind="stable")
    cuts = np.flatnonzero(np.diff(code[order])) + 1
    for seg in np.split(order, cuts):
        if seg.size:
            first = seg[0]
            yield tuple(_py(values[inv.reshape(-1)[first]]) for values, inv in codes), seg


def _py(v):
    return v.item() if isinstance(v, np.generic) else v


def round_task(log: RoundLog):
    """The ``mapInArrow`` function appending :data:`ROUND` (``r(x)``) to rows with the position columns
    (``_source``, ``_partition``, ``_seq``, ``_row``) and ``_pepoch``."""
    import pyarrow as pa

    table = log.ordinals()

    def task(batches):
        for b in batches:
            n = b.num_rows
            r = np.zeros(n, np.int64)
            if n and table:
                src = np.asarray(b.column(b.schema.get_field_index("_source")).to_pylist(), dtype=object)
                part = b.column(b.schema.get_field_index("_partition")).to_numpy(zero_copy_only=False)
                pe = b.column(b.schema.get_field_index("_pepoch")).to_numpy(zero_copy_only=False)
                ords = ((b.column(b.schema.get_field_index("_seq")).to_numpy(zero_copy_only=False).astype(np.int64)
                         << 32) + b.column(b.schema.get_field_index("_row")).to_numpy(zero_copy_only=False)
                        .astype(np.int64))
                for (s, p, m), sel in _segments(src, part, pe):
                    starts = table.get((s, p, m))
                    if starts is not None:
                        r[sel] = np.searchsorted(starts, ords[sel], side="right")
            yield pa.RecordBatch.from_arrays(list(b.columns) + [pa.array(r, pa.int64())],
                                             names=list(b.schema.names) + [ROUND])

    return task


def pair_round(p_left, r_left, p_right, r_right):
    """The round (a Spark column) in which a join emits the pair of rows with own epochs ``p_*`` and rounds
    ``r_*``: the round of the later row, ``(p, r)`` compared lexicographically (the pair's epoch is the larger
    ``p``)."""
    from pyspark.sql import functions as F
    return (F.when(p_left > p_right, r_left).when(p_right > p_left, r_right)
            .otherwise(F.greatest(r_left, r_right)))


def emitted_round(emitted_at, p_row, r_row):
    """The round (a Spark column) in which a join emits an unmatched outer row of own epoch ``p_row`` and round
    ``r_row`` at its emission epoch ``emitted_at``: on arrival (``emitted_at == p_row``: already past its cutoff)
    in its own round, otherwise at expiry, in round 0 of the emission epoch's checkpoint (every round of an
    aligned checkpoint expires with the same cutoff, so the first one does)."""
    from pyspark.sql import functions as F
    return F.when(emitted_at == p_row, r_row).otherwise(F.lit(0).cast("long"))


def fired_round(log: RoundLog, epoch: int) -> int:
    """The round in which a window fires the windows of checkpoint ``epoch``: the round that completes the
    checkpoint, i.e. the last one of its logged rounds (0 when it took a single round)."""
    return len(log.starts.get(epoch, ()))


def consumption_task(log: RoundLog):
    """The ``mapInArrow`` function appending :data:`CONSUMED` and :data:`CONSUMED_ROUND`: the epoch of the checkpoint
    that consumed the row and the round in which it did, for a lineage whose unaligned checkpoints drained a backlog
    (docs/batch.md "deduplicate"). Per source partition, the logged starts of every round of the checkpoints with a
    logged round 0 (:attr:`RoundLog.zero`) are sorted by position; a row belongs to the last round starting at or
    before it (a round that read nothing of the partition starts where the next one does, and the later wins). A row
    before the first such start was consumed by an earlier checkpoint, which read its own epoch: ``(p(x), r(x))``
    (``r`` from :data:`ROUND` when present, else 0)."""
    import pyarrow as pa

    table: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    marks: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for m, first in log.zero.items():
        for k, doc in enumerate((first,) + tuple(log.starts.get(m, ()))):
            for s, parts in doc.items():
                for p, (seq, row) in parts.items():
                    marks.setdefault((s, int(p)), []).append(((int(seq) << 32) + int(row), m, k))
    for key, ms in marks.items():
        ms.sort()
        table[key] = (np.asarray([o for o, _, _ in ms], np.int64), np.asarray([m for _, m, _ in ms], np.int64),
                      np.asarray([k for _, _, k in ms], np.int64))

    def task(batches):
        for b in batches:
            n = b.num_rows
            names = b.schema.names
            ce = b.column(names.index("_pepoch")).to_numpy(zero_copy_only=False).astype(np.int64)
            cr = (b.column(names.index(ROUND)).to_numpy(zero_copy_only=False).astype(np.int64) if ROUND in names
                  else np.zeros(n, np.int64))
            ce, cr = ce.copy(), cr.copy()
            if n and table:
                src = np.asarray(b.column(names.index("_source")).to_pylist(), dtype=object)
                part = b.column(names.index("_partition")).to_numpy(zero_copy_only=False)
                ords = ((b.column(names.index("_seq")).to_numpy(zero_copy_only=False).astype(np.int64) << 32)
                        + b.column(names.index("_row")).to_numpy(zero_copy_only=False).astype(np.int64))
                for (s, p), sel in _segments(src, part):
                    if (s, p) not in table:
                        continue
                    starts, epochs, rounds = table[(s, p)]
                    if sel.size:
                        i = np.searchsorted(starts, ords[sel], side="right") - 1
                        hit = i >= 0
                        ce[sel[hit]], cr[sel[hit]] = epochs[i[hit]], rounds[i[hit]]
            yield pa.RecordBatch.from_arrays(list(b.columns) + [pa.array(ce, pa.int64()), pa.array(cr, pa.int64())],
                                             names=list(names) + [CONSUMED, CONSUMED_ROUND])

    return task
