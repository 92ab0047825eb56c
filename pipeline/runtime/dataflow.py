"""Builds the Spark side of one round: source segments -> stateless steps -> stateful operator tasks.

Each stateful operator is one Spark job: its inputs (source splits read on the executors, or the files
its upstream operator wrote this round) go through the stateless steps as Spark SQL, get a key group and
a routing column, are shuffled so that partition i == subtask i, and are consumed by the operator task
(:mod:`pipeline.runtime.operators`). The job's result is the small list of the tasks' reports (the acks,
decoded once by :mod:`pipeline.runtime.report_codec`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import pyarrow as pa

import pipeline.exceptions as exc_mod
from pipeline.arrow_ddl import schema_ddl
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import TaskReport
from pipeline.exceptions import ConfigError
from pipeline.fileio import file_io_for
from pipeline.fileio.request_counter import attributed_to
from pipeline.job import (
    AggregateNode,
    Job,
    JoinNode,
    MapNode,
    SourceNode,
    UnionNode,
    join_key_sql,
    join_output,
    schema_difference,
)
from pipeline.keygroups import key_group_expr
from pipeline.operators.aggregate_functions import (
    mask_sql,
    masked_aggs,
    needs_extended_kernel,
    output_fields,
    state_fields,
)
from pipeline.operators.ttl import ROW_EPOCH
from pipeline.runtime.operator_registry import builder_for, register_operator
from pipeline.runtime.operators import (
    EXACT_SUM,
    HANDLE_DDL,
    HANDLE_TAGGED_DDL,
    AggTaskSpec,
    JoinTaskSpec,
    make_agg_task,
    make_join_task,
)
from pipeline.runtime.report_codec import from_table
from pipeline.runtime.round_bytes import ReadBytesCounter, measured
from pipeline.runtime.round_params import EPOCH_TAG, task_params
from pipeline.runtime.routing import route_by_key_group
from pipeline.runtime.task_profile import profiled
from pipeline.runtime.task_requests import TaskRequestCounter, counted
from pipeline.source.reader import META_FIELDS
from pipeline.worker_memory import release_memory

__all__ = ["OperatorIO", "operator_dataframe", "drop_internal", "schema_ddl", "arrow_schema_of", "collect_handles", "fresh_dataframe", "split_dataframe", "task_count",
           "files_dataframe", "spark_schema", "rethrow_task_error"]

#: columns the runtime adds to records (source positions, routing and alignment flags): never user data
_INTERNAL = frozenset(["_source", "_partition", "_seq", "_row", "_park", "_kg", "_side", "_subtask", "_route",
                       "_matched", ROW_EPOCH, EPOCH_TAG])


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
    :mod:`pipeline.runtime.round_params`), so the same plan serves every round whose splits group into
    ``n_tasks`` tasks (:func:`task_count`). ``meta``: the position columns to keep (default all); Spark
    cannot prune a Python function's output, and every column handed to the JVM is converted row by row,
    so columns nobody reads are dropped in the task. ``carried`` (Spark Connect, which has no local
    properties): the round's values, put into the task function itself. ``row_epochs``: every record gets its
    own epoch (:data:`~pipeline.operators.ttl.ROW_EPOCH`, the ``epoch`` of its split dict, see
    :mod:`pipeline.runtime.input_epochs`; null for an untagged split). ``tagged`` (a round of several epochs):
    every record gets the epoch it is processed in (:data:`~pipeline.runtime.round_params.EPOCH_TAG`, the
    ``tag`` of its split dict). ``requests``: counts the tasks' S3 requests (:mod:`pipeline.runtime.task_requests`;
    in a tagged round each run of splits is attributed to its epoch). ``read_bytes``: adds the rows and Arrow
    bytes read to the round's figure (:mod:`pipeline.runtime.round_bytes`).
    """
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
                              ("row_end", pa.int64())])
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
            if ROW_EPOCH in df.columns:  # the record's own epoch (pipeline.runtime.input_epochs)
                exprs.append(ROW_EPOCH)
            if EPOCH_TAG in df.columns:  # tagged round: the epoch the record is processed in
                exprs.append(EPOCH_TAG)
            if "_wm_channel" in df.columns:  # a window's watermark channel (pipeline.runtime.keyed_ops)
                exprs.append("_wm_channel")
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
    barrier_us: int = 0                 # whether this round completes the checkpoint (pipeline.runtime.keyed_ops)
    complete: bool = True
    replayed: bool = False              # window: the epoch is the parent checkpoint's own (a restore re-completes
    #                                     the restored epoch): its records' windows were emitted already
    snapshot: dict | None = None        # how tasks snapshot state (pipeline.state.snapshot.SnapshotOptions.to_params)
    ttl_us: int | None = None           # plan-time: the operator's state TTL (µs), None: none
    epoch_us: int = 0                   # plan-time: the epoch length (µs)
    tagged: bool = False                # plan-time: a round of several epochs (records carry EPOCH_TAG)
    requests: TaskRequestCounter | None = None  # plan-time: counts the tasks' S3 requests (None: Spark Connect;
    #                                     every builder wraps its task functions with task_requests.counted)


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
        else:
            df = inputs[base] if prepare is None else prepare(base, inputs[base])
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
    own epoch and a tagged round's epoch tag)."""
    keep = [c for c in df.columns if c not in _INTERNAL or c in ("_park", ROW_EPOCH, EPOCH_TAG)]
    return df if len(keep) == len(df.columns) else df.select(*keep)


