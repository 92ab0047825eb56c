"""Deliberate corruptions of a job's storage, written directly with pyarrow / json on the storage paths.

Nothing here goes through Epochal's API (no FileIO, no CheckpointMetadata, no CommittedTable): the point
is to break storage the way a bug, an operator or a broken disk would, and see the suites notice.

``consistent=True`` corruptions also patch the recorded size/rows/sha256 in ``_metadata`` (and the commit
entry), as if the runtime itself had written the wrong data: then only the data-level suites (state, sink,
recovery) can notice, not the checksum checks.
"""
from __future__ import annotations

import glob
import hashlib
import io
import json
import os
import shutil
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

JOB = "orders_payments"


def path_of(uri: str) -> str:
    return urlsplit(uri).path


def relocate(src_root: Path, dst_root: Path) -> None:
    """Copy a whole local deployment (src/, ckpt/, sink/) and rewrite the absolute URIs it records."""
    shutil.copytree(src_root, dst_root)
    old, new = src_root.as_uri(), dst_root.as_uri()
    for p in dst_root.rglob("*"):
        if p.is_file() and (p.name in ("_metadata", "_pending.json") or p.suffix == ".json"):
            text = p.read_text()
            if old in text:
                p.write_text(text.replace(old, new))


def checkpoint_dir(root: Path, cid: int) -> Path:
    return root / "ckpt" / JOB / "checkpoints" / f"chk-{cid}"


def latest_checkpoint(root: Path) -> int:
    pattern = root / "ckpt" / JOB / "checkpoints" / "chk-*" / "_metadata"
    ids = [int(Path(p).parent.name[4:]) for p in glob.glob(str(pattern))]
    return max(ids)


def load_metadata(root: Path, cid: int) -> dict:
    return json.loads((checkpoint_dir(root, cid) / "_metadata").read_text())


def save_metadata(root: Path, cid: int, md: dict) -> None:
    (checkpoint_dir(root, cid) / "_metadata").write_text(json.dumps(md, indent=1, sort_keys=True) + "\n")


def state_handle(md: dict, operator: str, name: str, subtask: int = 0) -> dict:
    for h in md["operators"][operator]:
        if h["name"] == name and h["subtask"] == subtask and h["file"]:
            return h
    raise KeyError(f"no state file {operator}/{name}[{subtask}]")


def _parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="snappy")
    return buf.getvalue()


def rewrite_parquet(uri: str, change: Callable[[pa.Table], pa.Table]) -> dict:
    """Rewrite a Parquet file in place; returns its new {rows, bytes, sha256}."""
    path = path_of(uri)
    table = change(pq.read_table(path))
    data = _parquet_bytes(table)
    Path(path).write_bytes(data)
    return {"rows": table.num_rows, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _patch_handle_everywhere(root: Path, uri: str, new: dict) -> None:
    """Update the recorded rows/bytes/sha256 of file ``uri`` in every _metadata and commit entry."""
    files = list((root / "ckpt").rglob("_metadata")) + list((root / "sink").rglob("_commits/*.json"))
    for p in files:
        text = p.read_text()
        if uri not in text:
            continue
        doc = json.loads(text)

        def visit(x):
            if isinstance(x, dict):
                if x.get("uri") == uri and "sha256" in x:
                    x.update(new)
                for v in x.values():
                    visit(v)
            elif isinstance(x, list):
                for v in x:
                    visit(v)
        visit(doc)
        p.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def change_state(root: Path, cid: int, operator: str, name: str, change: Callable[[pa.Table], pa.Table], *,
                 subtask: int = 0, consistent: bool = True) -> str:
    md = load_metadata(root, cid)
    uri = state_handle(md, operator, name, subtask)["file"]["uri"]
    new = rewrite_parquet(uri, change)
    if consistent:
        _patch_handle_everywhere(root, uri, new)
    return uri


# --------------------------------------------------------------------------------------------- corruptions
def duplicate_state_key(root: Path, cid: int) -> str:
    """The aggregate state holds one merchant twice (a duplicated key)."""
    return change_state(root, cid, "merchant_revenue_agg", "agg", lambda t: pa.concat_tables([t, t.slice(0, 1)]))


def drop_state_row(root: Path, cid: int) -> str:
    """One unmatched order disappears from the join state (a dropped row)."""
    return change_state(root, cid, "paid_orders_join", "left", lambda t: t.slice(1))


def skew_total(root: Path, cid: int, delta: float = 100.0) -> str:
    """One merchant's revenue in the aggregate state is off by ``delta`` (a skewed total)."""
    def change(t: pa.Table) -> pa.Table:
        col = t["revenue"]  # float64, or an exact decimal sum
        values = col.to_pylist()
        values[0] = values[0] + (Decimal(str(delta)) if isinstance(values[0], Decimal) else delta)
        return t.set_column(t.schema.get_field_index("revenue"), "revenue", pa.array(values, col.type))
    return change_state(root, cid, "merchant_revenue_agg", "agg", change)


def delete_state_file(root: Path, cid: int) -> str:
    """A state file referenced by the checkpoint is gone (a missing state file)."""
    md = load_metadata(root, cid)
    uri = state_handle(md, "paid_orders_join", "left", 0)["file"]["uri"]
    os.remove(path_of(uri))
    return uri


def checksum_mismatch(root: Path, cid: int) -> str:
    """A state file is rewritten with the same rows but different bytes; the metadata is left alone."""
    md = load_metadata(root, cid)
    uri = state_handle(md, "paid_orders_join", "right", 0)["file"]["uri"]
    table = pq.read_table(path_of(uri))
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="gzip")
    Path(path_of(uri)).write_bytes(buf.getvalue())
    return uri


