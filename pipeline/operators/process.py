"""The user-defined keyed stateful operator ``Stream.process`` (docs/process.md): the pure step.

``fn(rows, state) -> (new_state, output)`` is called once per subtask and round with

* ``rows``: this round's input rows of the subtask's key groups, sorted by (key, ``_ingest_ts``, then every
  other column), so the call is deterministic whatever the shuffle order;
* ``state``: the current state rows (``state_schema``) of exactly the keys present in ``rows``.

A null key is one key, as in SQL ``GROUP BY``: its rows come to ``fn`` together (sorted last) with the null
key's state, and ``fn`` may keep state for it like for any other key.

It returns the new state of those keys (rows of a key absent from ``new_state`` are deleted) and the output rows
(``output_schema``). State of keys without input is untouched by ``fn``. Epochal adds per state row the barrier
time of the last epoch in which its key had input (``_touched_us``); with ``ttl_seconds`` a key's state expires
(before ``fn`` is called) once that is more than the TTL before the current barrier time.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.exceptions import ConfigError, UserFunctionError

__all__ = ["ProcessFn", "ProcessStepResult", "process_step", "TOUCHED"]

TOUCHED = "_touched_us"
ProcessFn = Callable[[pa.Table, pa.Table], "tuple[pa.Table, pa.Table]"]


@dataclass(frozen=True, slots=True)
class ProcessStepResult:
    state: pa.Table   # state_schema + _touched_us (+ carried columns)
    output: pa.Table  # output_schema
    expired: int      # state rows removed by the TTL


def _conform(t, schema: pa.Schema, what: str, uid: str) -> pa.Table:
    if not isinstance(t, pa.Table):
        if isinstance(t, pa.RecordBatch):
            t = pa.Table.from_batches([t])
        else:
            raise UserFunctionError(f"process {uid}: fn returned {type(t).__name__} as {what}, expected a pyarrow.Table")
    missing = [n for n in schema.names if n not in t.column_names]
    if missing:
        raise UserFunctionError(f"process {uid}: fn's {what} lacks columns {missing} of its declared schema")
    try:
        return t.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise UserFunctionError(f"process {uid}: fn's {what} does not fit its declared schema: {e}") from None


def _sort_rows(rows: pa.Table, key: str) -> pa.Table:
    order = [key] + (["_ingest_ts"] if "_ingest_ts" in rows.column_names else [])
    order += [c for c in rows.column_names if c not in order and not pa.types.is_nested(rows.schema.field(c).type)]
    return rows.sort_by([(c, "ascending") for c in order])


def process_step(uid: str, key: str, fn: ProcessFn, state_schema: pa.Schema, output_schema: pa.Schema,
                 state: pa.Table, rows: pa.Table | None, *, barrier_us: int, ttl_us: int | None,
                 carry: Callable[[pa.Table], pa.Table] | None = None) -> ProcessStepResult:
    """One call of ``fn`` for one subtask. ``state`` has ``state_schema`` + ``_touched_us`` (+ columns that
    ``carry`` recomputes from the key, e.g. the key group); ``barrier_us`` is the current barrier time.

    Over 8 parameters: the user's `fn` with its schemas, the state and the rows, then the round's clock and TTL as
    keywords."""
    if key not in state_schema.names:
        raise ConfigError(f"process {uid}: state_schema must contain the key column {key!r}")
    full = state_schema.append(pa.field(TOUCHED, pa.int64()))
    extra = [c for c in state.column_names if c not in full.names]
    expired = 0
    if ttl_us is not None and state.num_rows:
        alive = pc.greater_equal(state[TOUCHED], barrier_us - ttl_us)
        expired = state.num_rows - pc.sum(pc.cast(alive, pa.int64())).as_py()
        state = state.filter(alive)
    if rows is None or rows.num_rows == 0:
        return ProcessStepResult(state, output_schema.empty_table(), expired)
    rows = _sort_rows(rows, key)
    keys = pc.unique(rows[key])
    mine = pc.is_in(state[key], value_set=keys)
    rest = state.filter(pc.invert(mine))
    given = state.filter(mine).select(state_schema.names).sort_by([(key, "ascending")])
    try:
        result = fn(rows, given)
    except Exception as e:  # noqa: BLE001 - the user's code: report which operator failed, keep the cause
        raise UserFunctionError(f"process {uid}: fn raised {type(e).__name__}: {e}") from e
    if not isinstance(result, tuple) or len(result) != 2:
        raise UserFunctionError(f"process {uid}: fn must return (new_state, output), got {type(result).__name__}")
    new_state = _conform(result[0], state_schema, "new state", uid)
    output = _conform(result[1], output_schema, "output", uid)
    if new_state.num_rows:
        foreign = pc.invert(pc.is_in(new_state[key], value_set=keys))
        if pc.any(foreign).as_py():
            bad = new_state.filter(foreign)[key][0].as_py()
            raise UserFunctionError(f"process {uid}: fn returned state for key {bad!r}, which had no input in this "
                                    "call (state may only be written for the keys of `rows`)")
    new_state = new_state.append_column(TOUCHED, pa.repeat(pa.scalar(barrier_us, pa.int64()), new_state.num_rows))
    if extra:
        if carry is None:
            raise ConfigError(f"process {uid}: state has extra columns {extra} but no way to compute them")
        new_state = carry(new_state)
        rest = rest.select(new_state.column_names)
    return ProcessStepResult(pa.concat_tables([rest.cast(new_state.schema), new_state]), output, expired)
