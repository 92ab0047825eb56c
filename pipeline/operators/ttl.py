"""TTL rules shared by the kernels: a record's own epoch and the TTL conditions on it (docs/operators.md).

Every record that reaches a stateful operator carries its **own epoch** ``p(x)`` in the column
:data:`ROW_EPOCH`: the epoch whose barrier it precedes in its source partition (the write-ahead barrier log
decides it, so it does not depend on the round, the checkpoint or the alignment mode that consumed the
record). With ``E`` the epoch length and ``end(k) = (k + 1) * E``:

* a record is **alive in its own epoch** iff ``t_x >= end(p(x)) - ttl``;
* a pair ``(l, r)`` of a join is within the TTL iff ``min(t_l, t_r) >= end(max(p(l), p(r))) - ttl``.

A kernel's *state expiry* uses the round's cutoff ``end(L) - ttl`` where ``L`` (the low watermark of the
inputs, ``pipeline.runtime.driver.input_epochs``) is never above the own epoch of any record not yet consumed, so a
state row is never expired while a record it must still meet is pending.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["ROW_EPOCH", "micros", "own_cutoff", "pair_within_ttl", "expiry_epoch"]

ROW_EPOCH = "_pepoch"


def micros(col) -> pa.Array | pa.ChunkedArray:
    """A timestamp column as int64 microseconds (UTC)."""
    return pc.cast(pc.cast(col, pa.timestamp("us", tz="UTC")), pa.int64())


def own_cutoff(epochs, *, ttl_us: int, epoch_us: int):
    """Per record: ``end(p(x)) - ttl`` in microseconds (int64)."""
    return pc.subtract(pc.multiply(pc.add(pc.cast(epochs, pa.int64()), 1), epoch_us), ttl_us)


def pair_within_ttl(t_left, t_right, p_left, p_right, *, ttl_us: int, epoch_us: int) -> pa.Array:
    """``min(t_l, t_r) >= end(max(p_l, p_r)) - ttl`` per pair (nulls: false)."""
    tmin = pc.min_element_wise(micros(t_left), micros(t_right))
    pmax = pc.max_element_wise(pc.cast(p_left, pa.int64()), pc.cast(p_right, pa.int64()))
    return pc.fill_null(pc.greater_equal(tmin, own_cutoff(pmax, ttl_us=ttl_us, epoch_us=epoch_us)), False)


def expiry_epoch(t, epochs, *, ttl_us: int, epoch_us: int):
    """The first epoch ``m >= p(x)`` whose cutoff ``end(m) - ttl`` passes ``t_x``: ``max(p(x), floor((t_x + ttl)
    / E))``. The own epoch of an unmatched outer row emitted when it expires (what flows downstream)."""
    m = pc.divide(pc.add(micros(t), ttl_us), epoch_us)  # int64 division floors for non-negative times
    return pc.max_element_wise(pc.cast(epochs, pa.int64()), m)
