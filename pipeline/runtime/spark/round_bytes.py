"""The bytes a round's tasks hold: measured bytes per row of every source, and the per-task budget of a tagged round.

A tagged round (several epochs in one Spark round, :mod:`pipeline.runtime.driver.epoch_groups`) hands every operator task
the rows of all its epochs at once: the task collects its input, splits it by epoch and runs the epochs one after
the other (:func:`pipeline.runtime.operators.task.run_epochs`). ``PIPELINE_MAX_RECORDS_PER_EPOCH`` bounds records, not
bytes, and a source's files do not tell the bytes either (a dictionary-encoded 2 KB payload is 1.7 MB per epoch
in Parquet and ~100 MB in Arrow). So the rounds measure them:

* **measured**: every source read task adds the rows and the Arrow bytes (``RecordBatch.nbytes``, the columns the
  job reads) of what it read to a Spark accumulator (:class:`ReadBytesCounter`, :func:`measured`); the driver
  reads it around each round, like the S3 request counter (:mod:`pipeline.runtime.spark.task_requests`);
* **recorded**: every completed checkpoint records bytes per row per source in its ``_metadata``
  (``extra.source_bytes_per_row``, :class:`~pipeline.checkpoint.recovery_fields.RecoveryFields`): the figure of
  its own rounds, or the parent's for a source it read nothing of. A new process (an Airflow task, a CLI run after downtime) restores it with the
  checkpoint (:attr:`pipeline.runtime.driver.cursor.Cursor.bytes_per_row`);
* **used**: a tagged round adds waiting epochs only while the rows of its epochs x bytes per row / parallelism
  stay within ``PIPELINE_MAX_TASK_BYTES_PER_ROUND`` (:func:`epochs_within_budget`);
* **sampled** before any round measured it (a job's first round, a source never read, Spark Connect): the driver
  decodes the first rows (at most :data:`SAMPLE_ROWS`) of the round's first Parquet file of that source into
  Arrow, as the read tasks would (:func:`sampled_bytes_per_row`; 2-3 ranged reads, once per source and process).
  The figure a checkpoint records is always the measured one. A source with no Parquet file to sample (JSON
  Lines) or whose sample fails gets one epoch in that round, which records the figure.

What the budget does not count, and why it need not (docs/performance.md, "Several epochs per Spark round"):

* state held by the task (heap backend: the key groups' state, loaded once per round): it is the same whatever
  the number of epochs in the round, and a job already holds it with one epoch per round; the budget bounds
  what *tagging adds* on top of a one-epoch round, the other epochs' input;
* the rows a chained operator receives from its upstream operator: bounded by the same estimate when the
  upstream operator does not multiply rows (a join whose output rows outnumber its input rows is the exception);
* skew: rows are assumed spread evenly over the ``P`` tasks (key groups); a skewed key gets more.

Spark Connect has no accumulators: nothing is measured there, and a job whose checkpoints carry no figure runs
one epoch per round under Connect when the budget is on (``PIPELINE_MAX_TASK_BYTES_PER_ROUND=0``: off).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.runtime.spark.session import is_connect_session

__all__ = ["SAMPLE_ROWS", "BudgetCut", "ReadBytes", "ReadBytesCounter", "epochs_within_budget",
           "measured", "bytes_per_row_after", "sampled_bytes_per_row"]

#: the ``_metadata`` ``extra`` key of the bytes per row per source a checkpoint records
#: at most this many rows of a file are decoded for a first figure (:func:`sampled_bytes_per_row`)
SAMPLE_ROWS = 4096
#: per row, the columns the read tasks add to the declared ones (``_source``, ``_partition``, ``_seq``, ``_row``
#: and, in a tagged round, the epoch tag and row epoch): their Arrow bytes, the string's offset included
_READER_COLUMNS_BYTES = 4 + 4 + 8 + 8 + 8 + 8


@dataclass(frozen=True, slots=True)
class ReadBytes:
    """What the source read tasks of one or more rounds read: per source, rows and Arrow bytes."""

    rows: Mapping[str, int]
    bytes: Mapping[str, int]

    def __add__(self, other: ReadBytes) -> ReadBytes:
        keys = set(self.rows) | set(other.rows)
        return ReadBytes({k: self.rows.get(k, 0) + other.rows.get(k, 0) for k in keys},
                         {k: self.bytes.get(k, 0) + other.bytes.get(k, 0) for k in keys})

    def per_row(self) -> dict[str, float]:
        """Bytes per row of every source that read rows."""
        return {s: self.bytes.get(s, 0) / n for s, n in self.rows.items() if n}


def bytes_per_row_after(previous: Mapping[str, float], read: ReadBytes | None) -> dict[str, float]:
    """The figure a checkpoint records: what its rounds measured, the previous figure for a source they read
    nothing of (or when nothing was measured: Spark Connect)."""
    out = {s: float(v) for s, v in previous.items()}
    if read is not None:
        out.update(read.per_row())
    return dict(sorted(out.items()))


class _SumParam:
    """The accumulator's algebra (PySpark's ``AccumulatorParam`` protocol): {source: (rows, bytes)}, added up."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, a: dict, b: dict) -> dict:  # noqa: N802 - PySpark's name
        for k, (rows, nbytes) in b.items():
            old = a.get(k, (0, 0))
            a[k] = (old[0] + rows, old[1] + nbytes)
        return a


