"""Memory bounds of the keyed stores (pipeline.state.store_memory) and wide rows in bounded slices
(pipeline.state.keyed_store), on a real RocksDB."""
from __future__ import annotations

import pyarrow as pa
import pytest

from pipeline.exceptions import ConfigError
from pipeline.state.keyed_store import KeyedStateStore, StoreLocation, row_keys, slice_rows
from pipeline.state.store_memory import StoreMemory

pytestmark = pytest.mark.unit

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("key", pa.string()), ("payload", pa.string()), ("_ingest_ts", TS), ("_kg", pa.int32())])


def test_bounds_from_the_environment_with_documented_defaults():
    assert StoreMemory.from_env({}) == StoreMemory(write_buffer_bytes=8 << 20, write_buffers=2, cache_bytes=32 << 20,
                                                   max_open_files=64)
    m = StoreMemory.from_env({"PIPELINE_STATE_STORE_CACHE_BYTES": "1048576", "PIPELINE_STATE_STORE_WRITE_BUFFERS": "3",
                              "PIPELINE_STATE_STORE_WRITE_BUFFER_BYTES": " 262144 ",
                              "PIPELINE_STATE_STORE_MAX_OPEN_FILES": "-1"})
    assert (m.cache_bytes, m.write_buffers, m.write_buffer_bytes, m.max_open_files) == (1 << 20, 3, 1 << 18, -1)
    for key, bad in (("PIPELINE_STATE_STORE_CACHE_BYTES", "0"), ("PIPELINE_STATE_STORE_WRITE_BUFFERS", "two"),
                     ("PIPELINE_STATE_STORE_MAX_OPEN_FILES", "-2"), ("PIPELINE_STATE_STORE_WRITE_BUFFER_BYTES", "1024")):
        with pytest.raises(ConfigError, match=key):
            StoreMemory.from_env({key: bad})


def _wide(n: int, width: int, start: int = 0) -> pa.Table:
    keys = [f"k{(start + i) // 3:07d}" for i in range(n)]  # three rows per key: keys span slice boundaries
    return pa.table([pa.array(keys), pa.array([f"{i:08d}" + "x" * width for i in range(start, start + n)]),
                     pa.array(list(range(start, start + n)), pa.int64()).cast(TS),
                     pa.array([(i // 3) % 5 for i in range(start, start + n)], pa.int32())], schema=SCHEMA)


def test_wide_rows_in_bounded_slices_under_small_bounds(tmp_path, monkeypatch):
    """Rows of 20 KB: a write, a scan and a rebuild's batches hold about 4 MB at a time (not 16k rows = 320 MB),
    keys with several rows are never split, and a store under small memory bounds (64 KiB memtables, 1 MiB cache
    shared by two stores) holds and returns every row."""
    monkeypatch.setenv("PIPELINE_STATE_STORE_CACHE_BYTES", str(1 << 20))
    monkeypatch.setenv("PIPELINE_STATE_STORE_WRITE_BUFFER_BYTES", str(64 << 10))
    width = 20_000
    assert slice_rows(width) == (4 << 20) // width and slice_rows(10) == 16_384 and slice_rows(10**9) == 64
    t = _wide(1500, width)
    a = KeyedStateStore(StoreLocation("j", "op", "a", 0, 4).path(str(tmp_path)), SCHEMA, "key", "_kg", "_ingest_ts")
    b = KeyedStateStore(StoreLocation("j", "op", "b", 0, 4).path(str(tmp_path)), SCHEMA, "key", "_kg", "_ingest_ts")
    with a, b:
        for st in (a, b):
            st.apply(list(dict.fromkeys(row_keys(t, "key", "_kg"))), t, rows=t.num_rows)
        batches = list(a.scan())
        assert max(x.nbytes for x in batches) <= (4 << 20) + 4 * width and len(batches) >= 7
        got = pa.Table.from_batches(batches, schema=SCHEMA).sort_by([("payload", "ascending")])
        assert got.equals(t.sort_by([("payload", "ascending")]))
        assert b.get(row_keys(t.slice(0, 1), "key", "_kg")).num_rows == 3 and b.rows == 1500
