"""Sink writers: the stateless tasks that stage a sink's rows when no stateful operator writes them.

A sink whose parent is a stateful operator is written by that operator's tasks (they stage their output under
the sink's ``txn-<checkpoint>`` directory). Every other sink - after a source, a ``filter``/``select``, a
``union``, or a ``select`` behind an operator (Flink: an operator chain ending in a sink) - gets a **sink writer**
(:class:`SinkWriterNode`): a runtime node, not a node of the job graph, with no keyed state. It is planned like an
operator (:mod:`pipeline.runtime.driver.spark_plan`): its input is the DataFrame of its parent's chain (source reads or
an upstream operator's flowing output, stateless steps applied), its task stages the rows of the round and
reports one ``OUTPUT`` per Spark task. Its files are committed with the checkpoint like an operator's
(two-phase commit); it acknowledges nothing else (no state, so a checkpoint of a job without stateful operators
expects no task acknowledgement: its ``_metadata`` carries the writers' files, the positions and the sinks).

* **append**: no shuffle; each task of the parent stage writes its rows (``part-<round>-<task>.parquet``).
* **upsert** (``key``): the rows are routed by a key group of the sink key (as a keyed operator's are), and
  each subtask keeps, per key, the last row of the round in the documented order (below); a later round of the
  same checkpoint replaces the subtask's earlier staged file with the merge (so one commit holds a key once,
  which Delta ``MERGE`` and Iceberg delete+add need). Order of the rows of one round: ``_ingest_ts``, then the
  source position (``_source``, ``_partition``, ``_seq``, ``_row``) where the rows carry it, then the other
  columns; a later round wins over an earlier one, a later checkpoint over an earlier one
  (docs/operators.md, "Sinks").

In a round of several epochs the rows are split by their epoch tag and each epoch's rows go to its own
checkpoint's staging directory (:func:`pipeline.runtime.operators.task.epoch_tagged_task`).
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.faults import fault_point
from pipeline.fileio import file_io_for
from pipeline.job import Job
from pipeline.keygroups import KeyGroupRange, range_for_subtask
from pipeline.operators.join import sortable
from pipeline.operators.retract import SIGN
from pipeline.runtime.operators.task import _collect, emit_handles, epoch_tagged_task, subtask_of, task_report
from pipeline.runtime.operators.writer_nodes import WRITER_PREFIX, SinkWriterNode, is_writer_uid, sink_writers
from pipeline.sink.deletes import key_in, staged_schema, with_tombstones
from pipeline.sink.partitions import partition_dir
from pipeline.state.backend import read_files, write_table

__all__ = ["SinkWriterNode", "WRITER_PREFIX", "sink_writers", "is_writer_uid", "UPSERT_ORDER", "make_writer_task",
           "from_changelog"]


#: the columns that order an upsert sink's rows of one round, where present (then every other column)
UPSERT_ORDER = ("_ingest_ts", "_source", "_partition", "_seq", "_row")

_POSITION = ("_source", "_partition", "_seq", "_row")

_ORDER = "__writer_order"


@dataclass(frozen=True, slots=True)
class WriterTaskSpec:
    uid: str
    checkpoint: str
    table: str
    mode: str
    key: tuple[str, ...]
    out_schema: pa.Schema           # the sink's columns
    order: tuple[str, ...]          # upsert: the order columns the input carries (UPSERT_ORDER present)
    parallelism: int
    max_parallelism: int
    output_prefix: str
    output_name: str
    file_tag: str
    prior_output: tuple[tuple[int, FileHandle], ...] = ()
    epoch: int = 0
    ack_prefix: str | None = None
    parent_handles: dict[str, Sequence[StateHandle]] = field(default_factory=dict)
    partition_by: tuple[str, ...] = ()   # plan-time: one file per combination of these columns' values
    deletes: bool = False   # upsert of a changelog (_sign): a key whose rows were only retracted is a tombstone


def _task_index() -> int:
    from pyspark import TaskContext
    ctx = TaskContext.get()
    return int(ctx.partitionId()) if ctx is not None else 0


def last_per_key(rows: pa.Table, key: Sequence[str], order: Sequence[str]) -> pa.Table:
    """Per key, the last row of ``rows`` in the upsert order: ``order`` columns ascending (nulls first, as Spark's
    ascending sort), then every other sortable column, then arrival."""
    if rows.num_rows < 2:
        return rows
    rest = [c for c in rows.column_names if c not in order and c not in key
            and sortable(rows.schema.field(c).type)]
    t = rows.append_column(_ORDER, pa.array(range(rows.num_rows), pa.int64()))
    sort = [(c, "ascending", "at_start") for c in list(order) + rest] + [(_ORDER, "ascending", "at_start")]
    idx = pc.sort_indices(t, sort_keys=sort)
    t = t.take(idx)
    t = t.set_column(t.schema.get_field_index(_ORDER), _ORDER, pa.array(range(t.num_rows), pa.int64()))
    last = t.group_by(list(key), use_threads=False).aggregate([(_ORDER, "max")])[f"{_ORDER}_max"]
    return t.filter(pc.is_in(t[_ORDER], value_set=last)).drop_columns([_ORDER])


def from_changelog(rows: pa.Table, schema: pa.Schema, key: Sequence[str], order: Sequence[str]) -> pa.Table:
    """An upsert sink's round of a changelog (``_sign``; pipeline.sink.deletes): per key, its last added row in the
    upsert ``order``, or a tombstone when every row of the key is a retraction (its row left the result, or a
    filter dropped its update). The key must be unique in the result (one live row per key), as an upsert
    sink's key is. Returns rows of :func:`~pipeline.sink.deletes.staged_schema`."""
    sign = (pc.fill_null(pc.cast(rows[SIGN], pa.int64()), 1) if SIGN in rows.column_names
            else pa.array([1] * rows.num_rows, pa.int64()))
    added = rows.filter(pc.greater(sign, 0))
    live = last_per_key(added.select([c for c in added.column_names if c != SIGN]), key, order)
    gone = rows.filter(pc.less_equal(sign, 0)).select(list(key))
    if gone.num_rows and live.num_rows:
        gone = gone.filter(pc.invert(key_in(gone, live, key)))
    if gone.num_rows:
        gone = gone.group_by(list(key), use_threads=False).aggregate([])
    return with_tombstones(live.select(schema.names).cast(schema), gone, schema, key)


