"""The Spark plan of the over aggregate (registered for :class:`~pipeline.job.OverAggregateNode`,
:mod:`pipeline.runtime.operators.registry`): the input tagged with its watermark channel and given the window's
marker rows (:func:`pipeline.runtime.spark.operator_plans._with_markers`), keyed by the partition key and shuffled
to the subtasks, then mapped with :func:`pipeline.runtime.operators.over_aggregate.make_over_task`."""
from __future__ import annotations

import pyarrow as pa

from pipeline.arrow_ddl import schema_ddl
from pipeline.exceptions import ConfigError
from pipeline.job import Job, OverAggregateNode
from pipeline.keygroups import key_group_expr, subtask_expr
from pipeline.operators.over_aggregate import OverSpec, output_schema
from pipeline.operators.retract import SIGN
from pipeline.runtime.operators.dead_letters import operator_dead_letter_prefix
from pipeline.runtime.operators.over_aggregate import OverTaskSpec, check_over, make_over_task
from pipeline.runtime.operators.registry import OperatorTraits, register_operator
from pipeline.runtime.operators.round_params import EPOCH_TAG
from pipeline.runtime.operators.window import CHANNEL, MARKER, SEC
from pipeline.runtime.spark.dataflow import _INTERNAL, OperatorIO, arrow_schema_of, handle_ddl, with_tag
from pipeline.runtime.spark.operator_plans import _with_markers, channel_tagger
from pipeline.runtime.spark.routing import shuffle_to_subtasks, with_beacons
from pipeline.runtime.spark.task_requests import counted
from pipeline.state.backend import KG_COLUMN
from pipeline.updating_streams import reads_changelog

__all__ = ["over_dataframe"]

_TS = pa.timestamp("us", tz="UTC")


@register_operator(OverAggregateNode, OperatorTraits(merges_upserts=True, check=check_over))
def over_dataframe(spark, job: Job, op: OverAggregateNode, resolve, io: OperatorIO):
    """The (lazy) DataFrame of an over aggregate and its output schema."""
    from pyspark.sql import functions as F  # lazy: pyspark only where a Spark plan is built
    P, MP = io.parallelism, io.max_parallelism
    df = resolve(op.parent, channel_tagger(job))   # watermark channels, forwarded by deduplicates (windows.channels)
    user = [c for c in df.columns if c not in _INTERNAL and c not in ("_park", "_pepoch", "_ingest_ts", "_sign",
                                                                      CHANNEL, EPOCH_TAG)]
    missing = [c for c in (op.key, op.event_time, *(c for _, _, c in op.aggs if c)) if c not in user]
    if missing:
        raise ConfigError(f"over aggregate {op.uid}: the input lacks columns {missing} (has {user})")
    dt = dict(df.dtypes)[op.event_time]
    if not dt.startswith("timestamp"):
        raise ConfigError(f"over aggregate {op.uid}: event_time {op.event_time!r} must be a timestamp, is {dt}")
    tag = [EPOCH_TAG] if EPOCH_TAG in df.columns else []
    changelog = reads_changelog(job, op)   # a retract changelog: each row's _sign (-1/+1) goes to the task
    if changelog and SIGN not in df.columns:
        raise ConfigError(f"over aggregate {op.uid}: its updating input arrives without {SIGN!r} (a step between "
                          "the top-N or aggregate and it drops it)")
    df = df.select(*user, CHANNEL, *tag, *([SIGN] if changelog else []))
    df = df.withColumn(KG_COLUMN, key_group_expr(op.key, MP)).withColumn("_subtask", subtask_expr(KG_COLUMN, MP, P))
    in_schema = arrow_schema_of(df.select(*user, KG_COLUMN))
    try:
        kernel = OverSpec(op.key, op.event_time, op.aggs, op.rows,
                          op.range_seconds * SEC if op.range_seconds is not None else None, (KG_COLUMN,))
        out_schema = output_schema(kernel, in_schema)
    except ValueError as e:
        raise ConfigError(f"over aggregate {op.uid}: {e}") from None
    # over an updating stream no watermark is needed (each change applies at once): no marker rows
    marked = df.withColumn(MARKER, F.lit(None).cast("long")) if changelog else _with_markers(
        df, spark, op.event_time, op.key, P)
    shuffled = shuffle_to_subtasks(with_beacons(marked, spark, P), spark, "_subtask", P)
    own = job.operator_sink(job.node_id(op))   # the sink its tasks stage (upsert: merged over rounds)
    flow_schema = out_schema.append(pa.field("_ingest_ts", _TS)) if io.ack_prefix is not None else None
    if changelog and flow_schema is not None:   # a retract changelog to its sinks' writers (they delete), without
        flow_schema = out_schema.append(pa.field(SIGN, pa.int32()))   # _ingest_ts (not a column of its sinks)
    spec = OverTaskSpec(op.uid, io.checkpoint, kernel, in_schema, op.max_out_of_orderness_seconds * SEC, P, MP,
                        io.parent_handles, io.state_prefix, io.output_prefix, io.output_name, io.file_tag,
                        out_schema, operator_dead_letter_prefix(io.dead_letter_root or "", job.name, op.uid),
                        io.bad_records, io.ack_prefix, io.epoch, io.complete, io.barrier_us, flow_schema,
                        replayed=io.replayed, changelog=changelog,
                        sink_key=tuple(own.key) if own is not None and own.mode == "upsert" else (),
                        prior_output=tuple(io.prior_output or ()))
    result = shuffled.mapInArrow(counted(make_over_task(spec), io.requests),
                                 handle_ddl(io) if io.ack_prefix is None else schema_ddl(with_tag(flow_schema, io)))
    return result, flow_schema or out_schema
