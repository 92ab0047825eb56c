#!/usr/bin/env python3
"""Materialising a keyed store's base (PIPELINE_STATE_BACKEND=rocksdb): the candidates, measured on one subtask's
store, without Spark (one process).

    .venv/bin/python benchmarks/store_materialize.py --rows 750000 --changed 0.3             # dedup-like rows
    .venv/bin/python benchmarks/store_materialize.py --rows 200000 --payload 2000 --changed 0.3  # wide rows

A store of ``--rows`` rows (a 32-hex-digit key, a timestamp, the key group, and ``--payload`` bytes of a
compressible payload) is written as a base chain plus deltas holding ``--changed`` of the rows (new keys, as in a
growing state; 2% of them delete an older key), as an incremental checkpoint would have; then one more round's
delta is applied and a new base is built by

* ``scan``: streaming the whole store (every row pickle-decoded in Python; what a materialisation cost before);
* ``merge (deltas)``: the parent base filtered of the changed keys (vectorised) plus the changed keys' rows from
  the deltas (applied as a changelog, vectorised): :mod:`pipeline.state.store_base`;
* ``above budget``: ``merged_base`` with a zero ``PIPELINE_STATE_MERGE_MEMORY_BYTES``: the scan again (a version
  that read the changed keys' rows back from the store by multi-gets measured 4.20 s and 1.98 s on the two commands
  below: no better than the scan, dropped).

Each is timed from the first batch to the Parquet bytes (best of ``--repeat``); the load average is printed.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import numpy as np
    import pyarrow as pa

    from pipeline.fileio import LocalFileIO
    from pipeline.state.chain import StateChain
    from pipeline.state.changelog import OP_COLUMN
    from pipeline.state.keyed_store import KeyedStateStore, row_keys
    from pipeline.state.snapshot import _streamed_parquet, write_state_changes
    from pipeline.state.store_base import merged_base

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=750_000)
    ap.add_argument("--payload", type=int, default=0)
    ap.add_argument("--changed", type=float, default=0.3, help="share of the rows written by deltas since the base")
    ap.add_argument("--deltas", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    TS = pa.timestamp("us", tz="UTC")
    cols = [("id", pa.string()), ("_ingest_ts", TS), ("_kg", pa.int32())]
    if args.payload:
        cols.append(("payload", pa.string()))
    schema = pa.schema(cols)
    rng = np.random.default_rng(1)

    def rows(n: int, start: int) -> pa.Table:
        ids = [f"{x:032x}" for x in rng.integers(0, 2**62, n)]
        d = {"id": ids, "_ingest_ts": pa.array(np.arange(start, start + n), pa.int64()).cast(TS),
             "_kg": pa.array(rng.integers(0, 16, n), pa.int32())}
        if args.payload:
            d["payload"] = [f"p{i % 97}-" * (args.payload // 4) for i in range(n)]
        return pa.table(d, schema=schema)

    work = Path(tempfile.mkdtemp(prefix="store-mat-"))
    root = work.as_uri()
    fio = LocalFileIO()
    n_base = int(args.rows * (1 - args.changed))
    per_delta = (args.rows - n_base) // args.deltas
    st = KeyedStateStore(str(work / "store" / "kg-00000-00015"), schema, "id", "_kg", "_ingest_ts")
    parent: list = []  # StateHandles
    held = rows(n_base, 0)
    count = 0
    t0 = time.perf_counter()
    for c in range(args.deltas + 1):
        new = held if c == 0 else rows(per_delta, c * 10**9)
        delta = new.append_column(OP_COLUMN, pa.array(np.ones(new.num_rows, np.int8)))
        count += new.num_rows
        for i in range(0, new.num_rows, 100_000):
            part = new.slice(i, 100_000)
            st.apply(row_keys(part, "id", "_kg"), part, rows=count)
        if c:  # 2% of a delta's rows delete an older key
            gone = held.slice(c * (per_delta // 50), per_delta // 50)
            delta = pa.concat_tables([delta, gone.append_column(OP_COLUMN, pa.array(np.full(gone.num_rows, -1, np.int8)))])
            count -= gone.num_rows
            st.apply(row_keys(gone, "id", "_kg"), schema.empty_table(), rows=count)
        opts = {"checkpoint_id": c + 1, "round": 0, "shared": f"{root}/job/shared/op", "materialize": False,
                "incremental": True, "max_deltas": 100, "max_delta_ratio": 100.0, "backend": "rocksdb"}
        fh, version = write_state_changes(fio, f"{root}/job/chk-{c + 1}", "s", 0, 15, delta, count, parent, opts,
                                          f"chk-{c + 1}", st.scan, schema)
        assert fh.file is not None
        st.set_version(version)
        parent = [fh]
    chain = StateChain.of(parent[0])
    assert chain is not None and len(chain.deltas) == args.deltas, chain
    last = rows(per_delta // 5, 99 * 10**9)
    round_delta = last.append_column(OP_COLUMN, pa.array(np.ones(last.num_rows, np.int8)))
    st.apply(row_keys(last, "id", "_kg"), last, rows=st.rows + last.num_rows)
    print(f"store: {st.rows:,} rows ({args.payload} B payload), chain: base {chain.base.rows:,} rows "
          f"+ {len(chain.deltas)} deltas ({sum(f.rows for f in chain.deltas):,} rows), round delta "
          f"{round_delta.num_rows:,} rows; setup {time.perf_counter() - t0:.1f} s; load average "
          f"{os.getloadavg()[0]:.2f}")
    cands = {"scan": lambda: st.scan(),
             "merge (deltas)": lambda: merged_base(fio, chain, round_delta, st, "bench", memory_bytes=1 << 40),
             "above budget": lambda: merged_base(fio, chain, round_delta, st, "bench", memory_bytes=0)}
    for name, fn in cands.items():
        best, size = float("inf"), 0
        for _ in range(args.repeat):
            t = time.perf_counter()
            size = len(_streamed_parquet(schema, fn()))
            best = min(best, time.perf_counter() - t)
        print(f"{name:16s} {best:7.2f} s  ({size / 1e6:.1f} MB of Parquet)  load average {os.getloadavg()[0]:.2f}")
    st.close()


if __name__ == "__main__":
    main()
