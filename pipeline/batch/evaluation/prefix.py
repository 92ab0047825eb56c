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

**Unaligned checkpoints with pending channel state** (``Prefix.consumed``): the rows before the checkpoint's restore
positions, not its barriers - the rest of the pre-barrier data (in-flight files and source ranges) is consumed by
later checkpoints, so it is in neither the checkpoint's state nor its committed output (docs/batch.md "Prefix").

Reading a prefix: :mod:`pipeline.batch.evaluation.source_read`.
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from pipeline.checkpoint.channel import partition_of
from pipeline.exceptions import StorageError
from pipeline.layout import JobLayout
from pipeline.layout.logs import BARRIER_LOG_NAME, LAG_LOG_NAME

__all__ = ["Prefix", "PEPOCH", "scan_settings", "SCAN_TASKS_PER_SUBTASK", "ordinal", "processing_epochs", "barrier_log", "lag_log"]


PEPOCH = "_pepoch"          # processing epoch of a row (see the module docstring)

_EPOCH_FILE = BARRIER_LOG_NAME

_BIG = 1 << 62

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
    root = JobLayout(job_root).barriers()
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
        out[int(m.group(1))] = {s: {partition_of(p): (int(v["seq"]), int(v["row"])) for p, v in parts.items()}
                                for s, parts in doc.get("barriers", {}).items()}
    return out


_LAG_FILE = LAG_LOG_NAME


def lag_log(ckpt_fio, job_root: str, upto: int, upto_id: int | None) -> dict[int, dict[str, dict[int, tuple[int, int]]]]:
    """Per epoch ``m < upto`` that a checkpoint completed while a partition lagged (so ``m`` is not in the barrier
    log): where that checkpoint stopped reading each partition (``barriers/lagged/epoch-<m>-chk-<id>.json``,
    written by the runtime before the checkpoint's last round; ``BarrierLog.log_lagged``). The runtime tags the rows
    a checkpoint of epoch ``m`` reads past every logged barrier with ``m`` (a lagging partition's, and an unlogged
    epoch's), so these positions act as barriers of epoch ``m`` (docs/batch.md "Lagging partitions"). Among the
    attempts of an epoch, the newest whose id is at most ``upto_id`` (the validated checkpoint's lineage, as the
    round log); None: the newest."""
    root = JobLayout(job_root).lag_log()
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
        out[ep] = {s: {partition_of(p): (int(v["seq"]), int(v["row"])) for p, v in parts.items()}
                   for s, parts in doc.get("read", {}).items()}
    return out