@register_operator(JoinNode)
def join_dataframe(spark, job: Job, op: JoinNode, resolve, io: OperatorIO):
    """The join operator: both inputs keyed by ``op.on`` and shuffled together (``_side`` 0/1)."""
    from pyspark.sql import functions as F
    P, MP = io.parallelism, io.max_parallelism
    left, right = resolve(op.left), resolve(op.right)
    if op.keys:  # several key columns: keyed by one column computed from them (pipeline.job.join_key_sql)
        for side, d in (("left", left), ("right", right)):
            missing = [k for k in op.keys if k not in d.columns]
            if missing:
                raise ConfigError(f"join {op.uid}: {side} input lacks key columns {missing}")
        left = left.withColumn(op.on, F.expr(join_key_sql(op.keys)))
        right = right.withColumn(op.on, F.expr(join_key_sql(op.keys)))
    for side, d in (("left", left), ("right", right)):
        if op.on not in d.columns or "_ingest_ts" not in d.columns:
            raise ConfigError(f"join {op.uid}: {side} input needs columns {op.on!r} and _ingest_ts, has "
                              f"{[c for c in d.columns if c not in _INTERNAL]}")
    # "_park" (unaligned checkpoints only) flags rows in flight at the join: a routing flag, not data
    # internal columns (source positions, routing flags) are not the user's: never joined, never output
    lcols = tuple(c for c in left.columns if c not in _INTERNAL)
    rcols = tuple(c for c in right.columns if c not in _INTERNAL)

    def own_epoch(d):  # records of an untagged input (e.g. a window's output) get the checkpoint's epoch in the task
        return F.col(ROW_EPOCH) if ROW_EPOCH in d.columns else F.lit(None).cast("long").alias(ROW_EPOCH)
    lsch = arrow_schema_of(left.select(*lcols))
    rsch = arrow_schema_of(right.select(*rcols))
    def extra(d):  # routing flags that ride along: unaligned parking, a tagged round's epoch
        return [c for c in ("_park", EPOCH_TAG) if c in d.columns and (c != EPOCH_TAG or io.tagged)]
    left, right = left.select(*lcols, own_epoch(left), *extra(left)), right.select(*rcols, own_epoch(right), *extra(right))
    clash = (set(lcols) & set(rcols)) - {op.on, "_ingest_ts", *op.keys}
    if clash:
        raise ConfigError(f"join {op.uid}: both inputs have columns {sorted(clash)}; rename them on one side "
                          f"with select() (e.g. select('{sorted(clash)[0]} AS right_{sorted(clash)[0]}', ...))")
    output = tuple(join_output(op, lcols, rcols))
    unknown = [c for c in output if c not in lcols and c not in rcols]
    if unknown:
        raise ConfigError(f"join {op.uid}: output columns {unknown} are in neither input "
                          f"(left has {list(lcols)}, right has {list(rcols)})")
    kg = key_group_expr(op.on, MP)
    l2 = left.withColumn("_side", F.lit(0).cast("byte")).withColumn("_kg", kg)
    r2 = right.withColumn("_side", F.lit(1).cast("byte")).withColumn("_kg", kg)
    shuffled = route_by_key_group(l2.unionByName(r2, allowMissingColumns=True), spark, "_kg", P, MP)
    joined = {**{f.name: f for f in lsch}, **{f.name: f for f in rsch}}
    # outer joins emit nulls for the other side: every output column is nullable
    out_schema = pa.schema([joined[c].with_nullable(True) for c in output])
    # chained: only the columns the consumers read flow on (the sink file still gets every column)
    read = job.columns_read(job.node_id(op)) if io.ack_prefix is not None else None
    flow_schema = out_schema if read is None else pa.schema([f for f in out_schema if f.name.lower() in read])
    if io.ack_prefix is not None:  # rows flowing on carry their own epoch (a pair: the later of its two rows')
        flow_schema = flow_schema.append(pa.field(ROW_EPOCH, pa.int64()))
    spec = JoinTaskSpec(op.uid, io.checkpoint, op.on, lcols, rcols, output, P, MP, io.ttl_cutoff_us,
                        io.parent_handles, io.state_prefix, io.output_prefix, io.output_name, io.file_tag,
                        lsch, rsch, out_schema, io.ack_prefix, io.replay_handles or {}, io.channel_prefix,
                        flow_schema, how=op.how, unique=op.unique, bad_records=io.bad_records,
                        dead_letter_root=io.dead_letter_root, job=job.name, ttl_us=io.ttl_us,
                        epoch_us=io.epoch_us, epoch=io.epoch)
    result = shuffled.mapInArrow(counted(make_join_task(spec), io.requests), handle_ddl(io) if io.ack_prefix is None
                                 else schema_ddl(with_tag(flow_schema, io)))
    return result, out_schema  # the full output schema (what a sink gets), not the chained flow_schema