def _commits_dir(root: Path, table: str) -> Path:
    return root / "sink" / JOB / table / "_commits"


def _commit(root: Path, table: str, cid: int) -> dict:
    return json.loads((_commits_dir(root, table) / f"{cid:012d}.json").read_text())


def commit_epoch_twice(root: Path, table: str = "paid_orders") -> int:
    """The output of an already committed epoch is staged again and committed under a new id."""
    commits = sorted(_commits_dir(root, table).glob("*.json"))
    head = json.loads(commits[-1].read_text())
    # the epoch before the head (with output)
    source = next(json.loads(p.read_text()) for p in reversed(commits[:-1]) if json.loads(p.read_text())["files"])
    new_id = head["checkpoint_id"] + 1
    txn = root / "sink" / JOB / table / "data" / f"txn-{new_id}"
    txn.mkdir(parents=True)
    files = []
    for f in source["files"]:
        dst = txn / Path(path_of(f["uri"])).name
        shutil.copyfile(path_of(f["uri"]), dst)
        files.append({**f, "uri": dst.as_uri()})
    entry = {**head, "checkpoint_id": new_id, "parent_id": head["checkpoint_id"], "files": files}
    (_commits_dir(root, table) / f"{new_id:012d}.json").write_text(json.dumps(entry, indent=1, sort_keys=True))
    return new_id


def at_least_once_replay(root: Path, cid: int) -> str:
    """What at-least-once checkpointing does after a crash and a restore, written by hand:

    * snapshot ``cid`` already counted records from after its barrier (the tracker never blocks): an order
      ingested after barrier n sits in the join state;
    * after the restore those records, and the output the replayed epoch had produced, are processed and
      committed again: the head's transaction gets an extra file replaying rows of the previous epoch.
      The commit entry and the checkpoint's metadata are updated consistently, as the runtime would have.
    """
    md = load_metadata(root, cid)
    barrier = datetime.fromisoformat(md["barrier_time"].replace("Z", "+00:00"))

    # 1. post-barrier data in the state (exactly-once would have blocked it)
    def late(t: pa.Table) -> pa.Table:
        row = t.slice(0, 1)
        row = row.set_column(row.schema.get_field_index("order_id"), "order_id", pa.array(["o-replayed-after-barrier"]))
        row = row.set_column(row.schema.get_field_index("_ingest_ts"), "_ingest_ts",
                             pa.array([barrier], t.schema.field("_ingest_ts").type))
        return pa.concat_tables([t, row.cast(t.schema)])
    change_state(root, cid, "paid_orders_join", "left", late)
    # 2. replayed output committed again in the head transaction
    table = "paid_orders"
    entry = _commit(root, table, cid)
    prev = next(_commit(root, table, c) for c in range(cid - 1, 0, -1)
                if (_commits_dir(root, table) / f"{c:012d}.json").exists() and _commit(root, table, c)["files"])
    replay = pq.read_table(path_of(prev["files"][0]["uri"])).slice(0, 5)
    dst = Path(path_of(entry["files"][0]["uri"])).parent / "part-replay-00000.parquet"
    data = _parquet_bytes(replay)
    dst.write_bytes(data)
    fh = {"uri": dst.as_uri(), "rows": replay.num_rows, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    entry["files"].append(fh)
    (_commits_dir(root, table) / f"{cid:012d}.json").write_text(json.dumps(entry, indent=1, sort_keys=True))
    md = load_metadata(root, cid)
    md["sinks"][table]["files"].append(fh)
    md["checkpoint_mode"] = "at_least_once"
    save_metadata(root, cid, md)
    return dst.as_uri()
