"""The Spark side of an aggregate over an updating stream (docs/operators.md "Updating streams"): the input, a
changelog of a running aggregate (``_sign``), keyed by the aggregate's key and mapped with the aggregate task in
its retraction mode (:class:`~pipeline.runtime.operators.aggregate.AggTaskSpec` ``retract``; kernel:
:mod:`pipeline.operators.retract`); and the refusal, before anything runs, of the updating inputs it cannot consume
(:func:`pipeline.updating_streams.unsupported_reason`)."""
from __future__ import annotations

import pyarrow as pa

from pipeline.arrow_ddl import schema_ddl
from pipeline.exceptions import ConfigError
from pipeline.job import AggregateNode, Job
from pipeline.keygroups import key_group_expr
from pipeline.operators.retract import SIGN, flow_schema
from pipeline.operators.retract import output_fields as retract_output_fields
from pipeline.operators.retract import state_fields as retract_state_fields
from pipeline.runtime.operators.aggregate import AggTaskSpec, make_agg_task
from pipeline.runtime.operators.round_params import EPOCH_TAG
from pipeline.runtime.spark.dataflow import OperatorIO, arrow_schema_of, handle_ddl, with_tag
from pipeline.runtime.spark.routing import route_by_key_group
from pipeline.runtime.spark.task_requests import counted
from pipeline.updating_streams import emits_changelog, sink_deletes, unsupported_reason

__all__ = ["check_aggregate", "retract_dataframe"]


def check_aggregate(job: Job, op: AggregateNode, _config) -> None:
    """Refuse an aggregate over an updating stream its runtime cannot consume exactly (pipeline.updating_streams)."""
    why = unsupported_reason(job, op)
    if why is not None:
        raise ConfigError(f"job {job.name!r}: {why}")


def retract_dataframe(spark, job: Job, op: AggregateNode, full, aggs, io: OperatorIO):
    """An aggregate over a changelog: the retraction kernel (pipeline.operators.retract), keyed by ``op.key``."""
    needed = [op.key] + sorted({c for _, _fn, c in aggs if c})
    missing = [c for c in needed if c not in full.columns]
    if missing:
        raise ConfigError(f"aggregate {op.uid}: input lacks columns {missing}")
    if SIGN not in full.columns:   # the updating base emits it (a union fills it with null: +1)
        raise ConfigError(f"aggregate {op.uid}: its updating input carries no {SIGN!r} column (a step between "
                          "the updating operator and it drops it: only filter, select and union keep it)")
    src = full.select(*needed, SIGN, *([EPOCH_TAG] if io.tagged else []))
    in_schema = arrow_schema_of(full.select(*needed))
    state_schema = pa.schema([in_schema.field(op.key)] + retract_state_fields(aggs, in_schema))
    out_schema = pa.schema([in_schema.field(op.key)] + retract_output_fields(aggs, in_schema))
    shuffled = route_by_key_group(src.withColumn("_kg", key_group_expr(op.key, io.max_parallelism)), spark, "_kg",
                                  io.parallelism, io.max_parallelism)
    changelog = emits_changelog(job, job.node_id(op))
    own = job.operator_sink(job.node_id(op))   # its own upsert sink deletes the emptied groups (pipeline.sink.deletes)
    spec = AggTaskSpec(op.uid, io.checkpoint, op.key, aggs, state_schema, io.parallelism, io.max_parallelism,
                       io.parent_handles, io.state_prefix, io.output_prefix, io.output_name, io.file_tag,
                       io.ack_prefix, out_schema, tuple(io.prior_output), retract=True, changelog=changelog,
                       sink_deletes=own is not None and sink_deletes(job, own))
    flow = flow_schema(out_schema) if changelog else out_schema
    result = shuffled.mapInArrow(counted(make_agg_task(spec), io.requests), handle_ddl(io) if io.ack_prefix is None
                                 else schema_ddl(with_tag(flow, io)))
    return result, out_schema
