"""Helpers for the source tests: write small hand-made source files."""
from __future__ import annotations

import io
import json
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.fileio import file_io_for, join_uri

TS = pa.timestamp("us", tz="UTC")
BASE = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z in microseconds
SCHEMA = pa.schema([("order_id", pa.string()), ("amount", pa.float64()), ("event_time", TS), ("_ingest_ts", TS)])


def rows_table(ts: Sequence[int | None], *, prefix: str = "o", ids: Sequence[str | None] | None = None,
               amounts: Sequence[float | None] | None = None, ts_type: pa.DataType = TS) -> pa.Table:
    n = len(ts)
    ids = list(ids) if ids is not None else [f"{prefix}{i}" for i in range(n)]
    amounts = list(amounts) if amounts is not None else [float(i) for i in range(n)]
    ts_arr = pa.array(list(ts), pa.int64())
    if pa.types.is_timestamp(ts_type) and ts_type.unit == "ns":
        ts_arr = pa.array([None if v is None else v * 1000 for v in ts], pa.int64())
    return pa.table({"order_id": pa.array(ids, pa.string()), "amount": pa.array(amounts, pa.float64()),
                     "event_time": pa.array(list(ts), pa.int64()).cast(TS),
                     "_ingest_ts": ts_arr.cast(ts_type) if ts_type != pa.int64() else ts_arr})


def uri_of(root: str, source: str, partition: int, seq: int, ext: str = "parquet") -> str:
    return join_uri(root, source, f"partition={partition}", f"{seq:08d}.{ext}")


def write_parquet(root: str, source: str, partition: int, seq: int, table: pa.Table, *,
                  row_group_size: int | None = None, write_statistics: bool = True) -> str:
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=row_group_size, write_statistics=write_statistics)
    uri = uri_of(root, source, partition, seq)
    file_io_for(uri).write_bytes(uri, buf.getvalue())
    return uri


def write_bytes(root: str, source: str, partition: int, seq: int, data: bytes, ext: str = "parquet") -> str:
    uri = uri_of(root, source, partition, seq, ext)
    file_io_for(uri).write_bytes(uri, data)
    return uri


def write_jsonl(root: str, source: str, partition: int, seq: int, records: Sequence[dict]) -> str:
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    return write_bytes(root, source, partition, seq, data, "jsonl")


def iso(us: int) -> str:
    import datetime as dt

    return (dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=us)).isoformat().replace(
        "+00:00", "Z")
