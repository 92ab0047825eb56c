"""The deduplication kernel (one subtask, one round).

State: one row per key held (its ``_ingest_ts``, the time of the row that passed). A round of epoch ``m``
with TTL cutoff ``c = end(m) - ttl``:

1. **Expiry**: held keys with ``_ingest_ts < c`` leave.
2. A new row with ``_ingest_ts < c`` (or a null key) passes and is not held. Any other new row passes iff
   its key is not held and it is the first of its key among the round's other such rows, in the order
   (``_ingest_ts``, then the other columns' values): deterministic on replay, whatever order the shuffle
   delivered. Later rows are dropped (counted).
3. Passed rows with ``_ingest_ts >= c`` are held.

So a row ``y`` is dropped iff an earlier-passed row ``x`` of its key has ``t_x >= end(e(y)) - ttl``.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["DedupResult", "dedup_step"]


@dataclass(frozen=True, slots=True)
class DedupResult:
    state: pa.Table     # held keys: key, _ingest_ts (+ any carried columns such as _kg)
    output: pa.Table    # rows that passed (input columns)
    dropped: int
    expired: int
    expired_keys: pa.Array | pa.ChunkedArray | None = None   # keys of the rows expired this round


def _sortable(t: pa.DataType) -> bool:
    return not (pa.types.is_nested(t) or pa.types.is_dictionary(t))


def dedup_step(state: pa.Table, new: pa.Table, *, key: str, cutoff, state_columns: list[str]) -> DedupResult:
    """``state`` has ``state_columns`` (key, ``_ingest_ts``, ...); ``new`` has at least those."""
    expired = 0
    expired_keys = None
    if cutoff is not None and state.num_rows:
        live = pc.fill_null(pc.greater_equal(state["_ingest_ts"], cutoff), False)
        expired = state.num_rows - pc.sum(live.cast(pa.int64())).as_py()
        if expired:
            expired_keys = state.filter(pc.invert(live))[key]
            state = state.filter(live)
    if new.num_rows == 0:
        return DedupResult(state, new, 0, expired, expired_keys)
    idx = pa.array(range(new.num_rows), pa.int64())
    # rows already past the cutoff are never held, so they never suppress another row (and always pass)
    live = (pc.fill_null(pc.greater_equal(new["_ingest_ts"], cutoff), False) if cutoff is not None
            else pa.array([True] * new.num_rows))
    live = pc.and_(live, pc.invert(pc.is_null(new[key])))  # a null key is no key: the row passes
    order = [(key, "ascending"), ("_ingest_ts", "ascending")] + [
        (c, "ascending") for c in new.column_names if c not in (key, "_ingest_ts")
        and _sortable(new.schema.field(c).type)] + [("__i", "ascending")]
    ranked = new.append_column("__i", idx).filter(live).sort_by(order)
    first = ranked.group_by(key, use_threads=False).aggregate([("__i", "first")])["__i_first"]
    keep = pc.is_in(idx, value_set=first)
    if state.num_rows:
        keep = pc.and_(keep, pc.invert(pc.fill_null(pc.is_in(new[key], value_set=state[key]), False)))
    out = new.filter(pc.or_(keep, pc.invert(live)))
    held = new.filter(keep)
    state = pa.concat_tables([state, held.select(state_columns).cast(state.schema)])
    return DedupResult(state, out, new.num_rows - out.num_rows, expired, expired_keys)
