"""Builds the Spark side of one round: source segments -> stateless steps -> stateful operator tasks.

Each stateful operator is one Spark job: its inputs (source splits read on the executors, or the files
its upstream operator wrote this round) go through the stateless steps as Spark SQL, get a key group and
a routing column, are shuffled so that partition i == subtask i, and are consumed by the operator task
(:mod:`pipeline.runtime.operators`). The job's result is the small list of the tasks' reports (the acks,
decoded once by :mod:`pipeline.runtime.operators.report_codec`).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

import pipeline.exceptions as exc_mod
from pipeline.arrow_ddl import schema_ddl
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import TaskReport
from pipeline.exceptions import ConfigError
from pipeline.fileio import file_io_for
from pipeline.fileio.request_counter import attributed_to
from pipeline.job import (
    Job,
    LookupJoinNode,
    MapNode,
    SourceNode,
    UnionNode,
    schema_difference,
)
from pipeline.operators.retract import SIGN
from pipeline.operators.ttl import ROW_EPOCH
from pipeline.runtime.operators.registry import builder_for
from pipeline.runtime.operators.report_codec import from_table
from pipeline.runtime.operators.round_params import EPOCH_TAG, task_params
from pipeline.runtime.operators.task import HANDLE_DDL, HANDLE_TAGGED_DDL
from pipeline.runtime.operators.task_profile import profiled
from pipeline.runtime.operators.writer_nodes import SinkWriterNode
from pipeline.runtime.spark.lookup_plan import lookup_dataframe
from pipeline.runtime.spark.round_bytes import ReadBytesCounter, measured
from pipeline.runtime.spark.task_requests import TaskRequestCounter, counted
from pipeline.source.reader import META_FIELDS
from pipeline.updating_streams import reads_changelog, writer_reads_changelog
from pipeline.worker_memory import release_memory

__all__ = ["OperatorIO", "operator_dataframe", "drop_internal", "schema_ddl", "arrow_schema_of", "collect_handles",
           "fresh_dataframe", "split_dataframe", "task_count", "files_dataframe", "spark_schema",
           "rethrow_task_error"]


#: columns the runtime adds to records (source positions, routing and alignment flags): never user data
_INTERNAL = frozenset(["_source", "_partition", "_seq", "_row", "_park", "_kg", "_side", "_subtask", "_route",
                       "_matched", ROW_EPOCH, EPOCH_TAG, SIGN, "_wm_channel"])


def spark_schema(schema: pa.Schema):
    from pyspark.sql.pandas.types import from_arrow_schema
    return from_arrow_schema(schema)


def task_count(n_items: int, max_tasks: int) -> int:
    """How many Spark tasks ``n_items`` splits/files are grouped into (at least one)."""
    return max(1, min(n_items, max_tasks))


def _task_groups(n_items: int, max_tasks: int) -> list[list[int]]:
    """Deterministic round-robin assignment of ``n_items`` to at most ``max_tasks`` Spark tasks."""
    k = task_count(n_items, max_tasks)
    return [list(range(i, n_items, k)) for i in range(k)]


def _indexed_dataframe(spark, n_tasks: int):
    """``n_tasks`` partitions holding their own index, built in the JVM (no Python RDD involved)."""
    return spark.range(0, n_tasks, 1, n_tasks)


def split_dataframe(spark, n_tasks: int, source: SourceNode, reader_factory: Callable, params_key: str,
                    meta: Sequence[str] | None = None, carried: Mapping[str, Any] | None = None,
                    row_epochs: bool = False, tagged: bool = False, requests: TaskRequestCounter | None = None,
                    read_bytes: ReadBytesCounter | None = None):
    """A DataFrame of one round's source records of ``source``, read on the executors by ``n_tasks`` tasks
    (each reads its splits through FileIO, so S3 needs nothing on the JVM).

    The splits are the round's value of the local property ``params_key`` (see
    :mod:`pipeline.runtime.operators.round_params`), so the same plan serves every round whose splits group into
    ``n_tasks`` tasks (:func:`task_count`). ``meta``: the position columns to keep (default all); Spark
    cannot prune a Python function's output, and every column handed to the JVM is converted row by row,
    so columns nobody reads are dropped in the task. ``carried`` (Spark Connect, which has no local
    properties): the round's values, put into the task function itself. ``row_epochs``: every record gets its
    own epoch (:data:`~pipeline.operators.ttl.ROW_EPOCH`, the ``epoch`` of its split dict, see
    :mod:`pipeline.runtime.driver.input_epochs`; null for an untagged split). ``tagged`` (a round of several epochs):
    every record gets the epoch it is processed in (:data:`~pipeline.runtime.operators.round_params.EPOCH_TAG`, the
    ``tag`` of its split dict). ``requests``: counts the tasks' S3 requests (:mod:`pipeline.runtime.spark.task_requests`;
    in a tagged round each run of splits is attributed to its epoch). ``read_bytes``: adds the rows and Arrow
    bytes read to the round's figure (:mod:`pipeline.runtime.spark.round_bytes`).
    

    Over 8 parameters: the source, its reader and the round's options (carried columns, row epochs, tagging, request
    counting), all but the first five optional."""
    keep = [f for f in META_FIELDS if meta is None or f.name in meta]
    out_schema = pa.schema(list(source.schema) + keep)
    names = out_schema.names
    if row_epochs:
        out_schema = out_schema.append(pa.field(ROW_EPOCH, pa.int64()))
    if tagged:
        out_schema = out_schema.append(pa.field(EPOCH_TAG, pa.int64()))
    reader = reader_factory(source)
    split_schema = pa.schema([("source", pa.string()), ("partition", pa.int32()), ("seq", pa.int64()),
                              ("uri", pa.string()), ("format", pa.string()), ("row_start", pa.int64()),
                              ("row_end", pa.int64()), ("ingest_ts", pa.int64())])
    name = source.name
    embedded = None if carried is None else carried.get(params_key, [])

    def read(batches):
        items = embedded if embedded is not None else task_params(params_key)
        if items is None:
            raise RuntimeError(f"source {name}: the job was submitted without its splits ({params_key})")
        groups = [list(range(i, len(items), n_tasks)) for i in range(n_tasks)]
        for b in batches:
            for task in b.column(0).to_pylist():
                mine = [items[i] for i in groups[task]] if items else []
                runs: list[list[dict]] = []   # consecutive splits of one own epoch (and tag; order kept)
                for d in mine:
                    if runs and (runs[-1][0].get("epoch"), runs[-1][0].get("tag")) == (d.get("epoch"), d.get("tag")):
                        runs[-1].append(d)
                    else:
                        runs.append([d])
                for run in runs:
                    with attributed_to(run[0].get("tag")):  # a tagged round: the requests of the run's epoch
                        for out in reader(iter([pa.RecordBatch.from_pylist(run, schema=split_schema)])):
                            out = out if len(keep) == len(META_FIELDS) else out.select(names)
                            if row_epochs:
                                ep = run[0].get("epoch")
                                out = out.append_column(ROW_EPOCH, pa.repeat(pa.scalar(ep, pa.int64()), out.num_rows))
                            if tagged:
                                out = out.append_column(EPOCH_TAG,
                                                        pa.repeat(pa.scalar(run[0]["tag"], pa.int64()), out.num_rows))
                            yield out
        release_memory()  # the worker runs other tasks next: what this one freed goes back to the OS

    task = counted(profiled(f"source-{name}", measured(read, name, read_bytes)), requests)
    return _indexed_dataframe(spark, n_tasks).mapInArrow(task, schema_ddl(out_schema))


def files_dataframe(spark, uris: Sequence[str], schema: pa.Schema, max_tasks: int = 8,
                    requests: TaskRequestCounter | None = None):
    """A DataFrame of the rows of Parquet files written by an upstream operator this round."""
    ddl = schema_ddl(schema)
    uris = list(uris)
    groups = _task_groups(len(uris), max_tasks)

    def read(batches):
        import pyarrow.parquet as pq

        for b in batches:
            for task in b.column(0).to_pylist():
                for i in (groups[task] if uris else []):
                    uri = uris[i]
                    with file_io_for(uri).open_input(uri) as f:
                        t = pq.read_table(f).select(schema.names).cast(schema)
                    yield from t.to_batches(max_chunksize=50_000)
        release_memory()

    return _indexed_dataframe(spark, len(groups)).mapInArrow(counted(read, requests), ddl)


def apply_maps(df, maps: Sequence[MapNode]):
    for m in maps:
        if m.kind == "filter":
            df = df.filter(m.exprs[0])
        else:
            exprs = list(m.exprs)
            if "_ingest_ts" in df.columns and not any(e.strip().split()[-1] == "_ingest_ts" for e in exprs):
                exprs.append("_ingest_ts")
            if "_park" in df.columns:  # unaligned: the row is in flight at the join (see JobRunner._process_round)
                exprs.append("_park")
            if ROW_EPOCH in df.columns:  # the record's own epoch (pipeline.runtime.driver.input_epochs)
                exprs.append(ROW_EPOCH)
            if EPOCH_TAG in df.columns:  # tagged round: the epoch the record is processed in
                exprs.append(EPOCH_TAG)
            if "_wm_channel" in df.columns:  # a window's watermark channel (pipeline.runtime.operators.window)
                exprs.append("_wm_channel")
            if SIGN in df.columns:  # a changelog's row: added or retracted (pipeline.updating_streams)
                exprs.append(SIGN)
            df = df.selectExpr(*exprs)
    return df


def arrow_schema_of(df) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema
    s = to_arrow_schema(df.schema, timezone="UTC")
    # Spark hands timestamps to Arrow as UTC timestamps in microseconds
    return pa.schema([pa.field(f.name, pa.timestamp("us", tz="UTC") if pa.types.is_timestamp(f.type) else f.type)
                      for f in s])


@dataclass(frozen=True)
class OperatorIO:
    """Everything one operator needs this round (from the round planner)."""

    checkpoint: str
    parallelism: int
    max_parallelism: int
    parent_handles: Mapping[str, Sequence[StateHandle]]  # {state name: the parent checkpoint's handles}
    state_prefix: str
    output_prefix: str
    output_name: str
    file_tag: str
    ttl_cutoff_us: int | None
    ack_prefix: str | None = None   # set: chained operator (rows flow on, acks written as objects)
    replay_handles: Mapping[str, Sequence[FileHandle]] | None = None  # join: {"left"/"right": [files]} in-flight
    #                                     data of the previous checkpoint to replay first
    channel_prefix: str | None = None   # join: where rows flagged ``_park`` are written as channel state
    prior_output: tuple[tuple[int, FileHandle], ...] = ()  # upsert sink: (subtask, file) staged in earlier
    #                                     rounds of this checkpoint
    bad_records: str = "dead_letter"    # plan-time: the bad-records policy (operators' declaration violations)
    dead_letter_root: str | None = None  # plan-time
    epoch: int = 0                      # window/process: the epoch being processed, its barrier time (µs) and
    barrier_us: int = 0                 # whether this round completes the checkpoint (pipeline.runtime.operators.window)
    complete: bool = True
    replayed: bool = False              # window: the epoch is the parent checkpoint's own (a restore re-completes
    #                                     the restored epoch): its records' windows were emitted already
    snapshot: dict | None = None        # how tasks snapshot state (pipeline.state.snapshot.SnapshotOptions.to_params)
    ttl_us: int | None = None           # plan-time: the operator's state TTL (µs), None: none
    epoch_us: int = 0                   # plan-time: the epoch length (µs)
    tagged: bool = False                # plan-time: a round of several epochs (records carry EPOCH_TAG)
    requests: TaskRequestCounter | None = None  # plan-time: counts the tasks' S3 requests (None: Spark Connect;


def handle_ddl(io: OperatorIO) -> str:
    """The DDL of a terminal operator's reports (the one report schema; tagged rounds fill ``checkpoint_id``)."""
    return HANDLE_TAGGED_DDL if io.tagged else HANDLE_DDL


