"""Window assignment (docs/windows.md "Window assignment"): vectorised, windows aligned to the Unix epoch.

A record with event time ``t`` (µs) belongs to ``[s, s + S)`` for every ``s`` with ``s % D == 0`` and
``s <= t < s + S``: one window when tumbling (``D == S``), ``S / D`` when sliding.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["last_window_start", "assign_windows"]


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
