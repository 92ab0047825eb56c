"""Sink commit cost per checkpoint for each table format (no Spark: staged files are written here the way
tasks write them), plus files per table after N epochs and what compaction does.

    python scripts/bench_table_formats.py [--epochs 24] [--rows 20000] [--keys 500] [--root /tmp/x]
                                          [--formats epochal,delta,iceberg] [--s3]

``--s3``: the tables live on a moto S3 server in a child process (loopback), as in the demo.

Append table: ``--rows`` new rows per checkpoint in 2 staged files. Upsert table: ``--keys`` keys, each
checkpoint updates a third of them (one staged file per subtask, 2 subtasks).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.checkpoint.handles import FileHandle
from pipeline.config import load_config
from pipeline.fileio import file_io_for
from pipeline.sink.formats import TableFormat, open_sink_table
from pipeline.sink.table import CommitEntry


def stage(table, cid: int, sub: int, t: pa.Table) -> FileHandle:
    uri = table.part_uri(cid, sub)
    buf = pa.BufferOutputStream()
    pq.write_table(t, buf)
    data = buf.getvalue().to_pybytes()
    table.fileio.write_bytes(uri, data)
    return FileHandle(uri=uri, rows=t.num_rows, bytes=len(data), sha256="")


def run(fmt: TableFormat, mode: str, root: str, epochs: int, rows: int, keys: int) -> dict:
    cfg = load_config(env={}, sink_uri=f"{root.rstrip('/')}/{fmt.value}/{mode}")
    key = ("k",) if mode == "upsert" else ()
    t = open_sink_table(file_io_for(cfg.sink_uri), cfg, "bench", "t", mode=mode, key=key, fmt=fmt)
    schema = pa.schema([("k", pa.string()), ("v", pa.float64()), ("n", pa.int64())])
    if hasattr(t, "prepare"):
        t.prepare(schema)
    rng = np.random.default_rng(1)
    times = []
    for cid in range(1, epochs + 1):
        files = []
        for sub in range(2):
            if mode == "append":
                ks = [f"o{cid}-{sub}-{i}" for i in range(rows // 2)]
            else:
                ks = [f"m{i}" for i in range(keys) if i % 2 == sub and (i + cid) % 3 == 0]
            files.append(stage(t, cid, sub, pa.table({"k": ks, "v": rng.random(len(ks)),
                                                      "n": np.full(len(ks), cid)}, schema=schema)))
        e = CommitEntry(table="t", checkpoint_id=cid, parent_id=cid - 1 if cid > 1 else None, files=tuple(files),
                        mode=mode, key=key)
        t0 = time.perf_counter()
        t.commit(e)
        times.append(time.perf_counter() - t0)
    out = {"format": fmt.value, "mode": mode, "epochs": epochs,
           "commit_ms_median": round(statistics.median(times) * 1000, 1),
           "commit_ms_last": round(times[-1] * 1000, 1)}
    if fmt is not TableFormat.EPOCHAL:
        out["data_files_current"] = len(t.current_files())
        out["rows"] = t.open_read().num_rows
        t0 = time.perf_counter()
        out["compaction"] = compact(t)
        out["compaction_s"] = round(time.perf_counter() - t0, 2)
        out["data_files_after_compaction"] = len(t.current_files())
        assert t.open_read().num_rows == out["rows"]
    else:
        out["data_files_current"] = len(t.committed_files())
    return out


def compact(t) -> str:
    if t.format_name == "Delta":
        m = t._dt().optimize.compact()
        return f"delta optimize: {m.get('numFilesRemoved')} -> {m.get('numFilesAdded')} files"
    tbl = t._tbl()
    # pyiceberg 0.12 has no rewrite-data-files action: an overwrite of the current rows is the equivalent
    data = tbl.scan().to_arrow()
    tbl.overwrite(data, snapshot_properties={"epochal.job": t.job, "epochal.compaction": "true"})
    return "iceberg overwrite (rewrite of all rows)"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--keys", type=int, default=500)
    ap.add_argument("--root", default="")
    ap.add_argument("--formats", default="epochal,delta,iceberg")
    ap.add_argument("--s3", action="store_true", help="tables on a moto S3 server (child process, loopback)")
    a = ap.parse_args()
    formats = [TableFormat.parse(f) for f in a.formats.split(",") if f.strip()]
    moto = None
    local = Path(a.root or tempfile.mkdtemp(prefix="bench-formats-"))
    root = local.as_uri()
    if a.s3:
        import os

        from pipeline.testing.moto_server import spawn_moto_server
        moto = spawn_moto_server(["bench-formats"])
        os.environ.update(moto.env())
        root = "s3://bench-formats/run"
    try:
        for fmt in formats:
            for mode in ("append", "upsert"):
                out = run(fmt, mode, root, a.epochs, a.rows, a.keys)
                out["storage"] = "s3 (moto)" if a.s3 else "file://"
                print(json.dumps(out), flush=True)
    finally:
        if moto is not None:
            moto.stop()
        if not a.root:
            shutil.rmtree(local, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
