"""The row schema of the keyed-store unit tests (tests/unit/state/test_keyed_store.py, test_store_base.py):
a string key, a count, the ingest time and the key group."""
from __future__ import annotations

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("key", pa.string()), ("n", pa.int64()), ("_ingest_ts", TS), ("_kg", pa.int32())])
