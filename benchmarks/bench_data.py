"""Benchmark data and output checks: the demo data (generated once per timeline, optionally uploaded to moto S3)
and readers of committed output that resolve each system's commit protocol, compared with the oracle."""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from bench_machine import say


# ------------------------------------------------------------------------------------------------- data
def _gen_config(a: argparse.Namespace) -> dict:
    return {"epochs": a.epochs, "partitions": a.partitions, "orders_per_epoch": a.orders // a.epochs,
            "seed": a.seed, "epoch_seconds": a.epoch_seconds}


def prepare_data(a: argparse.Namespace) -> tuple[str, dict]:
    """Local data root (generated once per timeline) and the generator's summary."""
    from pipeline.demo.generate import STATE_FILE, generate
    g = _gen_config(a)
    name = f"o{a.orders}-e{a.epochs}-p{a.partitions}-s{a.seed}-E{a.epoch_seconds}"
    root = os.path.join(a.workdir, "data", name)
    state_path = os.path.join(root, STATE_FILE)
    if os.path.exists(state_path):
        st = json.loads(Path(state_path).read_text())
        c = st["config"]
        if (st.get("epochs") == g["epochs"] and c["partitions"] == g["partitions"] and c["seed"] == g["seed"]
                and c["orders_per_epoch"] == g["orders_per_epoch"] and c["epoch_seconds"] == g["epoch_seconds"]):
            say(f"data: reusing {root} ({st['rows']})")
            return root, {"rows": st["rows"], "files": st["files"], "reused": True, "config": c}
        shutil.rmtree(root)
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.dirname(root), exist_ok=True)
    t = time.time()
    say(f"data: generating {g['orders_per_epoch'] * a.epochs} orders (+ payments), {a.epochs} epochs x "
        f"{a.partitions} partitions per source into {root} ...")
    s = generate("file://" + root, epochs=a.epochs, partitions=a.partitions, orders_per_epoch=g["orders_per_epoch"],
                 seed=a.seed, epoch_seconds=a.epoch_seconds)
    say(f"data: {s.rows} in {s.files} files, {time.time() - t:.1f}s")
    return root, {"rows": s.rows, "files": s.files, "reused": False, "gen_s": round(time.time() - t, 1)}


def upload_to_s3(local_root: str, s3_root: str) -> int:
    """Copy the local data byte for byte (so both storages hold the same data)."""
    from pipeline.fileio import file_io_for
    fio = file_io_for(s3_root)
    n = 0
    for d, _, files in os.walk(local_root):
        for f in files:
            path = os.path.join(d, f)
            rel = os.path.relpath(path, local_root).replace(os.sep, "/")
            with open(path, "rb") as fh:
                fio.write_bytes(f"{s3_root}/{rel}", fh.read())
            n += 1
    return n


# ------------------------------------------------------------------------------------- output readers
def _visible_parquet(path: str) -> list[str]:
    return sorted(f for f in glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True)
                  if not any(c.startswith(("_", ".")) for c in os.path.relpath(f, path).split(os.sep)))


def resolve_committed(path: str) -> tuple[list[str], dict]:
    """Committed Parquet files of a peer's output directory, as a correct reader sees them.

    * Spark file sink (``_spark_metadata/<batch>[.compact]``): replay the log from the newest compaction
      on; each line after the version header is ``{"path", "action": "add"|"delete", ...}``. Files in
      the directory that the log does not list are uncommitted (orphans of a failed batch).
    * ``_LATEST`` pointer: the directory named in it holds the current full snapshot.
    * otherwise every visible ``*.parquet`` (a batch job's output, written with ``_SUCCESS``).
    """
    meta = os.path.join(path, "_spark_metadata")
    if os.path.isdir(meta):
        logs: dict[int, str] = {}
        for f in os.listdir(meta):
            m = re.fullmatch(r"(\d+)(\.compact)?", f)
            if m:
                logs[int(m.group(1))] = f
        start = max((b for b, f in logs.items() if f.endswith(".compact")), default=-1)
        live: set[str] = set()
        for b in sorted(b for b in logs if b >= start):
            with open(os.path.join(meta, logs[b])) as fh:
                lines = fh.read().splitlines()
            for line in lines[1:]:
                if not line.strip():
                    continue
                e = json.loads(line)
                p = re.sub(r"^file:(//)?", "", e["path"])
                if e.get("action", "add") == "add":
                    live.add(p)
                else:
                    live.discard(p)
        files = sorted(live)
        orphans = [f for f in _visible_parquet(path) if f not in live]
        return files, {"reader": "_spark_metadata", "files": len(files), "orphans": len(orphans)}
    latest = os.path.join(path, "_LATEST")
    if os.path.exists(latest):
        with open(latest) as fh:
            version = fh.read().strip()
        files = sorted(glob.glob(os.path.join(path, version, "*.parquet")))
        return files, {"reader": "_LATEST", "version": version, "files": len(files)}
    files = _visible_parquet(path)
    return files, {"reader": "all visible parquet", "files": len(files)}


def read_files(files: Sequence[str]):
    import pyarrow as pa
    import pyarrow.parquet as pq
    if not files:
        raise ValueError("no committed files")
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="permissive")


def verify_dirs(exp, paid_dir: str, rev_dir: str) -> dict:
    from pipeline.demo.oracle import compare
    try:
        pf, pinfo = resolve_committed(paid_dir)
        rf, rinfo = resolve_committed(rev_dir)
        rep = compare(exp, read_files(pf), read_files(rf))
    except Exception as e:  # noqa: BLE001 - a broken output is a wrong output
        return {"correct": False, "error": f"{type(e).__name__}: {e}"}
    d = rep.to_dict()
    return {"correct": rep.ok, "paid_orders": _diff_summary(d["paid_orders"]),
            "merchant_revenue": _diff_summary(d["merchant_revenue"]), "readers": {"paid_orders": pinfo,
                                                                                 "merchant_revenue": rinfo}}


def _diff_summary(d: dict) -> dict:
    return {k: d[k] for k in ("expected_rows", "actual_rows", "missing", "extra", "duplicates", "error") if k in d}
