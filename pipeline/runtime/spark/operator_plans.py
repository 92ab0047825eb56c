"""The Spark plan of each operator, registered per node type (:mod:`pipeline.runtime.operators.registry`): the
input keyed (:func:`pipeline.keygroups.key_group_expr`) and shuffled so that Spark partition ``i`` is subtask ``i``
(:mod:`pipeline.runtime.spark.routing`), then mapped with the operator's task (:mod:`pipeline.runtime.operators`).
One builder per operator (join, aggregate, deduplicate, window, process, sink writer), each ``(DataFrame, schema)``.

Over 400 lines: six operators' plan builders and the shared watermark-channel tagging they use (a deduplicate and a
join forward their inputs' channels to a window); the next operator's builder goes to a module of its own, as the
timed joins' and the over aggregate's did.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.arrow_ddl import schema_ddl
from pipeline.exceptions import ConfigError
from pipeline.job import (
    AggregateNode,
    DedupNode,
    Job,
    JoinNode,
    ProcessNode,
    RankNode,
    WindowNode,
    join_output,
    rank_key_sql,
)
from pipeline.keygroups import key_group_expr, subtask_expr
from pipeline.operators.aggregate_functions import (
    MASK_PREFIX,
    mask_sql,
    masked_aggs,
    needs_extended_kernel,
    output_fields,
    state_fields,
)
from pipeline.operators.retract import SIGN, flow_schema, kernel_aggs
from pipeline.operators.ttl import ROW_EPOCH
from pipeline.runtime.operators.aggregate import EXACT_SUM, AggTaskSpec, make_agg_task
from pipeline.runtime.operators.dead_letters import (
    operator_dead_letter_prefix,
)
from pipeline.runtime.operators.dedup import DedupTaskSpec, make_dedup_task
from pipeline.runtime.operators.join import JoinTaskSpec, make_join_task
from pipeline.runtime.operators.process import ProcessTaskSpec, make_process_task
from pipeline.runtime.operators.rank import RankTaskSpec, make_rank_task
from pipeline.runtime.operators.registry import OperatorTraits, register_operator
from pipeline.runtime.operators.round_params import EPOCH_TAG
from pipeline.runtime.operators.sink_writer import UPSERT_ORDER, WriterTaskSpec, make_writer_task, visible_columns
from pipeline.runtime.operators.task import (
    HANDLE_DDL,
    HANDLE_TAGGED_DDL,
)
from pipeline.runtime.operators.window import CHANNEL, MARKER, SEC, WindowTaskSpec, check_window, make_window_task
from pipeline.runtime.operators.writer_nodes import SinkWriterNode
from pipeline.runtime.spark.dataflow import (
    _INTERNAL,
    OperatorIO,
    arrow_schema_of,
    drop_internal,
    handle_ddl,
    with_tag,
)
from pipeline.runtime.spark.retract_join_plan import check_join, keyed_join_inputs, retract_join_dataframe
from pipeline.runtime.spark.retract_plan import check_aggregate, retract_dataframe
from pipeline.runtime.spark.routing import route_by_key_group, shuffle_to_subtasks, with_beacons
from pipeline.runtime.spark.task_requests import counted
from pipeline.sink.partitions import check_partition_types
from pipeline.state.backend import KG_COLUMN
from pipeline.updating_streams import emits_changelog, reads_changelog, writer_reads_changelog
from pipeline.windows.aggregate import EmitMode, WindowSpec, output_schema
from pipeline.windows.channels import check_channel_names, forwards_channels, needs_channels, operator_channel
from pipeline.windows.watermark import merge_observations, observe_channels

__all__ = ["join_dataframe", "aggregate_dataframe", "dedup_dataframe", "window_dataframe", "process_dataframe",
           "rank_dataframe", "writer_dataframe"]


@register_operator(JoinNode, OperatorTraits(row_epochs=True, parks_channels=True, check=check_join))
def join_dataframe(spark, job: Job, op: JoinNode, resolve, io: OperatorIO):
    """The join operator: both inputs keyed by ``op.on`` and shuffled together (``_side`` 0/1)."""
    from pyspark.sql import functions as F
    P, MP = io.parallelism, io.max_parallelism
    if reads_changelog(job, op):   # an updating input: the retracting join (docs/operators.md "Updating streams")
        left, right = keyed_join_inputs(op, resolve)
        return retract_join_dataframe(spark, job, op, left, right, io)
    # a window (or an interval/temporal join) reads its rows: each input row keeps its watermark channel, in state
    # too, and an output row carries both rows' (docs/concepts/watermarks.md)
    channel = CHANNEL if needs_channels(job, job.node_id(op)) else None
    tagger = channel_tagger(job) if channel else None
    left, right = keyed_join_inputs(op, lambda nid: resolve(nid, tagger))   # several key columns: one computed
    for side, d in (("left", left), ("right", right)):
        if op.on not in d.columns or "_ingest_ts" not in d.columns:
            raise ConfigError(f"join {op.uid}: {side} input needs columns {op.on!r} and _ingest_ts, has "
                              f"{[c for c in d.columns if c not in _INTERNAL]}")
    # "_park" (unaligned checkpoints only) flags rows in flight at the join: a routing flag, not data
    # internal columns (source positions, routing flags) are not the user's: never joined, never output
    lcols = tuple(c for c in left.columns if c not in _INTERNAL)
    rcols = tuple(c for c in right.columns if c not in _INTERNAL)
    carried = (channel,) if channel else ()   # kept in state, not output to a sink

    def own_epoch(d):  # records of an untagged input (e.g. a window's output) get the checkpoint's epoch in the task
        return F.col(ROW_EPOCH) if ROW_EPOCH in d.columns else F.lit(None).cast("long").alias(ROW_EPOCH)
    lsch = arrow_schema_of(left.select(*lcols, *carried))
    rsch = arrow_schema_of(right.select(*rcols, *carried))
    def extra(d):  # routing flags that ride along: unaligned parking, a tagged round's epoch
        return [c for c in ("_park", EPOCH_TAG) if c in d.columns and (c != EPOCH_TAG or io.tagged)]
    left, right = (left.select(*lcols, *carried, own_epoch(left), *extra(left)),
                   right.select(*rcols, *carried, own_epoch(right), *extra(right)))
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
    if channel:
        check_channel_names(job, op.uid)
        flow_schema = flow_schema.append(pa.field(channel, pa.string()))
    spec = JoinTaskSpec(op.uid, io.checkpoint, op.on, lcols + carried, rcols + carried, output, P, MP, io.ttl_cutoff_us,
                        io.parent_handles, io.state_prefix, io.output_prefix, io.output_name, io.file_tag,
                        lsch, rsch, out_schema, io.ack_prefix, io.replay_handles or {}, io.channel_prefix,
                        flow_schema, how=op.how, unique=op.unique, bad_records=io.bad_records,
                        dead_letter_root=io.dead_letter_root, job=job.name, ttl_us=io.ttl_us,
                        epoch_us=io.epoch_us, epoch=io.epoch, channel=channel)
    result = shuffled.mapInArrow(counted(make_join_task(spec), io.requests), handle_ddl(io) if io.ack_prefix is None
                                 else schema_ddl(with_tag(flow_schema, io)))
    return result, out_schema  # the full output schema (what a sink gets), not the chained flow_schema


@register_operator(AggregateNode, OperatorTraits(merges_upserts=True, check=check_aggregate))
def aggregate_dataframe(spark, job: Job, op: AggregateNode, resolve, io: OperatorIO):
    """The running keyed aggregate: input keyed by ``op.key``, exact decimal sums in state. Over a changelog
    (an updating stream, docs/operators.md "Updating streams"): the retraction kernel; with a consumer reading
    its changelog: the flowing rows are one (``_sign``)."""
    P, MP = io.parallelism, io.max_parallelism
    full = resolve(op.parent)
    aggs = op.aggs
    retracting = reads_changelog(job, op)
    if op.filters:  # FILTER (WHERE ...): each filtered aggregate reads its masked column (aggregate_functions)
        full = full.selectExpr("*", *[f"{sql} AS `{name}`" for name, sql in mask_sql(op.aggs, op.filters)])
        aggs = (kernel_aggs(op.aggs, op.filters, MASK_PREFIX) if retracting
                else masked_aggs(op.aggs, op.filters))
    if retracting:
        return retract_dataframe(spark, job, op, full, aggs, io)
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
    changelog = emits_changelog(job, job.node_id(op))
    spec = AggTaskSpec(op.uid, io.checkpoint, op.key, aggs, state_schema, P, MP, io.parent_handles,
                       io.state_prefix, io.output_prefix, io.output_name, io.file_tag, io.ack_prefix,
                       out_schema, tuple(io.prior_output), changelog=changelog)
    flow = flow_schema(out_schema) if changelog else out_schema
    result = shuffled.mapInArrow(counted(make_agg_task(spec), io.requests), handle_ddl(io) if io.ack_prefix is None
                                 else schema_ddl(with_tag(flow, io)))
    return result, out_schema


@register_operator(DedupNode, OperatorTraits(row_epochs=True))
def dedup_dataframe(spark, job: Job, op: DedupNode, resolve, io: OperatorIO):
    P, MP = io.parallelism, io.max_parallelism
    forward = needs_channels(job, job.node_id(op))  # a window reads its rows: they keep their watermark channel
    src = drop_internal(resolve(op.parent, channel_tagger(job)) if forward else resolve(op.parent))
    if forward:  # last: the kernel's tie-break after the user's columns (as the batch rule's)
        src = src.select(*[c for c in src.columns if c != CHANNEL], CHANNEL)
    elif CHANNEL in src.columns:
        src = src.drop(CHANNEL)
    if "_park" in src.columns:
        src = src.drop("_park")
    tag = [EPOCH_TAG] if io.tagged else []  # tagged round: the epoch rides along, outside the task's schema
    if EPOCH_TAG in src.columns and not io.tagged:
        src = src.drop(EPOCH_TAG)
    for c in (op.key, "_ingest_ts"):
        if c not in src.columns:
            raise ConfigError(f"deduplicate {op.uid}: input lacks column {c!r} (has {src.columns})")
    if ROW_EPOCH not in src.columns:  # an untagged input: the task fills in the checkpoint's epoch
        from pyspark.sql import functions as F
        src = src.withColumn(ROW_EPOCH, F.lit(None).cast("long"))
    in_schema = arrow_schema_of(src.drop(*tag) if tag else src)
    user_schema = pa.schema([f for f in in_schema if f.name not in (ROW_EPOCH, CHANNEL)])
    shuffled = route_by_key_group(src.withColumn(KG_COLUMN, key_group_expr(op.key, MP)), spark, KG_COLUMN, P, MP)
    spec = DedupTaskSpec(op.uid, io.checkpoint, op.key, in_schema, P, MP, io.parent_handles, io.state_prefix,
                         io.output_prefix, io.output_name, io.file_tag, io.ttl_cutoff_us, io.ack_prefix,
                         ttl_us=io.ttl_us, epoch_us=io.epoch_us, epoch=io.epoch, user_schema=user_schema,
                         to_sink=any(s.parent == job.node_id(op) for s in job.sinks()))
    out_ddl = schema_ddl(in_schema.append(pa.field(EPOCH_TAG, pa.int64())) if tag else in_schema)
    result = shuffled.mapInArrow(counted(make_dedup_task(spec), io.requests), (HANDLE_TAGGED_DDL if tag else HANDLE_DDL)
                                 if io.ack_prefix is None else out_ddl)
    return result, user_schema


@register_operator(RankNode, OperatorTraits(merges_upserts=True))
def rank_dataframe(spark, job: Job, op: RankNode, resolve, io: OperatorIO):
    """Top-N per key: the input keyed by ``op.key`` (a column, or the JSON of several: ``rank_key_sql``)."""
    from pyspark.sql import functions as F
    P, MP = io.parallelism, io.max_parallelism
    src = resolve(op.parent)
    internal = {"_source", "_partition", "_seq", "_row", "_park", ROW_EPOCH, EPOCH_TAG, KG_COLUMN, CHANNEL}
    user = [c for c in src.columns if c not in internal]
    missing = [c for c in list(op.keys) + [c for c, _ in op.order_by] if c not in user]
    if missing:
        raise ConfigError(f"top_n {op.uid}: input lacks columns {missing} (has {user})")
    if op.rank_column and op.rank_column in user:
        raise ConfigError(f"top_n {op.uid}: the rank column {op.rank_column!r} is already a column of its input")
    df = src.select(*user, *([EPOCH_TAG] if io.tagged else []))
    if op.key not in user:  # several key columns: keyed by one column computed from them
        df = df.withColumn(op.key, F.expr(rank_key_sql(op.keys)))
    in_schema = arrow_schema_of(df.drop(EPOCH_TAG) if io.tagged else df)
    out_fields = [f for f in in_schema if f.name != op.key or op.key in user]
    if op.rank_column:
        out_fields.append(pa.field(op.rank_column, pa.int64()))
    out_schema = pa.schema(out_fields)
    own = job.operator_sink(job.node_id(op))   # the sink its tasks stage (upsert: merged over rounds)
    shuffled = route_by_key_group(df.withColumn(KG_COLUMN, key_group_expr(op.key, MP)), spark, KG_COLUMN, P, MP)
    spec = RankTaskSpec(op.uid, io.checkpoint, op.key, op.order_by, op.n, in_schema, out_schema, op.rank_column,
                        P, MP, io.parent_handles, io.state_prefix, io.output_prefix, io.output_name, io.file_tag,
                        io.ack_prefix, tuple(own.key) if own is not None else (), tuple(io.prior_output),
                        to_sink=own is not None, changelog=emits_changelog(job, job.node_id(op)))
    flow = flow_schema(out_schema) if spec.changelog else out_schema   # an aggregate reads it (updating_streams)
    result = shuffled.mapInArrow(counted(make_rank_task(spec), io.requests), handle_ddl(io) if io.ack_prefix is None
                                 else schema_ddl(with_tag(flow, io)))
    return result, out_schema


def _with_markers(df, spark, event_time: str, key: str, parallelism: int):
    """``df`` plus, per upstream Spark task and channel, one marker row to every subtask (its max event time).
    A tagged round (rows carry :data:`~pipeline.runtime.operators.round_params.EPOCH_TAG`): one marker per epoch and channel,
    tagged with its epoch, so each epoch's watermark advances by that epoch's records only, as in its own round."""
    in_schema = arrow_schema_of(df)
    out_schema = in_schema.append(pa.field(MARKER, pa.int64()))
    P = parallelism
    tagged = EPOCH_TAG in in_schema.names

    def mark(batches):
        seen: dict[int | None, dict[str, int]] = {}   # epoch tag (None: untagged) -> channel -> max event time
        for b in batches:
            if b.num_rows:
                tags = [t for t in pc.unique(b.column(EPOCH_TAG)).to_pylist() if t is not None] if tagged else [None]
                for tag in tags:
                    part = b if tag is None else b.filter(pc.equal(b.column(EPOCH_TAG), tag))
                    seen[tag] = merge_observations(seen.get(tag, {}), observe_channels(
                        part.column(CHANNEL), part.column(event_time), part.column(key)))
                b = b.append_column(MARKER, pa.nulls(b.num_rows, pa.int64()))
                yield pa.RecordBatch.from_arrays([b.column(i).cast(f.type) for i, f in enumerate(out_schema)],
                                                 schema=out_schema)
        for tag in sorted((t for t in seen if seen[t]), key=lambda t: -1 if t is None else t):
            obs = seen[tag]
            chans = sorted(obs)
            n = len(chans) * P
            cols = {}
            for f in out_schema:
                if f.name == CHANNEL:
                    cols[f.name] = pa.array([c for c in chans for _ in range(P)], f.type)
                elif f.name == "_subtask":
                    cols[f.name] = pa.array([s for _ in chans for s in range(P)], f.type)
                elif f.name == MARKER:
                    cols[f.name] = pa.array([obs[c] for c in chans for _ in range(P)], pa.int64())
                elif f.name == EPOCH_TAG:
                    cols[f.name] = pa.array([tag] * n, f.type)
                else:
                    cols[f.name] = pa.nulls(n, f.type)
            yield pa.RecordBatch.from_pydict(cols, schema=out_schema)

    return df.mapInArrow(mark, schema_ddl(out_schema))


def channel_tagger(job: Job):
    """``prepare(base, df)`` for ``resolve``: the watermark channel of each row (:mod:`pipeline.windows.channels`):
    its source partition, the channel a forwarding operator's rows carry, or ``op:<uid>`` of the operator that
    built it."""
    from pyspark.sql import functions as F
    operator_ids = {job.node_id(o) for o in job.operators()}

    def tag_channel(base: int, df):
        if base in operator_ids:
            if forwards_channels(job.nodes[base], job) and CHANNEL in df.columns:
                return df
            return df.withColumn(CHANNEL, F.lit(operator_channel(job, base)))
        return df.withColumn(CHANNEL, F.concat(F.col("_source"), F.lit("/"), F.col("_partition").cast("string")))
    return tag_channel


@register_operator(WindowNode, OperatorTraits(check=check_window))
def window_dataframe(spark, job: Job, op: WindowNode, resolve, io):
    """The (lazy) DataFrame of a window operator and its output schema (see ``operator_dataframe``)."""
    P, MP = io.parallelism, io.max_parallelism
    df = resolve(op.parent, channel_tagger(job))
    if op.filters:  # FILTER (WHERE ...): each filtered aggregate reads its masked column (aggregate_functions)
        df = df.selectExpr("*", *[f"{sql} AS `{name}`" for name, sql in mask_sql(op.aggs, op.filters)])
    wspec = WindowSpec(op.key, op.event_time, op.size_seconds * SEC, op.slide_seconds * SEC,
                       op.max_out_of_orderness_seconds * SEC, op.allowed_lateness_seconds * SEC,
                       masked_aggs(op.aggs, op.filters), EmitMode(op.emit), op.gap_seconds * SEC)
    needed = [op.key, op.event_time] + wspec.input_columns()
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise ConfigError(f"window {op.uid}: input lacks columns {missing} (has {[c for c in df.columns if not c.startswith('_')]})")
    # every column flows to the task (a late record is dead-lettered whole); state keeps only what the aggs read
    df = df.select(*dict.fromkeys(needed + [c for c in df.columns if c not in ("_park", "_pepoch")]))
    et = dict(df.dtypes)[op.event_time]
    if not et.startswith("timestamp"):
        raise ConfigError(f"window {op.uid}: event_time column {op.event_time!r} must be a timestamp, is {et}")
    df = df.withColumn(KG_COLUMN, key_group_expr(op.key, MP)).withColumn("_subtask", subtask_expr(KG_COLUMN, MP, P))
    in_schema = arrow_schema_of(df)
    marked = with_beacons(_with_markers(df, spark, op.event_time, op.key, P), spark, P)
    shuffled = shuffle_to_subtasks(marked, spark, "_subtask", P)
    # the task's rows: a tagged round's epoch tag rides along outside them (run_epochs splits by it)
    task_in = pa.schema([f for f in in_schema if f.name not in ("_subtask", EPOCH_TAG)])
    out_schema = output_schema(wspec, task_in)
    flow_schema = (out_schema.append(pa.field("_ingest_ts", pa.timestamp("us", tz="UTC")))
                   if io.ack_prefix is not None else None)
    spec = WindowTaskSpec(op.uid, io.checkpoint, wspec, task_in, P, MP, io.parent_handles, io.state_prefix,
                          io.output_prefix, io.output_name, io.file_tag, out_schema,
                          operator_dead_letter_prefix(io.dead_letter_root or "", job.name, op.uid), io.bad_records,
                          io.ack_prefix, io.epoch, io.complete,
                          io.barrier_us, flow_schema, replayed=io.replayed)
    result = shuffled.mapInArrow(counted(make_window_task(spec), io.requests),
                                 handle_ddl(io) if io.ack_prefix is None else schema_ddl(with_tag(flow_schema, io)))
    return result, flow_schema or out_schema


@register_operator(ProcessNode)
def process_dataframe(spark, job: Job, op: ProcessNode, resolve, io):
    """The (lazy) DataFrame of a ``process`` operator and its output schema."""
    P, MP = io.parallelism, io.max_parallelism
    df = resolve(op.parent)
    if op.key not in df.columns:
        raise ConfigError(f"process {op.uid}: input lacks the key column {op.key!r}")
    internal = {"_source", "_partition", "_seq", "_row", "_park", "_pepoch", EPOCH_TAG, CHANNEL}
    df_user = df.select(*[c for c in df.columns if c not in internal])
    in_schema = arrow_schema_of(df_user)
    # a tagged round (several epochs): the epoch rides along to the task, outside the user's rows
    df = df.select(*df_user.columns, EPOCH_TAG) if io.tagged else df_user
    shuffled = route_by_key_group(df.withColumn(KG_COLUMN, key_group_expr(op.key, MP)), spark, KG_COLUMN, P, MP)
    spec = ProcessTaskSpec(op.uid, io.checkpoint, op.key, op.fn, op.state_schema, op.output_schema, in_schema,
                           op.ttl_seconds, P, MP, io.parent_handles, io.state_prefix, io.output_prefix,
                           io.output_name, io.file_tag, io.ack_prefix, io.barrier_us)
    result = shuffled.mapInArrow(counted(make_process_task(spec), io.requests), handle_ddl(io) if io.ack_prefix is None
                                 else schema_ddl(with_tag(op.output_schema, io)))
    return result, op.output_schema


@register_operator(SinkWriterNode, OperatorTraits(merges_upserts=True))
def writer_dataframe(spark, job: Job, node: SinkWriterNode, resolve, io: OperatorIO):
    """The (lazy) DataFrame of a sink writer: its tasks' reports, and the sink's schema."""
    s = node.sink
    df = resolve(node.parent)
    cols = visible_columns(job, node.parent, df.columns, _INTERNAL | {"_park"})
    if not cols:
        raise ConfigError(f"sink {s.table!r}: its stream has no columns")
    if s.mode == "upsert":
        missing = [k for k in s.key if k not in cols]
        if missing:
            raise ConfigError(f"sink {s.table!r}: upsert key {missing} is not a column of its stream (has {cols})")
    out_schema = arrow_schema_of(df.select(*cols))
    check_partition_types(s.table, out_schema, s.partition_by)
    tag = [EPOCH_TAG] if io.tagged and EPOCH_TAG in df.columns else []
    order = tuple(c for c in UPSERT_ORDER if c in df.columns) if s.mode == "upsert" else ()
    deletes = writer_reads_changelog(job, s)   # a changelog to an upsert sink: deletes (pipeline.sink.deletes)
    if s.mode == "upsert":
        extra = [c for c in order if c not in cols] + ([SIGN] if deletes and SIGN in df.columns else [])
        df = df.select(*cols, *extra, *tag).withColumn(KG_COLUMN, key_group_expr(s.key, io.max_parallelism))
        df = route_by_key_group(df, spark, KG_COLUMN, io.parallelism, io.max_parallelism)
    else:
        df = df.select(*cols, *tag)
    spec = WriterTaskSpec(node.uid, io.checkpoint, s.table, s.mode, tuple(s.key), out_schema, order, io.parallelism,
                          io.max_parallelism, io.output_prefix, io.output_name, io.file_tag, tuple(io.prior_output),
                          io.epoch, partition_by=tuple(s.partition_by), deletes=deletes)
    return df.mapInArrow(counted(make_writer_task(spec), io.requests), handle_ddl(io)), out_schema
