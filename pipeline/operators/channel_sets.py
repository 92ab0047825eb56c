"""Watermark channel sets (docs/concepts/watermarks.md): the channels a row reaching a window counts for.

A row read from a source carries one channel (its source partition ``<source>/<partition>``, or ``op:<uid>`` of
the operator that built it). A ``join`` output row is made of two rows and carries the channels of BOTH
(:func:`union_channels`): it counts for each of them in the window's watermark. A set is spelled as its channels,
sorted and distinct, joined by :data:`SEPARATOR` (``"events/0|orders/1"``); a single channel is spelled as itself,
so rows that never met a join keep the channel names they always had. The runtime (Arrow, here) and the batch
evaluation (Spark SQL, :func:`pipeline.batch.evaluation.wm_channels.union_channels_sql`) spell a set the same way.
"""
from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["SEPARATOR", "canonical", "split_channels", "union_channels"]

SEPARATOR = "|"   # never in a channel name: source names are refused with it when a join carries their channels


def split_channels(value: str | None) -> tuple[str, ...]:
    """The channels of a set (``()`` for None or the empty string)."""
    if not value:
        return ()
    return tuple(c for c in value.split(SEPARATOR) if c)


def canonical(channels: Iterable[str]) -> str | None:
    """The spelling of a set: sorted, distinct, joined (None for the empty set)."""
    s = sorted({c for c in channels if c})
    return SEPARATOR.join(s) if s else None


def union_channels(left: pa.Array | pa.ChunkedArray, right: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Per row, the union of the two sets (a null side adds nothing). The distinct pairs are few (channels x
    channels), so each is spelled once in Python and the result taken by index."""
    # nulls as empty sets first: null_handling="skip" drops trailing all-null rows (pyarrow 26)
    left, right = (pc.fill_null(a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a, "")
                   for a in (left, right))
    raw = pc.binary_join_element_wise(left, right, SEPARATOR)
    distinct = pc.unique(raw)
    spelled = pa.array([None if v is None else canonical(split_channels(v)) for v in distinct.to_pylist()],
                       pa.string())
    return pc.take(spelled, pc.index_in(raw, value_set=distinct))