def merge_prior(prior: pa.Table, new: pa.Table, key: Sequence[str]) -> pa.Table:
    """The rows of ``prior`` whose key ``new`` does not hold, then ``new`` (a later round replaces a key)."""
    if not prior.num_rows:
        return new
    if not new.num_rows:
        return prior
    marker = "__writer_new"
    both = pa.concat_tables([prior.append_column(marker, pa.repeat(pa.scalar(0, pa.int8()), prior.num_rows)),
                             new.cast(prior.schema).append_column(marker, pa.repeat(pa.scalar(1, pa.int8()),
                                                                                       new.num_rows))])
    both = both.append_column(_ORDER, pa.array(range(both.num_rows), pa.int64()))
    last = both.group_by(list(key), use_threads=False).aggregate([(_ORDER, "max")])[f"{_ORDER}_max"]
    return both.filter(pc.is_in(both[_ORDER], value_set=last)).drop_columns([_ORDER, marker])


def _partitions(rows: pa.Table, columns: Sequence[str]) -> list[tuple[str, pa.Table]]:
    """``rows`` split by the values of the partition ``columns``: ``[("c1=v1/c2=v2/", rows), ...]`` (one ``("",
    rows)`` for an unpartitioned sink)."""
    if not columns:
        return [("", rows)]
    combos = rows.select(list(columns)).group_by(list(columns), use_threads=False).aggregate([]).to_pylist()
    out = []
    for combo in combos:
        mask = None
        for c in columns:
            v = combo[c]
            m = pc.is_null(rows[c]) if v is None else pc.fill_null(pc.equal(rows[c], pa.scalar(v, rows[c].type)),
                                                                   False)
            mask = m if mask is None else pc.and_(mask, m)
        out.append((partition_dir(columns, [combo[c] for c in columns]) + "/", rows.filter(mask)))
    return out


def make_writer_task(spec: WriterTaskSpec):
    upsert = spec.mode == "upsert"

    def step(spec: WriterTaskSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        fault_point("reading")
        t0 = time.perf_counter()
        parts = spec.partition_by
        incoming = _collect(batches)
        if upsert:
            subtask, incoming = subtask_of(incoming)
            kgr = range_for_subtask(spec.max_parallelism, spec.parallelism, subtask)
        else:
            subtask, kgr = _task_index(), KeyGroupRange(0, spec.max_parallelism - 1)
        names = list(spec.out_schema.names)
        n = incoming.num_rows if incoming is not None else 0
        out = None
        file_schema = staged_schema(spec.out_schema, spec.key) if spec.deletes else spec.out_schema
        if incoming is not None and n and spec.deletes:
            out = from_changelog(incoming.select(names + [c for c in (*spec.order, SIGN) if c not in names]),
                                 spec.out_schema, spec.key, spec.order)
        elif incoming is not None and n:
            if upsert:
                incoming = last_per_key(incoming.select(names + [c for c in spec.order if c not in names]),
                                        spec.key, spec.order)
            out = incoming.select(names).cast(spec.out_schema)
        fio = file_io_for(spec.output_prefix)
        if upsert and spec.prior_output:
            prior = read_files(fio, [f for s, f in spec.prior_output if s == subtask], file_schema,
                               spec.checkpoint)
            out = merge_prior(prior, out if out is not None else file_schema.empty_table(), spec.key)
        written: list[FileHandle | None] = []
        name = f"part-{spec.file_tag}-{subtask:05d}.parquet"
        if out is not None and out.num_rows:
            for sub, rows in _partitions(out, parts):
                written.append(write_table(fio, f"{spec.output_prefix}/{sub}{name}", rows))
        ms = (time.perf_counter() - t0) * 1000
        reports: list[TaskReport] = [task_report(ReportKind.OUTPUT, spec.uid, spec.output_name, subtask, kgr, fh,
                                                 sync_ms=ms, in_rows=n) for fh in written or [None]]
        yield from emit_handles(reports, None, spec.out_schema, fio, None, subtask)

    return epoch_tagged_task(spec, step)


def visible_columns(job: Job, parent: int, columns: Sequence[str], internal: frozenset[str]) -> list[str]:
    """The sink's columns among ``columns`` (the parent chain's DataFrame): the user's, ``_ingest_ts`` only when
    the stream shows it (:meth:`pipeline.job.Job.ingest_shown`)."""
    shown = job.ingest_shown(parent)
    return [c for c in columns if c not in internal and (c != "_ingest_ts" or shown)]
