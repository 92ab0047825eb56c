"""Updating streams: the changelog an aggregate emits to a downstream aggregate, and the retraction kernel of an
aggregate that consumes it (pure pyarrow; semantics: docs/operators.md "Updating streams").

**Retract semantics** (Flink's retract changelog). A running aggregate whose output feeds another aggregate
emits, per round and changed group, the group's previous row with ``_sign = -1`` (when the group existed) and its
new row with ``_sign = +1``. Stateless steps (``filter``, ``select``, ``union``) map both rows alike, so what
reaches the consumer is "retract the old row, add the new one". Rows of an append stream (a source) carry no
sign: they count as ``+1``.

The consumer keeps, per group, sums of signed contributions only, so every function it supports is retractable:

* ``count``: ``Σ sign`` (filtered: ``Σ sign · [where]``);
* ``sum`` / ``avg``: ``Σ sign · v`` over non-null ``v`` (exact: ``decimal(38,9)`` for floating inputs, integers
  in ``decimal(38,0)`` then range-checked) and ``Σ sign · [v not null]``; the value is null when that count is 0;
* ``__rows``: ``Σ sign``, the number of upstream rows in the group. A group whose ``__rows`` falls to 0 leaves the
  state; its output row shows the empty group (count 0, null sums and averages), which an upsert sink applies as a
  delete of the group's key (:mod:`pipeline.sink.deletes`).

``min``, ``max`` and ``count_distinct`` are not retractable without the multiset of values per group: they are
refused (:func:`unretractable`) before anything runs.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.exceptions import AggregateOverflowError

__all__ = ["SIGN", "combined", "row_signs", "ROWS", "RETRACTABLE", "KG", "unretractable", "kernel_aggs", "state_fields", "output_fields",
           "RetractStep", "retract_step", "output_rows", "changelog", "flow_schema"]

SIGN = "_sign"          # +1: a row added, -1: a row retracted (int32; null counts as +1)
ROWS = "__rows"         # state: the number of upstream rows in the group
KG = "_kg"
RETRACTABLE = ("count", "sum", "avg")
SUM_SUFFIX, COUNT_SUFFIX = "__sum", "__count"
EXACT_SUM = pa.decimal128(38, 9)
_WIDE_INT = pa.decimal128(38, 0)

Agg = tuple[str, str, "str | None"]


def unretractable(aggs: Sequence[Agg]) -> list[str]:
    """The outputs of ``aggs`` whose function cannot consume retractions (``min``, ``max``, ``count_distinct``)."""
    return [out for out, fn, _ in aggs if fn not in RETRACTABLE]


def kernel_aggs(aggs: Sequence[Agg], filters: Sequence[tuple[str, str]], mask_prefix: str) -> tuple[Agg, ...]:
    """``aggs`` as the kernel reads them: a filtered aggregate reads its masked column (``count``: the 0/1 mask,
    the others: the value where the condition holds, else null)."""
    where = dict(filters)
    return tuple((out, fn, mask_prefix + out if out in where else col) for out, fn, col in aggs)


def _floating(t: pa.DataType) -> bool:
    return pa.types.is_floating(t) or pa.types.is_decimal(t)


def state_fields(aggs: Sequence[Agg], input_schema: pa.Schema) -> list[pa.Field]:
    """State columns after the key (without ``_kg``): ``count`` -> ``<out>``; ``sum`` -> ``<out>`` and
    ``<out>__count``; ``avg`` -> ``<out>__sum`` and ``<out>__count``; then ``__rows``."""
    fields: list[pa.Field] = []
    for out, fn, col in aggs:
        if fn == "count":
            fields.append(pa.field(out, pa.int64()))
            continue
        t = input_schema.field(col).type
        total = EXACT_SUM if _floating(t) else pa.int64()
        fields += [pa.field(out if fn == "sum" else out + SUM_SUFFIX, total), pa.field(out + COUNT_SUFFIX, pa.int64())]
    return fields + [pa.field(ROWS, pa.int64())]


def output_fields(aggs: Sequence[Agg], input_schema: pa.Schema) -> list[pa.Field]:
    """Output columns after the key: ``count`` int64, ``sum`` int64 (float64 for floating inputs), ``avg`` float64."""
    fields: list[pa.Field] = []
    for out, fn, col in aggs:
        if fn == "count":
            fields.append(pa.field(out, pa.int64()))
        elif fn == "avg":
            fields.append(pa.field(out, pa.float64()))
        else:
            fields.append(pa.field(out, pa.float64() if _floating(input_schema.field(col).type) else pa.int64()))
    return fields


@dataclass(frozen=True, slots=True)
class RetractStep:
    state: pa.Table      # every held or touched group whose __rows > 0 (state schema)
    output: pa.Table     # the changed groups' new values (emptied groups: count 0, null sums; output schema)
    previous: pa.Table   # the changed groups' values before the round (groups held before; output schema)
    current: pa.Table    # ``output`` without the emptied groups (what a changelog adds)
    touched: pa.Table    # the keys of this round's rows (one column, the key)


def combined(c) -> pa.Array:
    """A column as one Array (a ChunkedArray's chunks combined; an empty one of its type)."""
    if isinstance(c, pa.ChunkedArray):
        return c.combine_chunks() if c.num_chunks else pa.array([], c.type)
    return c


def row_signs(rows: pa.Table) -> pa.Array:
    """Each row's ``_sign`` as int64 (+1 where absent or null: a row of an append stream is an addition)."""
    if SIGN not in rows.column_names:
        return pa.array([1] * rows.num_rows, pa.int64())
    return pc.fill_null(pc.cast(combined(rows[SIGN]), pa.int64()), 1)


def _wide(v) -> Any:
    t = v.type
    if pa.types.is_floating(t):
        return pc.cast(v, EXACT_SUM, safe=False)
    if pa.types.is_decimal(t):
        return pc.cast(v, EXACT_SUM)
    return pc.cast(v, _WIDE_INT)


def _to_float(c):
    if pa.types.is_decimal(c.type):
        return pc.cast(pc.cast(c, pa.string()), pa.float64())
    return pc.cast(c, pa.float64(), safe=False)


def output_rows(key: str, aggs: Sequence[Agg], state_rows: pa.Table, output_schema: pa.Schema) -> pa.Table:
    """The output rows of ``state_rows`` (state schema, or the merged rows before empty groups are dropped)."""
    cols = [state_rows[key]]
    for (out, fn, _col), f in zip(aggs, list(output_schema)[1:]):
        if fn == "count":
            c = state_rows[out]
        else:
            s = state_rows[out if fn == "sum" else out + SUM_SUFFIX]
            n = state_rows[out + COUNT_SUFFIX]
            if fn == "avg":
                c = pc.if_else(pc.greater(n, 0), pc.divide(_to_float(s), pc.cast(n, pa.float64())),
                               pa.scalar(None, pa.float64()))
            else:
                c = pc.if_else(pc.greater(n, 0), _to_float(s) if pa.types.is_floating(f.type) else s,
                               pa.scalar(None, f.type if pa.types.is_floating(f.type) else s.type))
        cols.append(pc.cast(c, f.type))
    return pa.table(cols, schema=output_schema)


def _narrow(col, target: pa.DataType, what: str, keys, where: str):
    if not (pa.types.is_decimal(col.type) and pa.types.is_integer(target)):
        return pc.cast(col, target)
    bad = pc.fill_null(pc.or_(pc.less(col, pa.scalar(-(2 ** 63), _WIDE_INT)),
                              pc.greater(col, pa.scalar(2 ** 63 - 1, _WIDE_INT))), False)
    if pc.any(bad).as_py():
        i = pc.index(bad, True).as_py()
        raise AggregateOverflowError(f"{where}: sum {what!r} for key {keys[i].as_py()!r} is {col[i].as_py()}, beyond "
                                     f"the range of {target}; declare a wider or floating-point column")
    return pc.cast(col, target)


def retract_step(key: str, aggs: Sequence[Agg], state_schema: pa.Schema, output_schema: pa.Schema,
                 state: pa.Table, rows: pa.Table | None, *, where: str = "aggregate") -> RetractStep:
    """One round of an aggregate over a changelog, for some key groups.

    ``state``: the held rows of these groups (``state_schema``: key, :func:`state_fields`, ``_kg``); ``rows``: this
    round's rows (the key, ``_kg``, :data:`SIGN` when the input has it, and every column ``aggs`` read). The result
    does not depend on the order of the rows nor on how they are split into rounds, as long as no group's
    ``__rows`` is negative at the end of a round (a retraction never precedes its row's addition across rounds)."""
    state = state.select(state_schema.names).cast(state_schema) if state.num_rows else state_schema.empty_table()
    empty_out = output_schema.empty_table()
    if rows is None or rows.num_rows == 0:
        return RetractStep(state, empty_out, empty_out, empty_out, pa.table({key: state[key].slice(0, 0)}))
    s = row_signs(rows)
    # 1. each row's signed contribution to every state column (the merge is a sum)
    contrib: dict[str, Any] = {key: rows[key], KG: rows[KG]}
    for out, fn, col in aggs:
        if fn == "count":
            contrib[out] = s if col is None else pc.multiply(s, pc.fill_null(pc.cast(rows[col], pa.int64()), 0))
            continue
        v = _wide(combined(rows[col]))
        signed = pc.if_else(pc.greater(s, 0), v, pc.negate(v))
        contrib[out if fn == "sum" else out + SUM_SUFFIX] = signed
        contrib[out + COUNT_SUFFIX] = pc.if_else(pc.is_valid(v), s, pa.scalar(0, pa.int64()))
    contrib[ROWS] = s
    names = [f.name for f in state_schema if f.name not in (key, KG)]
    partial = pa.table(contrib).group_by(key, use_threads=False).aggregate(
        [(n, "sum") for n in names] + [(KG, "min")])
    # pyarrow's result: the key, then the aggregates in request order
    partial = pa.table({key: partial.column(0), **{n: partial.column(1 + i) for i, n in enumerate(names)},
                        KG: partial.column(1 + len(names))})
    # 2. merged with the held rows of the touched groups (a null sum counts 0); the others stay as they are
    tkeys = combined(partial[key])
    hit = pc.is_in(state[key], value_set=tkeys, skip_nulls=False)
    untouched, state = state.filter(pc.invert(hit)), state.filter(hit)
    wide = pa.schema([pa.field(key, state_schema.field(key).type)]
                     + [pa.field(n, _WIDE_INT if pa.types.is_integer(state_schema.field(n).type) else EXACT_SUM)
                        for n in names] + [pa.field(KG, pa.int32())])
    held = state.select([key] + names + [KG])
    both = pa.concat_tables([held.cast(wide), partial.select(wide.names).cast(wide)])
    both = pa.table([both[key]] + [pc.fill_null(both[n], pa.scalar(0, wide.field(n).type)) for n in names]
                    + [both[KG]], schema=wide)
    merged = both.group_by(key, use_threads=False).aggregate([(n, "sum") for n in names] + [(KG, "min")])
    m_keys = combined(merged.column(0))
    new_cols: dict[str, Any] = {key: m_keys}
    for i, n in enumerate(names):
        new_cols[n] = _narrow(merged.column(1 + i), state_schema.field(n).type, n, m_keys, where)
    new_cols[KG] = pc.cast(merged.column(1 + len(names)), pa.int32())
    for out, fn, _col in aggs:   # no non-null value: the sum is null (SQL), as the batch meaning keeps it
        if fn != "count":
            s_name = out if fn == "sum" else out + SUM_SUFFIX
            new_cols[s_name] = pc.if_else(pc.greater(new_cols[out + COUNT_SUFFIX], 0), new_cols[s_name],
                                          pa.scalar(None, new_cols[s_name].type))
    merged_t = pa.table({f.name: new_cols[f.name] for f in state_schema}, schema=state_schema)
    if pc.any(pc.less(merged_t[ROWS], 0)).as_py():
        bad = merged_t.filter(pc.less(merged_t[ROWS], 0)).slice(0, 1).to_pylist()[0]
        raise RuntimeError(f"{where}: group {bad[key]!r} retracted more rows than it was given ({bad[ROWS]}): the "
                           "input changelog is inconsistent")
    # 3. the touched groups: before and after; empty groups leave the state
    touched_new, touched_old = merged_t, state
    alive = pc.greater(merged_t[ROWS], 0)
    output = output_rows(key, aggs, touched_new, output_schema)
    current = output.filter(pc.greater(touched_new[ROWS], 0))
    previous = output_rows(key, aggs, touched_old, output_schema)
    if previous.num_rows and output.num_rows:   # a group whose values did not change emits nothing (a retraction
        same = _unchanged(previous, output, key)  # and an addition that mapped to the same row upstream)
        if pc.any(same).as_py():
            output = output.filter(pc.invert(same))
            current = current.filter(pc.is_in(current[key], value_set=combined(output[key]), skip_nulls=False))
            previous = previous.filter(pc.is_in(previous[key], value_set=combined(output[key]), skip_nulls=False))
    return RetractStep(pa.concat_tables([untouched, merged_t.filter(alive)]), output, previous, current,
                       pa.table({key: tkeys}))


def _unchanged(previous: pa.Table, current: pa.Table, key: str) -> pa.Array:
    """Per row of ``current``: its group's row in ``previous`` is the same (every column equal, nulls equal)."""
    at = pc.index_in(current[key], value_set=combined(previous[key]), skip_nulls=False)
    same = pc.is_valid(at)
    if not pc.any(same).as_py():
        return combined(same)
    for name in current.column_names:
        a, b = combined(current[name]), combined(previous[name]).take(at)
        eq = pc.or_kleene(pc.equal(a, b), pc.and_kleene(pc.is_null(a), pc.is_null(b)))
        same = pc.and_(same, pc.fill_null(eq, False))
    return combined(same)


def changelog(previous: pa.Table | None, current: pa.Table | None, schema: pa.Schema,
              key: str | None = None) -> pa.Table | None:
    """The changelog rows of one round: ``previous`` retracted (``_sign = -1``), then ``current`` added (``+1``);
    both in ``schema`` (the output schema). ``key``: a group whose row did not change (a lower bid under a ``max``)
    emits nothing (its retraction and addition cancel)."""
    if key is not None and previous is not None and current is not None and previous.num_rows and current.num_rows:
        previous, current = previous.select(schema.names).cast(schema), current.select(schema.names).cast(schema)
        same = _unchanged(previous, current, key)
        if pc.any(same).as_py():
            kept = current.filter(pc.invert(same))
            gone = pc.is_in(previous[key], value_set=combined(current[key]).filter(same), skip_nulls=False)
            previous, current = previous.filter(pc.invert(gone)), kept
    parts = []
    for t, sign in ((previous, -1), (current, 1)):
        if t is not None and t.num_rows:
            t = t.select(schema.names).cast(schema)
            parts.append(t.append_column(SIGN, pa.repeat(pa.scalar(sign, pa.int32()), t.num_rows)))
    return pa.concat_tables(parts) if parts else None


def flow_schema(schema: pa.Schema) -> pa.Schema:
    """The schema of a changelog: ``schema`` and :data:`SIGN`."""
    return schema.append(pa.field(SIGN, pa.int32()))

