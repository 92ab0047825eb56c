"""Batch rule of the lookup join (docs/operators.md "Lookup join"): each row joined with the side-table version
recorded for its processing epoch ``p(x)`` (:mod:`pipeline.lookup.pins`; aligned exactly-once checkpoints, so
``p(x)`` is the epoch whose checkpoint processed the row). The distinct recorded versions are read once
(:func:`pipeline.lookup.tables.read_pinned`), tagged with a version number, and joined on (key, version) as
SQL joins: a null key matches nothing; ``how="left"`` keeps an unmatched row with nulls. Rows of an epoch with
no recorded version (never processed by the runtime, e.g. a bootstrap over history) are not modelled: the node is
reported not checked, naming the epochs (one small action finds them: the distinct epochs of the input)."""
from __future__ import annotations

import json

import pyarrow as pa

from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.prefix import PEPOCH
from pipeline.job import LookupJoinNode
from pipeline.lookup.pins import read_pins
from pipeline.lookup.tables import read_pinned

__all__ = ["lookup"]

_V, _K, _LV, _E = "__lookup_version", "__lookup_key", "__lookup_v", "__lookup_epoch"


def lookup(plan: PlanContext, nid: int, node: LookupJoinNode):
    from pyspark.sql import functions as F  # lazy: pyspark, imported where Spark already runs
    df = plan.frame(node.parent)
    if df is None:
        plan.bad[nid] = plan.bad[node.parent]
        return None
    runner = plan.runner
    pins = read_pins(runner.ckpt_fio, runner.job_root, node.uid, plan.prefix.epoch)
    if not pins:
        plan.bad[nid] = f"lookup join {node.uid!r}: no side-table version recorded up to epoch {plan.prefix.epoch}"
        return None
    # one small action: the epochs the rows belong to, each of which must have a recorded version
    missing = sorted({r[0] for r in df.select(PEPOCH).distinct().collect()} - set(pins))
    if missing:
        plan.bad[nid] = (f"lookup join {node.uid!r}: no side-table version recorded for epochs {missing[:5]}"
                         f"{'...' if len(missing) > 5 else ''} (never processed by the runtime)")
        return None
    versions: dict[str, int] = {}
    for e in sorted(pins):
        versions.setdefault(json.dumps(pins[e], sort_keys=True), len(versions))
    first = read_pinned(pins[min(pins)])
    cols = list(node.columns) or [c for c in first.column_names if c != node.table_key]
    schema = pa.schema([pa.field(_K, first.schema.field(node.table_key).type)]
                       + [pa.field(c, first.schema.field(c).type, True) for c in cols]
                       + [pa.field(_LV, pa.int64())])
    parts = []
    for text, v in versions.items():
        t = read_pinned(json.loads(text)).select([node.table_key, *cols])
        t = t.append_column(_LV, pa.array([v] * t.num_rows, pa.int64()))
        parts.append(t.rename_columns(schema.names).cast(schema))
    side = plan.spark.createDataFrame(pa.concat_tables(parts))
    emap = plan.spark.createDataFrame(pa.table({_E: pa.array(sorted(pins), pa.int64()),
                                                _V: pa.array([versions[json.dumps(pins[e], sort_keys=True)]
                                                              for e in sorted(pins)], pa.int64())}))
    tagged = df.join(F.broadcast(emap), df[PEPOCH] == emap[_E], how="left")
    out = tagged.join(F.broadcast(side), (tagged[node.stream_key] == side[_K]) & (tagged[_V] == side[_LV]),
                      node.how)
    return out.drop(_K, _LV, _V, _E)
