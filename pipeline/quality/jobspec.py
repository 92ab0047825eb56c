"""What a job's graph implies for validation: objects to check, their keys, groups and expected schemas.

* every stateful operator's named states (``state/<uid>/<name>``): key = the join key / aggregate key (a null
  aggregate key is one group, a null join key is no key: docs/operators.md "Null keys");
* every sink table (``sink/<table>``): key = the join key of an append sink fed by a join (each result row
  once), or the upsert key; append sinks of a join that an aggregate summarises carry that aggregate's
  group and measures, so that per-group totals can be compared (e.g. ``merchant_revenue`` vs
  ``paid_orders``).

Schemas are derived from the sources' declared schemas through ``select`` expressions of the plain forms
``col`` and ``col AS alias``; where another expression is used the expected schema is unknown (None) and
the schema expectation is skipped for that object.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa

from pipeline.job import (
    AggregateNode,
    DedupNode,
    IntervalJoinNode,
    Job,
    JoinNode,
    MapNode,
    OverAggregateNode,
    ProcessNode,
    RankNode,
    SinkNode,
    SourceNode,
    TemporalJoinNode,
    UnionNode,
    WindowNode,
    join_output,
)
from pipeline.operators.aggregate_functions import masked_aggs, needs_extended_kernel, output_fields, state_fields
from pipeline.operators.retract import output_fields as retract_output_fields
from pipeline.operators.retract import state_fields as retract_state_fields
from pipeline.operators.retract_join import state_schema as retract_join_state
from pipeline.quality.normalize import NullKey, ObjectSpec, schema_signature
from pipeline.updating_streams import reads_changelog
from pipeline.windows.channels import needs_channels

__all__ = ["JobObjects", "job_objects", "node_schema", "state_obj", "sink_obj"]

_IDENT = r"`?([A-Za-z_][A-Za-z0-9_]*)`?"
_PLAIN = re.compile(rf"^\s*{_IDENT}\s*$")
_ALIAS = re.compile(rf"^\s*{_IDENT}\s+(?:AS\s+)?{_IDENT}\s*$", re.IGNORECASE)
_KG = pa.field("_kg", pa.int32())
_INGEST = "_ingest_ts"


def state_obj(uid: str, name: str) -> str:
    return f"state/{uid}/{name}"


def sink_obj(table: str) -> str:
    return f"sink/{table}"


def _apply_select(schema: pa.Schema, exprs: tuple[str, ...]) -> pa.Schema | None:
    fields = []
    for e in exprs:
        m = _PLAIN.match(e) or _ALIAS.match(e)
        if not m:
            return None
        src = m.group(1)
        dst = m.group(m.lastindex or 1)
        if src not in schema.names:
            return None
        fields.append(pa.field(dst, schema.field(src).type))
    names = [f.name for f in fields]
    if _INGEST in schema.names and _INGEST not in names:  # the runtime keeps _ingest_ts through selects
        fields.append(schema.field(_INGEST))
    return pa.schema(fields)


def node_schema(job: Job, node_id: int) -> pa.Schema | None:
    """Arrow schema of the rows a node emits (None where it cannot be derived)."""
    node = job.nodes[node_id]
    if isinstance(node, SourceNode):
        return node.schema
    if isinstance(node, UnionNode):
        return node_schema(job, node.parents[0])
    if isinstance(node, MapNode):
        parent = node_schema(job, node.parent)
        if parent is None:
            return None
        return parent if node.kind == "filter" else _apply_select(parent, node.exprs)
    if isinstance(node, JoinNode):
        left, right = node_schema(job, node.left), node_schema(job, node.right)
        if left is None or right is None:
            return None
        fields = {**{f.name: f for f in left}, **{f.name: f for f in right}}
        output = join_output(node, left.names, right.names)
        if any(c not in fields for c in output):
            return None
        return pa.schema([fields[c] for c in output])
    if isinstance(node, AggregateNode):
        parent = node_schema(job, node.parent)
        if parent is None or node.key not in parent.names:
            return None
        agg_fields = [parent.field(node.key)]
        if reads_changelog(job, node):  # over an updating stream (docs/operators.md "Updating streams")
            if any(c is not None and fn != "count" and c not in parent.names for _, fn, c in node.aggs):
                return None
            return pa.schema(agg_fields + retract_output_fields(node.aggs, parent))
        if node.filters or needs_extended_kernel(node.aggs):  # avg, count_distinct, FILTER (aggregate_functions)
            if any(c is not None and fn != "count" and c not in parent.names for _, fn, c in node.aggs):
                return None
            return pa.schema(agg_fields + output_fields(node.aggs, parent))
        for out, fn, col in node.aggs:
            if fn == "count":
                agg_fields.append(pa.field(out, pa.int64()))
            elif col is None or col not in parent.names:
                return None
            elif fn == "sum":
                t = parent.field(col).type
                agg_fields.append(pa.field(out, pa.float64() if pa.types.is_floating(t) else pa.int64()))
            else:
                agg_fields.append(pa.field(out, parent.field(col).type))
        return pa.schema(agg_fields)
    if isinstance(node, RankNode):  # the input's columns, then the rank column (docs/operators.md "Top-N")
        parent = node_schema(job, node.parent)
        if parent is None:
            return None
        return parent.append(pa.field(node.rank_column, pa.int64())) if node.rank_column else parent
    if isinstance(node, SinkNode):
        return node_schema(job, node.parent)
    return None


def _state_schema(job: Job, op, name: str) -> pa.Schema | None:
    if isinstance(op, JoinNode):
        side = node_schema(job, op.left if name == "left" else op.right)
        if side is not None and op.keys:  # a join on several columns is keyed by one computed column
            side = side.append(pa.field(op.on, pa.string()))
        if side is not None and job.retracting_join(op):  # signed multisets (pipeline.operators.retract_join)
            return retract_join_state(side)
        if side is not None and needs_channels(job, job.node_id(op)):   # a window reads its rows: their channels
            side = side.append(pa.field("_wm_channel", pa.string()))      # (docs/concepts/watermarks.md)
        # the rows' own epochs (docs/operators.md, TTL), then the matched flag
        return None if side is None else side.append(_KG).append(pa.field("_pepoch", pa.int64())).append(
            pa.field("_matched", pa.bool_()))
    if isinstance(op, DedupNode):  # the held keys: key, _ingest_ts of the row that passed last, key group
        parent = node_schema(job, op.parent)
        if parent is None or op.key not in parent.names or _INGEST not in parent.names:
            return None
        return pa.schema([parent.field(op.key), parent.field(_INGEST), _KG])
    if isinstance(op, RankNode):  # the held rows: the input's columns (+ the key of several columns), _kg, rank
        parent = node_schema(job, op.parent)
        if parent is None:
            return None
        if op.key not in parent.names:
            parent = parent.append(pa.field(op.key, pa.string()))
        return parent.append(_KG).append(pa.field("__rank", pa.int32()))
    if isinstance(op, WindowNode):  # docs/windows.md "State after checkpoint n"
        if name == "wm":
            return pa.schema([pa.field("channel", pa.string()), pa.field("max_event_us", pa.int64())])
        parent = node_schema(job, op.parent)
        inputs = _window_inputs(op)
        if parent is None or any(c not in parent.names for c in [op.key, *inputs]):
            return None
        return pa.schema([parent.field(op.key), pa.field("_event_us", pa.int64()), *[parent.field(c) for c in inputs],
                          pa.field("_epoch", pa.int64()), _KG])
    if not isinstance(op, AggregateNode):
        return None  # other operators (process): schema not checked here
    if needs_extended_kernel(op.aggs) or reads_changelog(job, op):  # state columns besides the values
        parent = node_schema(job, op.parent)                         # (docs/operators.md "Aggregate", "Updating
        if parent is None or any(c is not None and c not in parent.names for _, _, c in op.aggs):  # streams")
            return None
        fields = retract_state_fields(op.aggs, parent) if reads_changelog(job, op) else state_fields(op.aggs, parent)
        return pa.schema([parent.field(op.key), *fields, _KG])
    sch = node_schema(job, job.node_id(op))
    return None if sch is None else sch.append(_KG)


def _window_inputs(op: WindowNode) -> list[str]:
    """The aggregated input columns a window keeps in state, in first-use order (without the key)."""
    cols: list[str] = []
    for _out, fn, col in masked_aggs(op.aggs, op.filters):
        if fn != "count" and col is not None and col not in cols and col != op.key:
            cols.append(col)
    return cols


@dataclass(frozen=True)
class JobObjects:
    specs: dict[str, ObjectSpec]                 # obj -> spec
    schemas: dict[str, str | None]               # obj -> expected schema signature (None: unknown)
    ttl_seconds: dict[str, int | None]           # state obj -> join TTL (None: no TTL / not a join)
    aggregates: dict[str, dict]                  # aggregate uid -> {"state": obj, "append": obj | None,
                                                 #   "upsert": obj | None, "measures": [names]}

    def state_objects(self) -> list[str]:
        return [o for o, s in self.specs.items() if s.kind == "state"]

    def sink_objects(self) -> list[str]:
        return [o for o, s in self.specs.items() if s.kind == "sink"]


def _join_unique(op: JoinNode) -> str | None:
    """The join's ``unique`` declaration (the older join without ``how``: one match per key, as "both")."""
    return getattr(op, "unique", None) if hasattr(op, "how") else "both"