class ReadBytesCounter:
    """The driver's side: one accumulator per Spark session, read around each round."""

    def __init__(self, accumulator: Any) -> None:
        self.accumulator = accumulator

    @classmethod
    def for_session(cls, spark: Any) -> ReadBytesCounter | None:
        """A counter on ``spark``'s context; None where there are no accumulators (Spark Connect)."""
        sc = None if is_connect_session(spark) else getattr(spark, "sparkContext", None)
        return None if sc is None else cls(sc.accumulator({}, _SumParam()))

    def mark(self) -> dict:
        return dict(self.accumulator.value)

    def since(self, mark: Mapping) -> ReadBytes:
        """What the read tasks that completed since ``mark`` read."""
        now = dict(self.accumulator.value)
        rows, nbytes = {}, {}
        for s, (r, b) in now.items():
            r0, b0 = mark.get(s, (0, 0))
            rows[s], nbytes[s] = r - r0, b - b0
        return ReadBytes(rows, nbytes)


def measured(fn: Callable[[Iterator[Any]], Iterator[Any]], source: str,
             counter: ReadBytesCounter | None) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """``fn`` (a source read ``mapInArrow`` function) adding the rows and Arrow bytes of the batches it yields to
    ``counter``'s accumulator at its end (a failed attempt adds nothing). No counter (Spark Connect): ``fn``."""
    if counter is None:
        return fn
    acc = counter.accumulator

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        rows = nbytes = 0
        for out in fn(batches):
            rows += out.num_rows
            nbytes += out.nbytes
            yield out
        acc.add({source: (rows, nbytes)})

    return task


@dataclass(frozen=True, slots=True)
class BudgetCut:
    """How many of a tagged round's candidate epochs fit the per-task byte budget."""

    epochs: int               # how many of the candidates the round takes (at least 1)
    task_bytes: int | None    # the estimate of the bytes a task holds for those epochs (None: unknown)
    reason: str | None        # why the round stops before the candidates' end (None: not cut by bytes)


def _task_bytes(records: Mapping[str, int], bytes_per_row: Mapping[str, float], parallelism: int
                ) -> tuple[int | None, str | None]:
    total = 0.0
    for s, n in sorted(records.items()):
        if not n:
            continue
        b = bytes_per_row.get(s)
        if b is None:
            return None, s
        total += n * b
    return math.ceil(total / max(1, parallelism)), None


def epochs_within_budget(records: Sequence[Mapping[str, int]], bytes_per_row: Mapping[str, float],
                         parallelism: int, budget: int) -> BudgetCut:
    """How many of the candidate epochs (``records``: per epoch, the records per source it reads, in order) one
    tagged round takes so that (their records x bytes per row) / ``parallelism`` stays within ``budget`` bytes
    per task. The first epoch is always taken (a round carries at least one); an epoch is added only while the
    estimate is known (every source with rows has a figure) and within the budget. ``budget`` 0: no bound."""
    n = len(records)
    if n == 0:
        return BudgetCut(0, 0, None)
    used: dict[str, int] = {}
    estimate: int | None = None
    for i, rec in enumerate(records):
        for s, k in rec.items():
            used[s] = used.get(s, 0) + k
        est, unknown = _task_bytes(used, bytes_per_row, parallelism)
        if i == 0:
            estimate = est
            if budget and unknown is not None and n > 1:
                return BudgetCut(1, None, f"no bytes-per-row figure of source {unknown!r} yet (this round "
                                          "records it)")
            continue
        if budget and est is not None and est > budget:
            return BudgetCut(i, estimate, f"{i + 1} epochs would hold ~{_mib(est)} per task, over "
                                          f"PIPELINE_MAX_TASK_BYTES_PER_ROUND={_mib(budget)}")
        if budget and est is None:  # a source the earlier epochs did not read, never measured
            return BudgetCut(i, estimate, f"no bytes-per-row figure of source {unknown!r} yet")
        estimate = est
    return BudgetCut(n, estimate, None)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def sampled_bytes_per_row(fileio: Any, schema: Any, splits: Sequence[Any], *, rows: int = SAMPLE_ROWS
                          ) -> float | None:
    """A first bytes-per-row figure of a source no round has measured yet: the Arrow bytes per row of the first
    ``rows`` rows of the first Parquet file among ``splits`` (a round's :class:`~pipeline.source.planner.Split`),
    decoded as the read tasks decode them (the declared ``schema``'s columns the file has, dictionary pages
    expanded), plus the columns the read tasks add. None when no split is a Parquet file with rows, or the file
    cannot be read (the round then takes one epoch and measures). Reads only the footer and the first row group's
    pages of those columns; writes nothing."""
    import pyarrow.parquet as pq

    for sp in splits:
        if sp.format != "parquet" or not sp.rows:
            continue
        try:
            with fileio.open_input(sp.uri) as f:
                pf = pq.ParquetFile(f)
                names = [n for n in schema.names if n in pf.schema_arrow.names]
                batch = next(pf.iter_batches(batch_size=rows, columns=names), None)
        except Exception:  # noqa: BLE001 - an unreadable file is the read tasks' to report (dead letters)
            return None
        if batch is None or batch.num_rows == 0:
            continue
        return batch.nbytes / batch.num_rows + _READER_COLUMNS_BYTES
    return None