def with_tag(schema: pa.Schema, io: OperatorIO) -> pa.Schema:
    """A chained operator's flowing schema, with the epoch tag in a tagged round."""
    return schema.append(pa.field(EPOCH_TAG, pa.int64())) if io.tagged else schema


def rethrow_task_error(e: Exception) -> None:
    """Spark wraps executor exceptions; surface Epochal's own error (its class and its one-line message naming
    the file/partition/checkpoint/URI) instead of the wrapped Python traceback."""
    found = re.findall(r"pipeline\.exceptions\.(\w+): ([^\n]*)", str(e))
    for name, detail in reversed(found):  # the innermost (last reported) Epochal error
        cls = getattr(exc_mod, name, None)
        if isinstance(cls, type) and issubclass(cls, exc_mod.EpochalError):
            raise cls(detail.strip()) from None
    raise e


def operator_dataframe(spark, job: Job, op, inputs: dict[int, object], io: OperatorIO):
    """The (lazy) DataFrame of one stateful operator; ``inputs`` maps node id -> DataFrame of that node.

    Terminal operator (``io.ack_prefix`` None): its rows are the task reports (acks) of every subtask.
    Chained operator: its rows are the operator's output, flowing into the next operator in the same
    Spark job; its acks are written by the tasks as objects under ``io.ack_prefix``.
    Returns ``(dataframe, output arrow schema)``.
    """

    def resolve(node_id: int, prepare: Callable | None = None):
        """The DataFrame of node ``node_id``'s input chain; ``prepare(base_id, df)`` (optional) runs on each
        base (source or operator output) before the stateless steps (a window tags watermark channels). A union
        is the union of its inputs' chains, matched by column name (each row keeps its own position, epoch and
        watermark channel)."""
        base, maps = job.chain_to(node_id)
        node = job.nodes[base]
        if isinstance(node, UnionNode):
            parts = [resolve(p, prepare) for p in node.parents]
            check_union(job, base, parts)
            df = parts[0]
            for d in parts[1:]:
                df = df.unionByName(d, allowMissingColumns=True)
        elif isinstance(node, LookupJoinNode):  # stateless: each round's pinned side table (lookup_plan)
            df = lookup_dataframe(spark, node, resolve(node.parent, prepare), io.tagged)
        else:
            rows: Any = inputs[base]
            if SIGN in rows.columns and not (reads_changelog(job, op) or (  # the added rows only (updating_streams)
                    isinstance(op, SinkWriterNode) and writer_reads_changelog(job, op.sink))):
                rows = rows.filter(f"`{SIGN}` > 0").drop(SIGN)
            df = rows if prepare is None else prepare(base, rows)
        return apply_maps(df, maps)

    return builder_for(op)(spark, job, op, resolve, io)


