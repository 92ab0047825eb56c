"""The Spark side of the lookup join (:class:`pipeline.job.LookupJoinNode`): a stateless step, like ``union``
(no shuffle, no state), that ``mapInArrow``s the stream with the pinned version of its side table.

The plan is built once per shape and re-used every round (:mod:`pipeline.runtime.driver.spark_plan`), so the
version is a round value, not part of the plan: the local property ``epochal.lookup.<uid>`` holds
``{"epochs": {<epoch>: <pin>}}`` (one epoch; a tagged round: each epoch of the round, the records carrying theirs
in :data:`~pipeline.runtime.operators.round_params.EPOCH_TAG`), set by the driver from the per-epoch record
(:mod:`pipeline.lookup.pins`). Each task reads the pinned version (:func:`pipeline.lookup.tables.read_pinned`,
cached per worker) and joins its rows with the kernel :func:`pipeline.operators.lookup.lookup_rows`. The side
table's columns and types are those of the version current when the plan is built; a later version that lacks a
column or whose types do not cast is an error naming the table.
"""
from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.exceptions import ConfigError, SourceError
from pipeline.job import LookupJoinNode
from pipeline.lookup.tables import describe_pin, read_pinned
from pipeline.operators.lookup import lookup_rows, normalized_schema
from pipeline.runtime.operators.round_params import EPOCH_TAG, embedded_params, task_params

__all__ = ["lookup_key", "lookup_dataframe", "lookup_task", "side_columns"]


def lookup_key(uid: str) -> str:
    """The local property holding lookup join ``uid``'s pins of the round."""
    return f"epochal.lookup.{uid}"


def _plan_value(spark, key: str) -> Any:
    embedded = embedded_params(key)
    if embedded is not None:
        return embedded
    raw = spark.sparkContext.getLocalProperty(key)
    return json.loads(raw) if raw else None


def side_columns(node: LookupJoinNode, side: pa.Schema, stream_columns: list[str]) -> pa.Schema:
    """The side columns the join adds (nullable), checked against the table and the stream (ConfigError)."""
    where = f"lookup join {node.uid!r} (table {node.table.spec!r})"
    if node.table_key not in side.names:
        raise ConfigError(f"{where}: the table has no key column {node.table_key!r} (has {side.names})")
    if node.stream_key not in stream_columns:
        raise ConfigError(f"{where}: the stream has no key column {node.stream_key!r}")
    cols = list(node.columns) or [c for c in side.names if c != node.table_key]
    missing = [c for c in cols if c not in side.names]
    if missing:
        raise ConfigError(f"{where}: the table has no columns {missing} (has {side.names})")
    clash = [c for c in cols if c in stream_columns]
    if clash:
        raise ConfigError(f"{where}: the stream already has columns {clash}; rename them with select() or name "
                          "the table's columns to add with columns=")
    return pa.schema([pa.field(c, side.field(c).type, True) for c in cols])


def lookup_task(node: LookupJoinNode, side_schema: pa.Schema, tagged: bool, embedded: Any = None):
    """The ``mapInArrow`` function: each batch joined with the side table as of its epoch's pin (the round's value
    ``{"epochs": {epoch: pin}}``: ``embedded`` (Spark Connect) or the task's local property). A tagged round's rows
    are split by :data:`~pipeline.runtime.operators.round_params.EPOCH_TAG`, each epoch joined with its own pin."""
    key = lookup_key(node.uid)
    cols = tuple(side_schema.names)
    uid, stream_key, table_key, how = node.uid, node.stream_key, node.table_key, node.how

    def side_of(pin: dict) -> pa.Table:
        t = read_pinned(pin)
        missing = [c for c in (table_key, *cols) if c not in t.column_names]
        if missing:
            raise SourceError(f"lookup join {uid}: side table {describe_pin(pin)} has no columns {missing}; its "
                              "columns changed since the job's plan was built")
        t = t.select([table_key, *cols])
        try:
            return t.cast(pa.schema([t.schema.field(table_key), *side_schema]))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise SourceError(f"lookup join {uid}: side table {describe_pin(pin)} changed its column types "
                              f"since the job's plan was built: {e}") from None

    def task(batches):
        params = embedded if embedded is not None else task_params(key)
        if not params:
            raise RuntimeError(f"lookup join {uid}: the job was submitted without its pinned versions ({key})")
        pins = {int(e): p for e, p in params["epochs"].items()}
        for b in batches:
            t = pa.Table.from_batches([b])
            if len(pins) == 1:
                yield from lookup_rows(t, side_of(next(iter(pins.values()))), stream_key, table_key, how,
                                       cols).to_batches()
                continue
            if not (tagged and EPOCH_TAG in t.column_names):
                raise RuntimeError(f"lookup join {uid}: rows without an epoch in a round of epochs {sorted(pins)}")
            tags = t.column(EPOCH_TAG)
            for ep in pc.unique(tags).to_pylist():
                if ep not in pins:
                    raise RuntimeError(f"lookup join {uid}: no pinned version for epoch {ep}")
                part = t.filter(pc.equal(tags, pa.scalar(ep, tags.type)))
                yield from lookup_rows(part, side_of(pins[ep]), stream_key, table_key, how, cols).to_batches()

    return task


def lookup_dataframe(spark, node: LookupJoinNode, df, tagged: bool):
    """``df`` joined with the side table of ``node``, as of each epoch's pin (see the module docstring)."""
    # lazy: pyspark is imported where Spark already runs (the driver's plan building)
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import StructType

    key = lookup_key(node.uid)
    value = _plan_value(spark, key)
    if not value or not value.get("epochs"):
        raise ConfigError(f"lookup join {node.uid!r}: the plan was built without the round's pinned table version")
    first = next(iter(value["epochs"].values()))
    side_schema = side_columns(node, normalized_schema(read_pinned(first).schema), list(df.columns))
    out_struct = StructType(list(df.schema.fields) + list(from_arrow_schema(side_schema).fields))
    task = lookup_task(node, side_schema, tagged, embedded_params(key))
    return df.mapInArrow(task, out_struct)
