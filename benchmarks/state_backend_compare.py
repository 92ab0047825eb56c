"""Keyed-state backend candidates on ~1M small rows (docs/state.md, "Keyed store: choosing the engine").

Measures, for RocksDB (``rocksdict``) and DuckDB, what the keyed store does per round: a bulk put of N rows
(key = key group + user key, value = a small serialized row), a multi-get of ``--get`` random keys, and a range
scan of one key-group range (a quarter of the keys). Figures, not a timed test:

    .venv/bin/python benchmarks/state_backend_compare.py --rows 1000000 --get 50000
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import struct
import tempfile
import time


def _key(i: int) -> bytes:
    return struct.pack(">H", i % 128) + f"user-{i:012d}".encode()


def _val(i: int) -> bytes:
    return struct.pack(">qq?", i * 7, 1_700_000_000_000_000 + i, False)


def bench_rocksdb(rows: int, gets: list[int], d: str) -> dict:
    from rocksdict import Options, Rdict, WriteBatch
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    db = Rdict(d, opts)
    t0 = time.perf_counter()
    for s in range(0, rows, 50_000):
        wb = WriteBatch(raw_mode=True)
        for i in range(s, min(rows, s + 50_000)):
            wb.put(_key(i), _val(i))
        db.write(wb)
    t_put = time.perf_counter() - t0
    keys = [_key(i) for i in gets]
    t0 = time.perf_counter()
    vals = db[keys]
    t_get = time.perf_counter() - t0
    assert all(v is not None for v in vals)
    t0 = time.perf_counter()
    n = 0
    it = db.iter()
    it.seek(struct.pack(">H", 0))
    end = struct.pack(">H", 32)
    while it.valid() and it.key() < end:
        n += 1
        it.next()
    t_scan = time.perf_counter() - t0
    db.close()
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    return {"put_s": t_put, "multiget_s": t_get, "scan_s": t_scan, "scanned": n, "disk_bytes": size}


def bench_duckdb(rows: int, gets: list[int], d: str) -> dict:
    import duckdb
    import pyarrow as pa
    con = duckdb.connect(os.path.join(d, "s.duckdb"))
    con.execute("CREATE TABLE s (kg SMALLINT, k VARCHAR, a BIGINT, ts BIGINT, m BOOLEAN, PRIMARY KEY (kg, k))")
    t0 = time.perf_counter()
    for s in range(0, rows, 50_000):
        r = range(s, min(rows, s + 50_000))
        batch = pa.table({"kg": pa.array([i % 128 for i in r], pa.int16()),
                          "k": [f"user-{i:012d}" for i in r], "a": [i * 7 for i in r],
                          "ts": [1_700_000_000_000_000 + i for i in r], "m": [False] * len(r)})
        con.register("b", batch)
        con.execute("INSERT OR REPLACE INTO s SELECT * FROM b")
        con.unregister("b")
    t_put = time.perf_counter() - t0
    probe = pa.table({"kg": pa.array([i % 128 for i in gets], pa.int16()), "k": [f"user-{i:012d}" for i in gets]})
    t0 = time.perf_counter()
    con.register("p", probe)
    got = con.execute("SELECT s.* FROM s WHERE (kg, k) IN (SELECT kg, k FROM p)").to_arrow_table()
    t_get = time.perf_counter() - t0
    assert got.num_rows == len(set(gets))
    t0 = time.perf_counter()
    n = con.execute("SELECT * FROM s WHERE kg >= 0 AND kg < 32").to_arrow_table().num_rows
    t_scan = time.perf_counter() - t0
    con.close()
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    return {"put_s": t_put, "multiget_s": t_get, "scan_s": t_scan, "scanned": n, "disk_bytes": size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--get", type=int, default=50_000)
    a = ap.parse_args()
    rng = random.Random(7)
    gets = [rng.randrange(a.rows) for _ in range(a.get)]
    for name, fn in (("rocksdb", bench_rocksdb), ("duckdb", bench_duckdb)):
        d = tempfile.mkdtemp(prefix=f"epochal-{name}-")
        try:
            r = fn(a.rows, gets, d)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        print(name, " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()),
              f"load={os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