def _row_state_specs(op, default_ttl_seconds: int | None, specs: dict[str, ObjectSpec],
                     ttl: dict[str, int | None]) -> None:
    """The state objects of a join, deduplicate, window or top-N (rows of the input held per key)."""
    if isinstance(op, JoinNode):
        unique = _join_unique(op)
        for name in ("left", "right"):
            o = state_obj(op.uid, name)
            # a null join key matches nothing: such rows are held (and emitted alone by an outer join)
            specs[o] = ObjectSpec(o, "state", op.on, unique_key=unique in (name, "both"), null_key=NullKey.NO_KEY)
            t = op.ttl_seconds if op.ttl_seconds is not None else default_ttl_seconds
            ttl[o] = t or None
    elif isinstance(op, DedupNode):
        o = state_obj(op.uid, "keys")
        specs[o] = ObjectSpec(o, "state", op.key)          # one held row per key
        t = op.ttl_seconds if op.ttl_seconds is not None else default_ttl_seconds
        ttl[o] = t or None
    elif isinstance(op, WindowNode):
        # window records: several rows per key by design; the watermark table is operator-wide (subtask 0)
        o = state_obj(op.uid, "win")
        specs[o] = ObjectSpec(o, "state", op.key, unique_key=False)
        o = state_obj(op.uid, "wm")
        specs[o] = ObjectSpec(o, "state", "channel", operator_wide=True)
    elif isinstance(op, (IntervalJoinNode, TemporalJoinNode)):
        # the held rows of each side: several per key; the watermark table is operator-wide (subtask 0)
        for name in ("left", "right"):
            o = state_obj(op.uid, name)
            specs[o] = ObjectSpec(o, "state", op.on, unique_key=False)
        o = state_obj(op.uid, "wm")
        specs[o] = ObjectSpec(o, "state", "channel", operator_wide=True)
    elif isinstance(op, OverAggregateNode):
        # the held rows (not fired, or needed by a later row's frame): several per key; wm: operator-wide
        o = state_obj(op.uid, "rows")
        specs[o] = ObjectSpec(o, "state", op.key, unique_key=False)
        o = state_obj(op.uid, "wm")
        specs[o] = ObjectSpec(o, "state", "channel", operator_wide=True)
    elif isinstance(op, RankNode):
        # up to n rows per key (a null key is one group, as SQL's PARTITION BY)
        o = state_obj(op.uid, "rank")
        specs[o] = ObjectSpec(o, "state", op.key, unique_key=op.n == 1, null_key=NullKey.GROUP)


