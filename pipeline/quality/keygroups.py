"""Key groups recomputed independently of Spark (vectorised XXH64 in NumPy).

The runtime assigns ``kg = pmod(xxhash64(key), max_parallelism)`` with Spark's ``xxhash64`` (XXH64, seed
42, over the UTF-8 bytes of a string key). The quality suites recompute it here, on the driver, without
Spark and without the runtime's code, so a state row filed under the wrong key group, or an expected row
of the oracle, can be placed in its key group cheaply (about 0.3 s per million keys).
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["xxhash64", "key_groups", "SPARK_SEED"]

SPARK_SEED = 42
_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
_M64 = (1 << 64) - 1


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _round(acc: np.ndarray, lane: np.ndarray) -> np.ndarray:
    return _rotl(acc + lane * _P2, 31) * _P1


def _merge(acc: np.ndarray, val: np.ndarray) -> np.ndarray:
    return (acc ^ _round(np.zeros_like(val), val)) * _P1 + _P4


class _Buffer:
    """Unaligned little-endian word reads from a byte buffer, vectorised over many offsets."""

    def __init__(self, data: np.ndarray) -> None:
        padded = np.zeros(len(data) + 24, dtype=np.uint8)
        padded[: len(data)] = data
        self.b = padded
        self.w = padded[: (len(padded) // 8) * 8].view("<u8")

    def u64(self, off: np.ndarray) -> np.ndarray:
        q = off >> 3
        shift = ((off & 7) * 8).astype(np.uint64)
        lo = self.w[q]
        hi = self.w[q + 1]
        with np.errstate(over="ignore"):
            combined = (lo >> shift) | (hi << (np.uint64(64) - shift))
        return np.where(shift == 0, lo, combined)

    def u32(self, off: np.ndarray) -> np.ndarray:
        return self.u64(off) & np.uint64(0xFFFFFFFF)

    def u8(self, off: np.ndarray) -> np.ndarray:
        return self.b[off].astype(np.uint64)


def _hash_fixed(buf: _Buffer, starts: np.ndarray, length: int, seed: int) -> np.ndarray:
    """XXH64 of the ``length``-byte strings starting at byte offsets ``starts`` of ``buf``."""
    n = len(starts)
    seed64 = np.uint64(seed & _M64)
    pos = 0
    with np.errstate(over="ignore"):
        if length >= 32:
            v1 = np.full(n, (seed + int(_P1) + int(_P2)) & _M64, dtype=np.uint64)
            v2 = np.full(n, (seed + int(_P2)) & _M64, dtype=np.uint64)
            v3 = np.full(n, seed64, dtype=np.uint64)
            v4 = np.full(n, (seed - int(_P1)) & _M64, dtype=np.uint64)
            while pos + 32 <= length:
                v1 = _round(v1, buf.u64(starts + pos))
                v2 = _round(v2, buf.u64(starts + pos + 8))
                v3 = _round(v3, buf.u64(starts + pos + 16))
                v4 = _round(v4, buf.u64(starts + pos + 24))
                pos += 32
            h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
            for v in (v1, v2, v3, v4):
                h = _merge(h, v)
        else:
            h = np.full(n, (seed + int(_P5)) & _M64, dtype=np.uint64)
        h = h + np.uint64(length)
        zero = np.zeros(n, dtype=np.uint64)
        while pos + 8 <= length:
            h ^= _round(zero, buf.u64(starts + pos))
            h = _rotl(h, 27) * _P1 + _P4
            pos += 8
        if pos + 4 <= length:
            h ^= buf.u32(starts + pos) * _P1
            h = _rotl(h, 23) * _P2 + _P3
            pos += 4
        while pos < length:
            h ^= buf.u8(starts + pos) * _P5
            h = _rotl(h, 11) * _P1
            pos += 1
        h ^= h >> np.uint64(33)
        h *= _P2
        h ^= h >> np.uint64(29)
        h *= _P3
        h ^= h >> np.uint64(32)
    return h


def _xxhash64_fixed(arr: pa.Array, width: int, seed: int) -> np.ndarray:
    """Spark's ``hashLong`` (``width`` 8: longs, timestamps as µs, doubles as their bits) or ``hashInt`` (4: ints,
    shorts, bytes, booleans, dates as days) of a fixed-width array: XXH64 of the little-endian value."""
    n = len(arr)
    out = np.full(n, seed & _M64, dtype=np.uint64)
    valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    dtype = {8: "<i8", 4: "<i4"}[width]
    vals = np.asarray(arr.fill_null(0).to_numpy(zero_copy_only=False)).astype(dtype)
    buf = _Buffer(vals.view(np.uint8))
    idx = np.nonzero(valid)[0]
    if len(idx):
        out[idx] = _hash_fixed(buf, (idx * width).astype(np.int64), width, seed)
    return out.view(np.int64)


def _fixed_form(arr: pa.Array) -> tuple[pa.Array, int] | None:
    """``arr`` as the integers Spark hashes and their width, for non-string key types (None: hashed as text)."""
    t = arr.type
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return arr.cast(pa.int64()), 8
    if pa.types.is_integer(t) and t.bit_width <= 32:
        return arr.cast(pa.int32()), 4
    if pa.types.is_boolean(t):
        return arr.cast(pa.int32()), 4
    if pa.types.is_timestamp(t):
        return arr.cast(pa.timestamp("us", tz=t.tz)).view(pa.int64()), 8
    if pa.types.is_date32(t):
        return arr.view(pa.int32()), 4
    if pa.types.is_float64(t):
        return pa.array(np.asarray(arr.fill_null(0.0).to_numpy(zero_copy_only=False), np.float64).view(np.int64),
                        mask=np.asarray(arr.is_null().to_numpy(zero_copy_only=False), bool)), 8
    return None


def xxhash64(keys: pa.Array | pa.ChunkedArray | list, seed: int = SPARK_SEED) -> np.ndarray:
    """Spark-compatible ``xxhash64`` of keys as int64 (nulls hash to ``seed``, as in Spark): strings over their
    UTF-8 bytes, integers, booleans, dates, timestamps and doubles as Spark's ``hashInt``/``hashLong``."""
    arr = keys if isinstance(keys, (pa.Array, pa.ChunkedArray)) else pa.array(keys, pa.string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], arr.type)
    fixed = _fixed_form(arr)
    if fixed is not None:
        return _xxhash64_fixed(fixed[0], fixed[1], seed)
    arr = arr.cast(pa.large_string())
    n = len(arr)
    out = np.full(n, seed & _M64, dtype=np.uint64)
    if n == 0:
        return out.view(np.int64)
    valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    buf = _Buffer(data)
    lengths = np.diff(offsets)
    for length in np.unique(lengths[valid]):
        idx = np.nonzero(valid & (lengths == length))[0]
        out[idx] = _hash_fixed(buf, offsets[idx], int(length), seed)
    return out.view(np.int64)


def key_groups(keys: pa.Array | pa.ChunkedArray | list, max_parallelism: int) -> np.ndarray:
    """``pmod(xxhash64(key), max_parallelism)`` per key (int32), as the runtime computes it in Spark."""
    h = xxhash64(keys)
    return np.mod(h, np.int64(max_parallelism)).astype(np.int32)


def _selftest() -> None:  # pragma: no cover - used by the tests against Spark
    print(key_groups(pc.cast(pa.array(["a"]), pa.string()), 128))
