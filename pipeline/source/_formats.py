"""Private helpers shared by the planner (driver) and the reader (executors).

Both sides must agree exactly on how many rows a file has and on which ``_ingest_ts`` values are usable,
so the parsing and casting rules live here, once:

* JSON Lines are parsed by ``pyarrow.json`` as one block (types inferred over the whole file). An empty or
  whitespace-only file has zero rows. Blank lines are skipped. A line that is not a JSON object, or a
  column whose JSON type changes between lines, makes the whole file unreadable.
* Casting to a declared type: timestamps may be truncated to microseconds and naive timestamps are taken
  as UTC; other casts are safe casts. A *type* that cannot be cast at all (no cast kernel, e.g. a struct to
  double) is a schema mismatch of the whole file; a *value* that cannot be cast (``"abc"`` to double) makes
  only that record bad.
"""
from __future__ import annotations

import codecs
import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from pipeline.exceptions import TypeMismatch

__all__ = ["TS_US", "NO_TS", "TypeMismatch", "read_jsonl", "cast_lenient", "ingest_us", "CONTENT_ERRORS"]

TS_US = pa.timestamp("us", tz="UTC")
INGEST_TS = "_ingest_ts"
NO_TS = np.iinfo(np.int64).min  # sentinel for "no usable _ingest_ts" (never >= any boundary)
_MAX_BLOCK = 2**31 - 1

# exceptions that mean "the bytes are not a valid file of this format" (never I/O trouble)
CONTENT_ERRORS: tuple[type[BaseException], ...] = (
    pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowKeyError,
    pa.ArrowIndexError, pa.ArrowCapacityError, pa.ArrowSerializationError, ValueError, UnicodeDecodeError,
    EOFError,
)


def read_jsonl(data: bytes) -> pa.Table:
    """Parse JSON Lines bytes into a table (zero rows, no columns, for an empty file)."""
    if not data.strip():
        return pa.table({})
    # JSON is UTF-8: pyarrow's reader does not check it, so bytes of another encoding would only fail later
    # (column names, Spark) with a bare UnicodeDecodeError; here they make the file unreadable (a content error)
    codecs.decode(data, "utf-8")
    opts = pj.ReadOptions(use_threads=False, block_size=min(_MAX_BLOCK, max(1 << 20, len(data) + 1)))
    return pj.read_json(io.BytesIO(data), read_options=opts)


def _cast_options(target: pa.DataType) -> pc.CastOptions:
    return pc.CastOptions(target, allow_time_truncate=pa.types.is_timestamp(target))


def _cast(arr: pa.Array, target: pa.DataType) -> pa.Array:
    src = arr.type
    if (pa.types.is_timestamp(src) and pa.types.is_timestamp(target) and src.tz is None
            and target.tz is not None):
        arr = arr.cast(pa.timestamp(src.unit, tz="UTC"))  # naive timestamps are UTC
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    return pc.cast(arr, options=_cast_options(target))


def _bad_positions(arr: pa.Array, target: pa.DataType, offset: int, out: list[int]) -> None:
    """Positions (relative to the full array) of values that cannot be cast; bisection keeps it cheap."""
    try:
        _cast(arr, target)
        return
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError):
        pass
    if len(arr) == 1:
        out.append(offset)
        return
    half = len(arr) // 2
    _bad_positions(arr.slice(0, half), target, offset, out)
    _bad_positions(arr.slice(half), target, offset + half, out)


def cast_lenient(arr: pa.Array | pa.ChunkedArray, target: pa.DataType) -> tuple[pa.Array, np.ndarray | None]:
    """Cast ``arr`` to ``target``; values that cannot be cast become null and are flagged.

    Returns ``(cast array, bad mask or None)``. Raises :class:`TypeMismatch` when the types are
    incompatible (schema mismatch).
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if arr.type == target:
        return arr, None
    try:
        return _cast(arr, target), None
    except pa.ArrowNotImplementedError as e:
        raise TypeMismatch(f"cannot cast {arr.type} to {target}: {e}") from e
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError):
        pass
    positions: list[int] = []
    _bad_positions(arr, target, 0, positions)
    bad = np.zeros(len(arr), dtype=bool)
    bad[positions] = True
    cleaned = pc.if_else(pa.array(bad), pa.nulls(len(arr), arr.type), arr)
    return _cast(cleaned, target), bad


def ingest_us(arr: pa.Array | pa.ChunkedArray | None, rows: int) -> np.ndarray:
    """``_ingest_ts`` values as int64 microseconds; :data:`NO_TS` where null, missing or uncastable."""
    if arr is None:
        return np.full(rows, NO_TS, dtype=np.int64)
    try:
        cast, _bad = cast_lenient(arr, TS_US)
    except TypeMismatch:
        return np.full(rows, NO_TS, dtype=np.int64)
    ints = cast.view(pa.int64()) if isinstance(cast, pa.Array) else cast
    return np.asarray(pc.fill_null(ints, NO_TS).to_numpy(zero_copy_only=False), dtype=np.int64)


def json_default(value: Any) -> Any:
    """``json.dumps`` fallback for raw values in dead-letter records."""
    import base64
    import datetime as _dt
    import decimal

    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, np.generic):
        return value.item()
    return repr(value)