def job_objects(job: Job, default_ttl_seconds: int | None) -> JobObjects:
    specs: dict[str, ObjectSpec] = {}
    schemas: dict[str, str | None] = {}
    ttl: dict[str, int | None] = {}
    aggregates: dict[str, dict] = {}
    for op in job.operators():
        if isinstance(op, (JoinNode, DedupNode, WindowNode, RankNode, IntervalJoinNode, TemporalJoinNode,
                           OverAggregateNode)):
            _row_state_specs(op, default_ttl_seconds, specs, ttl)
        elif isinstance(op, ProcessNode):
            # user state: its columns and keys are the user's (checked by replay, pipeline.quality.replay)
            continue
        elif isinstance(op, AggregateNode):
            o = state_obj(op.uid, "agg")
            measures: tuple[tuple[str, str | None], ...] = tuple(
                (out, out) for out, fn, _ in op.aggs if fn in ("count", "sum") and out not in dict(op.filters))
            specs[o] = ObjectSpec(o, "state", op.key, op.key, measures, op.uid, null_key=NullKey.GROUP)
            ttl[o] = None
            aggregates[op.uid] = {"state": o, "append": None, "upsert": None, "measures": [m for m, _ in measures]}
        for name in job.state_names(op.uid):
            s = _state_schema(job, op, name)
            schemas[state_obj(op.uid, name)] = schema_signature(s) if s is not None else None
    for sink in job.sinks():
        parent = job.nodes[sink.parent]
        o = sink_obj(sink.table)
        sch = node_schema(job, sink.parent)
        if sch is not None and job.operator_sink(sink.parent) is not sink and not job.ingest_shown(sink.parent) \
                and "_ingest_ts" in sch.names:  # a sink writer hides the _ingest_ts that no select named
            sch = sch.remove(sch.get_field_index("_ingest_ts"))
        schemas[o] = schema_signature(sch) if sch is not None else None
        if isinstance(parent, AggregateNode) and sink.mode == "upsert":
            measures = tuple((out, out) for out, fn, _ in parent.aggs if fn in ("count", "sum")
                             and out not in dict(parent.filters))
            specs[o] = ObjectSpec(o, "sink", parent.key, parent.key, measures, parent.uid, tuple(sink.key),
                                  null_key=NullKey.GROUP)
            aggregates.setdefault(parent.uid, {"state": state_obj(parent.uid, "agg"), "append": None, "upsert": None,
                                               "measures": [m for m, _ in measures]})["upsert"] = o
        elif isinstance(parent, JoinNode) and sink.mode == "append":
            group, agg_uid = None, None
            measures = ()
            for agg in job.operators():
                if isinstance(agg, AggregateNode):
                    base, maps = job.chain_to(agg.parent)
                    if base == sink.parent and not maps:
                        group = agg.key
                        measures = tuple((out, None if fn == "count" else col) for out, fn, col in agg.aggs
                                         if fn in ("count", "sum") and out not in dict(agg.filters))
                        agg_uid = agg.uid
                        aggregates.setdefault(agg.uid, {"state": state_obj(agg.uid, "agg"), "append": None,
                                                        "upsert": None,
                                                        "measures": [m for m, _ in measures]})["append"] = o
                        break
            # an outer join emits a key twice when its row expired unmatched and a partner arrived later (too late
            # to pair: it is emitted alone when it expires in turn), even with unique keys on both sides
            specs[o] = ObjectSpec(o, "sink", parent.keys[0] if parent.keys else parent.on, group, measures, agg_uid,
                                  unique_key=_join_unique(parent) == "both" and not parent.keys
                                  and getattr(parent, "how", "inner") == "inner", null_key=NullKey.NO_KEY)
        else:
            key = tuple(sink.key) if sink.mode == "upsert" else ()
            # an upsert sink keeps the newest row per key, the null key being one key (null-safe equality)
            specs[o] = ObjectSpec(o, "sink", key[0] if len(key) == 1 else None, upsert_key=key,
                                  null_key=NullKey.GROUP if key else NullKey.INVALID)
    return JobObjects(specs, schemas, ttl, aggregates)
