#!/usr/bin/env python3
"""The keyed store's ``apply``, scan and merged base, this checkout against an older commit, in one process,
alternating (old, new, old, new) so both see the same load; CPU seconds of the process and wall seconds, best of 2.

    .venv/bin/python benchmarks/store_bytes_ab.py --ref 49824b7 --rows 750000 --changed 0.3
    .venv/bin/python benchmarks/store_bytes_ab.py --ref 49824b7 --rows 150000 --changed 0.3 --payload 2000

``--ref``: the commit whose ``pipeline/state/{keyed_store,store_base,snapshot}.py`` are the "old" side (49824b7:
before the stores kept canonical order, docs/state.md "Deterministic bytes"). The store is filled as in
``benchmarks/store_materialize.py`` (a base chain plus ``--deltas`` deltas holding ``--changed`` of the rows).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _old_modules(ref: str) -> str:
    d = tempfile.mkdtemp(prefix="store-ab-")
    for f in ("keyed_store", "store_base", "snapshot"):
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:pipeline/state/{f}.py"], check=True,
                              capture_output=True, text=True).stdout
        text = text.replace("from pipeline.state.keyed_store import", "from old_keyed_store import")
        Path(d, f"old_{f}.py").write_text(text)
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", default="49824b7")
    ap.add_argument("--rows", type=int, default=750_000)
    ap.add_argument("--changed", type=float, default=0.3)
    ap.add_argument("--payload", type=int, default=0)
    args = ap.parse_args()
    sys.path.insert(0, _old_modules(args.ref))
    run(args.rows, args.changed, args.payload)


def run(rows_n: int, changed: float, payload: int) -> None:
    import numpy as np
    import old_keyed_store  # noqa: I001 - the --ref side, written by _old_modules
    import old_snapshot
    import old_store_base
    import pyarrow as pa

    from pipeline.fileio import LocalFileIO
    from pipeline.state import keyed_store as new_ks
    from pipeline.state import snapshot as new_sn
    from pipeline.state import store_base as new_sb
    from pipeline.state.chain import StateChain
    from pipeline.state.changelog import OP_COLUMN

    ts_type = pa.timestamp("us", tz="UTC")
    cols = [("id", pa.string()), ("_ingest_ts", ts_type), ("_kg", pa.int32())]
    schema = pa.schema(cols + ([("payload", pa.string())] if payload else []))
    rng = np.random.default_rng(1)

    def rows(n: int, start: int) -> pa.Table:
        d = {"id": [f"{x:032x}" for x in rng.integers(0, 2**62, n)],
             "_ingest_ts": pa.array(np.arange(start, start + n), pa.int64()).cast(ts_type),
             "_kg": pa.array(rng.integers(0, 16, n), pa.int32())}
        if payload:
            d["payload"] = [f"p{i % 97}-" * (payload // 4) for i in range(n)]
        return pa.table(d, schema=schema)

    ndel = 5
    n_base = int(rows_n * (1 - changed))
    per = (rows_n - n_base) // ndel
    data = [rows(n_base, 0)] + [rows(per, c * 10**9) for c in range(1, ndel + 1)]
    last = rows(per // 5, 99 * 10**9)
    for impl in ("old", "new", "old", "new"):
        ks, sb, sn = (old_keyed_store, old_store_base, old_snapshot) if impl == "old" else (new_ks, new_sb, new_sn)
        work = Path(tempfile.mkdtemp(prefix="store-ab-run-"))
        root, fio = work.as_uri(), LocalFileIO()
        st = ks.KeyedStateStore(str(work / "store" / "kg-00000-00015"), schema, "id", "_kg", "_ingest_ts")
        parent: list = []
        count, t_apply, c_apply = 0, 0.0, 0.0
        for c, new in enumerate(data):
            delta = new.append_column(OP_COLUMN, pa.array(np.ones(new.num_rows, np.int8)))
            count += new.num_rows
            t0, c0 = time.perf_counter(), time.process_time()
            for i in range(0, new.num_rows, 100_000):
                part = new.slice(i, 100_000)
                st.apply(ks.row_keys(part, "id", "_kg"), part, rows=count)
            t_apply += time.perf_counter() - t0
            c_apply += time.process_time() - c0
            if c:  # 2% of a delta's rows delete an older key
                gone = data[0].slice(c * (per // 50), per // 50)
                minus = gone.append_column(OP_COLUMN, pa.array(np.full(gone.num_rows, -1, np.int8)))
                delta = pa.concat_tables([delta, minus])
                count -= gone.num_rows
                st.apply(ks.row_keys(gone, "id", "_kg"), schema.empty_table(), rows=count)
            opts = {"checkpoint_id": c + 1, "round": 0, "shared": f"{root}/job/shared/op", "materialize": False,
                    "incremental": True, "max_deltas": 100, "max_delta_ratio": 100.0, "backend": "rocksdb"}
            fh, version = sn.write_state_changes(fio, f"{root}/job/chk-{c + 1}", "s", 0, 15, delta, count, parent,
                                                 opts, f"chk-{c + 1}", st.scan, schema)
            st.set_version(version)
            parent = [fh]
        chain = StateChain.of(parent[0])
        rd = last.append_column(OP_COLUMN, pa.array(np.ones(last.num_rows, np.int8)))
        st.apply(ks.row_keys(last, "id", "_kg"), last, rows=st.rows + last.num_rows)
        out = {"apply_s": t_apply, "apply_cpu": c_apply}
        cands = {"scan": st.scan,
                 "merge": lambda sb=sb, st=st, fio=fio, chain=chain, rd=rd: sb.merged_base(
                     fio, chain, rd, st, "bench", memory_bytes=1 << 40)}
        for name, fn in cands.items():
            best = bestc = float("inf")
            size = 0
            for _ in range(2):
                t0, c0 = time.perf_counter(), time.process_time()
                size = len(sn._streamed_parquet(schema, fn()))
                best = min(best, time.perf_counter() - t0)
                bestc = min(bestc, time.process_time() - c0)
            out[name + "_s"], out[name + "_cpu"], out[name + "_MB"] = best, bestc, size / 1e6
        st.close()
        print(impl, {k: round(v, 2) for k, v in out.items()}, f"load average {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