def check_union(job: Job, nid: int, parts: Sequence) -> None:
    """Refuse a union whose inputs' user columns differ (names or types), naming the difference (checked when
    the plan is built, before the round's first side effect)."""
    schemas = [arrow_schema_of(d.select(*[c for c in d.columns if c not in _INTERNAL and c != "_park"]))
               for d in parts]
    node = job.nodes[nid]
    for p, sch in zip(node.parents[1:], schemas[1:]):  # type: ignore[union-attr]
        diff = schema_difference(schemas[0], sch)
        if diff:
            raise ConfigError(f"job {job.name!r}: union (node {nid}) of node {node.parents[0]} and node "  # type: ignore[union-attr]
                              f"{p}: the schemas differ: {diff}")


def drop_internal(df):
    """``df`` without the runtime's own columns (keeps ``_park``, the unaligned routing flag, the records'
    own epoch, a tagged round's epoch tag and a forwarded watermark channel)."""
    keep = [c for c in df.columns if c not in _INTERNAL or c in ("_park", ROW_EPOCH, EPOCH_TAG, "_wm_channel")]
    return df if len(keep) == len(df.columns) else df.select(*keep)


def fresh_dataframe(spark, df):
    """A new DataFrame over ``df``'s analysed plan: executing it plans and runs everything anew (a
    DataFrame executed twice would reuse its first run's shuffle output), without re-analysing."""
    from pyspark.sql import DataFrame
    jds = spark._jvm.org.apache.spark.sql.classic.Dataset.ofRows(spark._jsparkSession,
                                                                 df._jdf.queryExecution().analyzed())
    return DataFrame(jds, spark)


def collect_handles(df) -> list[TaskReport]:
    """Run the Spark job ending in a terminal operator; returns its tasks' reports (small), decoded once."""
    try:
        table = df.toArrow()
    except Exception as e:  # noqa: BLE001
        rethrow_task_error(e)
    return from_table(table)
