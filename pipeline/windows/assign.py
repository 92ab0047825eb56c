"""Window assignment (docs/windows.md "Window assignment"): vectorised, windows aligned to the Unix epoch.

A record with event time ``t`` (µs) belongs to ``[s, s + S)`` for every ``s`` with ``s % D == 0`` and
``s <= t < s + S``: one window when tumbling (``D == S``), ``S / D`` when sliding.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["last_window_start", "assign_windows", "next_fire_us", "window_index", "PENDING_US"]


def _np(a) -> np.ndarray:
    if isinstance(a, pa.ChunkedArray):
        a = a.combine_chunks()
    if isinstance(a, pa.Array):
        return a.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return np.asarray(a, dtype=np.int64)


def last_window_start(event_us, slide_us: int) -> np.ndarray:
    """Start of the last (latest-ending) window of each event time: ``floor(t / D) * D``."""
    return np.floor_divide(_np(event_us), slide_us) * slide_us


def assign_windows(event_us, size_us: int, slide_us: int) -> tuple[np.ndarray, np.ndarray]:
    """``(row index, window start)`` for every (record, window) pair; event times must be non-null."""
    if size_us <= 0 or slide_us <= 0 or size_us % slide_us:
        raise ValueError(f"window size {size_us} µs must be a positive multiple of the slide {slide_us} µs")
    last = last_window_start(event_us, slide_us)
    k = size_us // slide_us
    idx = np.repeat(np.arange(len(last), dtype=np.int64), k)
    starts = np.repeat(last, k) - np.tile(np.arange(k, dtype=np.int64), len(last)) * slide_us
    return idx, starts


def next_fire_us(event_us: int, size_us: int, slide_us: int, lateness_us: int, watermark_us: int | None) -> int:
    """When the watermark next fires a window of a record with event time ``event_us``: the smallest
    ``window_end + lateness`` of its windows above ``watermark_us`` (None: -inf). A record leaves the state once its
    last window has fired, so while it is held this is a firing time of one of its windows; the keyed stores file
    the record's key under it (the window's TTL index)."""
    first = (event_us // slide_us) * slide_us + slide_us + lateness_us  # its earliest-ending window, plus lateness
    if watermark_us is None or watermark_us < first:
        return first
    return first + ((watermark_us - first) // slide_us + 1) * slide_us


#: the index time of a record whose epoch is still open (a checkpoint spanning several rounds): below any firing time
PENDING_US = -(1 << 62)


def window_index(size_us: int, slide_us: int, lateness_us: int, watermark_us: int | None, *, event_i: int,
                 epoch_i: int, pending_epoch: int | None = None):
    """A keyed store's index time of a window state row (a tuple; ``event_i`` / ``epoch_i``: positions of its
    event time in µs and of its epoch): :func:`next_fire_us` above ``watermark_us``, so the keys whose windows
    fire, or whose records leave the state, when the watermark reaches W are a range scan of the index up to W;
    rows of ``pending_epoch`` (an epoch whose checkpoint spans several rounds, not yet complete) are filed under
    :data:`PENDING_US`, so the round that completes the epoch finds their keys (update emission covers every
    record of the epoch, also those of its earlier rounds)."""
    def at(row: tuple) -> int | None:
        if pending_epoch is not None and row[epoch_i] == pending_epoch:
            return PENDING_US
        t = row[event_i]
        return None if t is None else next_fire_us(t, size_us, slide_us, lateness_us, watermark_us)
    return at