@register_operator(AggregateNode)
def aggregate_dataframe(spark, job: Job, op: AggregateNode, resolve, io: OperatorIO):
    """The running keyed aggregate: input keyed by ``op.key``, exact decimal sums in state."""
    P, MP = io.parallelism, io.max_parallelism
    full = resolve(op.parent)
    aggs = op.aggs
    if op.filters:  # FILTER (WHERE ...): each filtered aggregate reads its masked column (aggregate_functions)
        full = full.selectExpr("*", *[f"{sql} AS `{name}`" for name, sql in mask_sql(op.aggs, op.filters)])
        aggs = masked_aggs(op.aggs, op.filters)
    src = full
    needed = [op.key] + sorted({c for _, fn, c in aggs if c})
    missing = [c for c in needed if c not in src.columns]
    if missing:
        raise ConfigError(f"aggregate {op.uid}: input lacks columns {missing}")
    src = src.select(*needed)
    in_schema = arrow_schema_of(src)
    if io.tagged:  # a tagged round: the epoch rides along to the task (which splits by it)
        src = full.select(*needed, EPOCH_TAG)
    fields = [in_schema.field(op.key)]
    out_fields = [in_schema.field(op.key)]
    for out, fn, col in (() if needs_extended_kernel(aggs) else aggs):
        if fn == "count":
            fields.append(pa.field(out, pa.int64()))
            out_fields.append(fields[-1])
        elif fn == "sum":
            t = in_schema.field(col).type
            # floating sums are kept as exact decimals in state, so totals do not depend on the
            # order in which records arrive (deterministic replay, identical results after rescaling)
            fields.append(pa.field(out, EXACT_SUM if pa.types.is_floating(t) else pa.int64()))
            out_fields.append(pa.field(out, pa.float64() if pa.types.is_floating(t) else pa.int64()))
        else:
            fields.append(pa.field(out, in_schema.field(col).type))
            out_fields.append(fields[-1])
    if needs_extended_kernel(aggs):  # avg / count_distinct: state columns besides the values
        fields += state_fields(aggs, in_schema)
        out_fields += output_fields(aggs, in_schema)
    state_schema = pa.schema(fields)
    out_schema = pa.schema(out_fields)
    shuffled = route_by_key_group(src.withColumn("_kg", key_group_expr(op.key, MP)), spark, "_kg", P, MP)
    spec = AggTaskSpec(op.uid, io.checkpoint, op.key, aggs, state_schema, P, MP, io.parent_handles,
                       io.state_prefix, io.output_prefix, io.output_name, io.file_tag, io.ack_prefix,
                       out_schema, tuple(io.prior_output))
    result = shuffled.mapInArrow(counted(make_agg_task(spec), io.requests), handle_ddl(io) if io.ack_prefix is None
                                 else schema_ddl(with_tag(out_schema, io)))
    return result, out_schema


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
