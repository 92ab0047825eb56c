"""The Spark side of a join reading an updating stream (docs/operators.md "Updating streams"): both inputs (a
changelog carries ``_sign``; an append stream's rows count +1) keyed by the join key, shuffled together and mapped
with the retracting join task (:mod:`pipeline.runtime.operators.retract_join`; kernel:
:mod:`pipeline.operators.retract_join`); and the refusal, before anything runs, of what it cannot run exactly
(:func:`pipeline.updating_streams.join_unsupported_reason`)."""
from __future__ import annotations

import pyarrow as pa

from pipeline.arrow_ddl import schema_ddl
from pipeline.exceptions import ConfigError
from pipeline.job import Job, JoinNode, join_key_sql, join_output
from pipeline.keygroups import key_group_expr
from pipeline.operators.retract import SIGN, flow_schema
from pipeline.runtime.operators.retract_join import RetractJoinTaskSpec, make_retract_join_task
from pipeline.runtime.operators.round_params import EPOCH_TAG
from pipeline.runtime.spark.dataflow import _INTERNAL, OperatorIO, arrow_schema_of, handle_ddl, with_tag
from pipeline.runtime.spark.routing import route_by_key_group
from pipeline.runtime.spark.task_requests import counted
from pipeline.updating_streams import join_unsupported_reason

__all__ = ["check_join", "retract_join_dataframe", "keyed_join_inputs"]


def keyed_join_inputs(op: JoinNode, resolve):
    """Both inputs of a join (every join); on several key columns, keyed by one column computed from them
    (:func:`pipeline.job.join_key_sql`)."""
    from pyspark.sql import functions as F  # lazy: pyspark is imported where Spark already runs
    left, right = resolve(op.left), resolve(op.right)
    if op.keys:
        for side, d in (("left", left), ("right", right)):
            missing = [k for k in op.keys if k not in d.columns]
            if missing:
                raise ConfigError(f"join {op.uid}: {side} input lacks key columns {missing}")
        left = left.withColumn(op.on, F.expr(join_key_sql(op.keys)))
        right = right.withColumn(op.on, F.expr(join_key_sql(op.keys)))
    return left, right


def check_join(job: Job, op: JoinNode, _config) -> None:
    """Refuse a join over an updating stream that its runtime cannot run exactly (pipeline.updating_streams)."""
    why = join_unsupported_reason(job, op)
    if why is not None:
        raise ConfigError(f"job {job.name!r}: {why}")


def retract_join_dataframe(spark, job: Job, op: JoinNode, left, right, io: OperatorIO):
    """A join over changelogs (``left``/``right``: the inputs' DataFrames, the key column computed)."""
    from pyspark.sql import functions as F  # lazy: pyspark is imported where Spark already runs
    for side, d in (("left", left), ("right", right)):
        if "_park" in d.columns:
            raise ConfigError(f"join {op.uid}: reads an updating stream, which unaligned checkpoints do not support "
                              "yet (PIPELINE_UNALIGNED=true)")
        if op.on not in d.columns:
            raise ConfigError(f"join {op.uid}: {side} input lacks the key column {op.on!r}")
    skip = _INTERNAL | {"_ingest_ts"}
    lcols = tuple(c for c in left.columns if c not in skip)
    rcols = tuple(c for c in right.columns if c not in skip)
    clash = (set(lcols) & set(rcols)) - {op.on, *op.keys}
    if clash:
        raise ConfigError(f"join {op.uid}: both inputs have columns {sorted(clash)}; rename them on one side "
                          f"with select() (e.g. select('{sorted(clash)[0]} AS right_{sorted(clash)[0]}', ...))")
    output = tuple(join_output(op, lcols, rcols))
    unknown = [c for c in output if c not in lcols and c not in rcols]
    if unknown:
        raise ConfigError(f"join {op.uid}: output columns {unknown} are in neither input "
                          f"(left has {list(lcols)}, right has {list(rcols)})")
    lsch, rsch = arrow_schema_of(left.select(*lcols)), arrow_schema_of(right.select(*rcols))
    joined = {**{f.name: f for f in rsch}, **{f.name: f for f in lsch}}
    out_schema = pa.schema([joined[c].with_nullable(True) for c in output])
    tag = [EPOCH_TAG] if io.tagged else []

    def signed(d, code: int, cols):
        sign = F.col(SIGN).cast("int") if SIGN in d.columns else F.lit(1).cast("int")
        return d.select(*cols, sign.alias(SIGN), *tag).withColumn("_side", F.lit(code).cast("byte"))
    both = signed(left, 0, lcols).unionByName(signed(right, 1, rcols), allowMissingColumns=True)
    kg = key_group_expr(op.on, io.max_parallelism)
    shuffled = route_by_key_group(both.withColumn("_kg", kg), spark, "_kg", io.parallelism, io.max_parallelism)
    spec = RetractJoinTaskSpec(op.uid, io.checkpoint, op.on, lsch, rsch,
                               tuple((c, "l" if c in lcols else "r") for c in output), out_schema, io.parallelism,
                               io.max_parallelism, io.parent_handles, io.state_prefix, io.output_prefix,
                               io.output_name, io.file_tag, io.ack_prefix, epoch=io.epoch)
    flow = flow_schema(out_schema)
    result = shuffled.mapInArrow(counted(make_retract_join_task(spec), io.requests),
                                 handle_ddl(io) if io.ack_prefix is None else schema_ddl(with_tag(flow, io)))
    return result, out_schema
