"""The Spark plan of the interval join and the temporal join (registered for their node types,
:mod:`pipeline.runtime.operators.registry`): each input tagged with its watermark channel and given the window's
marker rows (:func:`pipeline.runtime.spark.operator_plans._with_markers`), both keyed by the join key, flagged
``_side`` 0/1 and shuffled together to the subtasks, then mapped with
:func:`pipeline.runtime.operators.timed_join.make_timed_join_task`."""
from __future__ import annotations

import pyarrow as pa

from pipeline.arrow_ddl import schema_ddl
from pipeline.exceptions import ConfigError
from pipeline.job import IntervalJoinNode, Job, TemporalJoinNode
from pipeline.keygroups import key_group_expr, subtask_expr
from pipeline.operators.interval_join import IntervalJoinSpec
from pipeline.operators.interval_join import output_schema as interval_output
from pipeline.operators.temporal_join import TemporalJoinSpec
from pipeline.operators.temporal_join import output_schema as temporal_output
from pipeline.runtime.operators.dead_letters import operator_dead_letter_prefix
from pipeline.runtime.operators.registry import OperatorTraits, register_operator
from pipeline.runtime.operators.round_params import EPOCH_TAG
from pipeline.runtime.operators.timed_join import SIDE, TimedJoinTaskSpec, check_timed_join, make_timed_join_task
from pipeline.runtime.operators.window import CHANNEL, SEC
from pipeline.runtime.spark.dataflow import _INTERNAL, OperatorIO, arrow_schema_of, handle_ddl, with_tag
from pipeline.runtime.spark.operator_plans import _with_markers, channel_tagger
from pipeline.runtime.spark.routing import shuffle_to_subtasks, with_beacons
from pipeline.runtime.spark.task_requests import counted
from pipeline.state.backend import KG_COLUMN

__all__ = ["timed_join_dataframe"]

_TS = pa.timestamp("us", tz="UTC")


def _side_frame(spark, job: Job, op, resolve, nid: int, side: str, time_col: str, io: OperatorIO):
    """One input: its user columns (the time as µs timestamps), the key group, the subtask, the channel, markers
    (the temporal join's versions keep ``_ingest_ts``: it orders versions with equal times)."""
    from pyspark.sql import functions as F
    P, MP = io.parallelism, io.max_parallelism
    keep_ingest = isinstance(op, TemporalJoinNode) and side == "right"
    df = resolve(nid, channel_tagger(job))   # watermark channels, forwarded by deduplicates (windows.channels)
    user = [c for c in df.columns if c not in _INTERNAL and c not in ("_park", "_pepoch", CHANNEL, EPOCH_TAG)
            and (c != "_ingest_ts" or keep_ingest)]
    missing = [c for c in (op.on, time_col) if c not in user]
    if missing:
        raise ConfigError(f"join {op.uid}: the {side} input lacks columns {missing} (has {user})")
    dt = dict(df.dtypes)[time_col]
    if not dt.startswith("timestamp"):
        raise ConfigError(f"join {op.uid}: the {side} time column {time_col!r} must be a timestamp, is {dt}")
    tag = [EPOCH_TAG] if EPOCH_TAG in df.columns else []
    df = df.select(*user, CHANNEL, *tag)
    df = df.withColumn(KG_COLUMN, key_group_expr(op.on, MP)).withColumn("_subtask", subtask_expr(KG_COLUMN, MP, P))
    schema = arrow_schema_of(df.select(*user, KG_COLUMN))
    marked = _with_markers(df.withColumn(SIDE, F.lit(0 if side == "left" else 1).cast("byte")), spark, time_col,
                           op.on, P)
    return marked, schema


def _kernel(op, lsch: pa.Schema, rsch: pa.Schema):
    internal = (KG_COLUMN,)
    try:
        if isinstance(op, IntervalJoinNode):
            k: IntervalJoinSpec | TemporalJoinSpec = IntervalJoinSpec(
                op.on, op.left_time, op.right_time, op.lower_seconds * SEC, op.upper_seconds * SEC, internal, op.how)
            return k, interval_output(k, lsch, rsch)  # type: ignore[arg-type]
        k = TemporalJoinSpec(op.on, op.time, op.version_time, op.how, internal)
        return k, temporal_output(k, lsch, rsch)  # type: ignore[arg-type]
    except ValueError as e:
        raise ConfigError(f"join {op.uid}: {e}") from None


@register_operator(IntervalJoinNode, OperatorTraits(check=check_timed_join))
@register_operator(TemporalJoinNode, OperatorTraits(check=check_timed_join))
def timed_join_dataframe(spark, job: Job, op: IntervalJoinNode | TemporalJoinNode, resolve, io: OperatorIO):
    """The (lazy) DataFrame of an interval or temporal join and its output schema."""
    P, MP = io.parallelism, io.max_parallelism
    lt, rt = (op.time, op.version_time) if isinstance(op, TemporalJoinNode) else (op.left_time, op.right_time)
    left, lsch = _side_frame(spark, job, op, resolve, op.left, "left", lt, io)
    right, rsch = _side_frame(spark, job, op, resolve, op.right, "right", rt, io)
    if lsch.field(op.on).type != rsch.field(op.on).type:
        raise ConfigError(f"join {op.uid}: the key {op.on!r} is {lsch.field(op.on).type} on the left, "
                          f"{rsch.field(op.on).type} on the right; cast one side with select()")
    kernel, out_schema = _kernel(op, lsch, rsch)
    both = left.unionByName(right, allowMissingColumns=True)
    shuffled = shuffle_to_subtasks(with_beacons(both, spark, P), spark, "_subtask", P)
    flow_schema = out_schema.append(pa.field("_ingest_ts", _TS)) if io.ack_prefix is not None else None
    spec = TimedJoinTaskSpec(op.uid, io.checkpoint, kernel, lsch, rsch, op.max_out_of_orderness_seconds * SEC, P, MP,
                             io.parent_handles, io.state_prefix, io.output_prefix, io.output_name, io.file_tag,
                             out_schema, operator_dead_letter_prefix(io.dead_letter_root or "", job.name, op.uid),
                             io.bad_records, io.ack_prefix, io.epoch, io.complete, io.barrier_us, flow_schema,
                             replayed=io.replayed)
    result = shuffled.mapInArrow(counted(make_timed_join_task(spec), io.requests),
                                 handle_ddl(io) if io.ack_prefix is None else schema_ddl(with_tag(flow_schema, io)))
    return result, flow_schema or out_schema

