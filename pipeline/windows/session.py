"""The session window step (docs/operators.md "Session windows"): pure and vectorised.

Flink's event-time session windows: every record opens the window ``[t, t + gap)``; windows of a key that overlap
merge, so the records of a session are a maximal run of a key's records, in event-time order, whose neighbours are
less than ``gap`` apart. The session is ``[first, last + gap)``; it fires once (``emit="final"``) when the watermark
reaches ``last + gap + allowed lateness``. A record is late when ``t + allowed lateness <= W(m-1)``: it is behind
the watermark. That rule (stricter than Flink's, which accepts a record up to ``gap`` behind the watermark) is what
makes the result exact: an on-time record is at least ``gap`` after the last record of every session that has
fired, so it never belongs to a fired session, and the sessions are those of all on-time records, whatever the
epochs, the rounds or the parallelism.

The state holds the on-time records of the sessions not yet fired (the window state's columns: key, event time in
µs, aggregated columns, epoch); a fired session's records leave it.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.windows.aggregate import (
    EPOCH,
    EVENT_US,
    TS,
    WindowSpec,
    WindowStepResult,
    _aggregate,
    _event_us,
    output_schema,
    state_schema,
)
from pipeline.windows.assign import PENDING_US

__all__ = ["session_step", "sessionize", "session_index"]


def sessionize(keys: pa.Array | pa.ChunkedArray, event_us: np.ndarray, gap_us: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(order, session id, start, last)``: ``order`` sorts the records by (key, event time); for the sorted
    records, the session number (0, 1, ...) and the first and last event time of their session."""
    n = len(event_us)
    if n == 0:
        e = np.zeros(0, dtype=np.int64)
        return e, e, e, e
    tbl = pa.table({"k": keys, "t": pa.array(event_us, pa.int64())})
    order = pc.sort_indices(tbl, sort_keys=[("k", "ascending"), ("t", "ascending")]).to_numpy()
    t = np.asarray(event_us, dtype=np.int64)[order]
    k = tbl["k"].take(pa.array(order))
    new = np.ones(n, dtype=bool)
    if n > 1:
        same_key = pc.equal(k.slice(1), k.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        new[1:] = ~same_key | (t[1:] - t[:-1] >= gap_us)
    sid = np.cumsum(new) - 1
    firsts = np.flatnonzero(new)
    start = t[firsts][sid]
    last = np.maximum.reduceat(t, firsts)[sid]
    return order, sid, start, last


def session_step(spec: WindowSpec, state: pa.Table, rows: pa.Table | None, *, epoch: int,
                 late_watermark_us: int | None, fire_watermark_us: int | None, complete: bool,
                 input_schema: pa.Schema | None = None, carry: tuple[str, ...] = (),
                 replayed: bool = False) -> WindowStepResult:
    """One step of a session window over some key groups (the arguments of
    :func:`pipeline.windows.aggregate.window_step`; ``state`` must hold every record of its keys; ``replayed``
    matters only to ``emit="update"``, which sessions do not have).

    Over 8 parameters: the same signature as :func:`~pipeline.windows.aggregate.window_step`, so the window task
    calls either kernel alike."""
    in_schema = input_schema if input_schema is not None else (rows.schema if rows is not None else None)
    if in_schema is None:
        raise ValueError("session_step needs rows or input_schema")
    s_schema = pa.schema(list(state_schema(spec, in_schema)) + [in_schema.field(c) for c in carry])
    o_schema = output_schema(spec, in_schema)
    G, L = spec.gap_us, spec.lateness_us
    bad = in_schema.empty_table()
    late = pa.schema(list(in_schema) + [pa.field("window_start", TS), pa.field("window_end", TS),
                                        pa.field("_watermark_us", pa.int64())]).empty_table()
    state = state.select(s_schema.names).cast(s_schema) if state.num_rows else s_schema.empty_table()
    if rows is not None and rows.num_rows:
        ok = pc.and_(pc.is_valid(rows[spec.key]), pc.is_valid(rows[spec.event_time]))
        bad = rows.filter(pc.invert(ok))
        rows = rows.filter(ok)
        t = np.asarray(_event_us(rows[spec.event_time]).to_numpy(zero_copy_only=False), dtype=np.int64)
        is_late = (t + L <= late_watermark_us if late_watermark_us is not None
                   else np.zeros(len(t), dtype=bool))
        if is_late.any():
            lt = t[is_late]
            late = rows.filter(pa.array(is_late)).append_column(
                "window_start", pc.cast(pa.array(lt), TS)).append_column(
                "window_end", pc.cast(pa.array(lt + G), TS)).append_column(
                "_watermark_us", pa.array(np.full(len(lt), late_watermark_us, dtype=np.int64)))
        on = rows.filter(pa.array(~is_late))
        new = {spec.key: on[spec.key], EVENT_US: pa.array(t[~is_late], pa.int64())}
        for c in spec.input_columns():
            new[c] = on[c]
        new[EPOCH] = pa.array(np.full(on.num_rows, epoch, dtype=np.int64))
        for c in carry:
            new[c] = on[c]
        state = pa.concat_tables([state, pa.table(new).cast(s_schema)])
    if not complete or state.num_rows == 0 or fire_watermark_us is None:
        return WindowStepResult(state, o_schema.empty_table(), late, bad)
    order, _sid, start, last = sessionize(state[spec.key], state[EVENT_US].to_numpy(), G)
    fires = last + G + L <= fire_watermark_us
    ordered = state.take(pa.array(order))
    pairs = ordered.filter(pa.array(fires)).select([spec.key, EPOCH] + spec.input_columns())
    pairs = pairs.append_column("_ws", pa.array(start[fires], pa.int64())).append_column(
        "_we", pa.array(last[fires] + G, pa.int64()))
    output = _aggregate(spec, pairs, o_schema)
    return WindowStepResult(ordered.filter(pa.array(~fires)), output, late, bad)


def session_index(gap_us: int, lateness_us: int, watermark_us: int | None, *, event_i: int, epoch_i: int,
                  pending_epoch: int | None = None):
    """A keyed store's index time of a session state row (see :func:`pipeline.windows.assign.window_index`): the
    earliest time its session can fire, ``t + gap + lateness``, or just above ``watermark_us`` when its session has
    outgrown that (the record is held, so its session fires later); rows of ``pending_epoch`` under
    :data:`PENDING_US`."""
    def at(row: tuple) -> int | None:
        if pending_epoch is not None and row[epoch_i] == pending_epoch:
            return PENDING_US
        t = row[event_i]
        if t is None:
            return None
        first = t + gap_us + lateness_us
        return first if watermark_us is None or first > watermark_us else watermark_us + 1
    return at
