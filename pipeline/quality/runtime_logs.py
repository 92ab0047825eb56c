"""An independent check of the logs the runtime wrote and the batch evaluation trusts.

The batch evaluation places every source row in its processing epoch with the write-ahead **barrier log**
(``barriers/epoch-<n>.json``), splits epochs into rounds with the **round log** (``barriers/rounds/``) and places
the rows a lagging checkpoint read with the **lag log** (``barriers/lagged/``), all written by the runtime. A wrong
entry in them would make the runtime and the batch evaluation agree on a wrong answer. So they are checked here
against evidence that shares no code with the runtime's source reader:

* **barriers**: the source files are listed and their ``_ingest_ts`` column read with pyarrow directly
  (``pyarrow.fs`` and ``pyarrow.parquet`` / ``pyarrow.json``; not Epochal's listing, summaries or reader). Per
  partition the rows are put in log order (file sequence number, row in file); barrier n must be the first row
  whose ``_ingest_ts >=`` the end of epoch n (a running maximum and one ``searchsorted`` per epoch, vectorised). A
  partition the entry marks idle must have no such row before its barrier.
* **rounds**: an entry ``epoch-<e>-chk-<id>-r<k>.json`` must name the checkpoint and epoch of its file name; for a
  checkpoint whose ``_metadata`` is known, ``k`` is below its number of rounds, ``e`` is its epoch, and every start
  lies between the parent's restore position and the checkpoint's barrier (where known; no upper bound for an
  at-least-once checkpoint, whose rounds may read past its barrier).
* **lag log**: an entry must name the checkpoint and epoch of its file name; for a known checkpoint, its barriers
  equal the checkpoint's ``_metadata`` barriers and its read positions are not before the parent's positions.

Dataset ``runtime_logs``: one row per checked entry and partition - ``file`` (the log file), ``checkpoint``
(``chk-<id>`` the entry belongs to, or the validated checkpoint for barrier entries), ``source``, ``partition``,
``logged``, ``expected`` (positions as ``seq:row``) and ``ok``. Files of a format the independent reader cannot
read (an ``_ingest_ts`` of an unexpected type) are reported as not checked, never as passing silently.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.json as pajson
import pyarrow.parquet as pq

from pipeline import settings
from pipeline.checkpoint.channel import partition_of
from pipeline.exceptions import StorageError
from pipeline.fileio import join_uri
from pipeline.layout import JobLayout, checkpoint_dir_name
from pipeline.layout.logs import BARRIER_LOG_NAME, LAG_LOG_NAME, ROUND_LOG_NAME

__all__ = ["COLUMNS", "runtime_log_rows", "first_at_or_after", "read_partition_ts"]

COLUMNS = ["file", "checkpoint", "source", "partition", "logged", "expected", "ok"]

_EPOCH, _ROUND, _LAGGED = BARRIER_LOG_NAME, ROUND_LOG_NAME, LAG_LOG_NAME
_DATA = re.compile(r"^partition=(0|[1-9][0-9]*)/([0-9]{8,})\.(parquet|jsonl)$")
_NONE = np.iinfo(np.int64).min
_MAX_MESSAGES = 5


def _fs(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow file system and path for ``uri`` (S3 from the standard ``AWS_*`` variables)."""
    if uri.startswith("s3://"):
        endpoint = settings.raw("AWS_ENDPOINT_URL_S3") or settings.raw("AWS_ENDPOINT_URL")
        region = settings.raw("AWS_DEFAULT_REGION")
        kw: dict[str, Any] = {"region": "us-east-1" if region is None else region}
        key_id = settings.raw("AWS_ACCESS_KEY_ID")
        if key_id:
            kw.update(access_key=key_id, secret_key=settings.raw("AWS_SECRET_ACCESS_KEY") or "")
        if endpoint:
            parts = urlsplit(endpoint)
            kw.update(endpoint_override=parts.netloc or endpoint, scheme=parts.scheme or "http",
                      force_virtual_addressing=False)
        return pafs.S3FileSystem(**kw), uri[len("s3://"):].rstrip("/")
    return pafs.LocalFileSystem(), unquote(urlsplit(uri).path).rstrip("/")


def _to_us(arr: pa.ChunkedArray | pa.Array) -> np.ndarray | None:
    """``_ingest_ts`` as int64 µs (nulls: never a barrier); None if the type cannot be read independently."""
    a = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    t = a.type
    try:
        if pa.types.is_timestamp(t):
            a = pc.cast(a, pa.timestamp("us", tz=t.tz))
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            a = pc.cast(pc.cast(a, pa.string()), pa.timestamp("us", tz="UTC"))
        elif pa.types.is_null(t):
            return np.full(len(a), _NONE, np.int64)
        else:
            return None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    ints = pc.cast(a.view(pa.int64()) if hasattr(a, "view") else a, pa.int64())
    return np.asarray(pc.fill_null(ints, _NONE).to_numpy(zero_copy_only=False), np.int64)


def _read_ts(fs: pafs.FileSystem, path: str, fmt: str) -> np.ndarray | None:
    """One file's ``_ingest_ts`` (µs per row); None: not readable independently (reported as not checked)."""
    try:
        if fmt == "parquet":
            f = pq.ParquetFile(path, filesystem=fs)
            if "_ingest_ts" not in f.schema_arrow.names:
                return np.full(f.metadata.num_rows, _NONE, np.int64)
            return _to_us(f.read(columns=["_ingest_ts"])["_ingest_ts"])
        with fs.open_input_file(path) as fh:
            data = fh.read()
        lines = [ln for ln in data.splitlines() if ln.strip()]
        try:
            t = pajson.read_json(pa.BufferReader(b"\n".join(lines) + b"\n"))
            col = t["_ingest_ts"] if "_ingest_ts" in t.column_names else pa.nulls(t.num_rows)
        except (pa.ArrowInvalid, KeyError):   # a malformed line: one row each, its ts unusable
            vals = []
            for ln in lines:
                try:
                    v = json.loads(ln).get("_ingest_ts")
                except (ValueError, AttributeError):
                    v = None
                vals.append(v if isinstance(v, str) else None)
            col = pa.array(vals, pa.string())
        return _to_us(col)
    except (OSError, pa.ArrowInvalid):
        return None


def read_partition_ts(source_root: str, source: str) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], list[str]]:
    """Per partition of ``source``: (ordinals ``seq << 32 | row`` in log order, ``_ingest_ts`` µs), read with
    pyarrow directly; and the files that could not be read (not checked)."""
    fs, base = _fs(join_uri(source_root, source))
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except OSError:
        return {}, [join_uri(source_root, source)]
    files: dict[int, list[tuple[int, str, str]]] = {}
    for fi in infos:
        if fi.type != pafs.FileType.File:
            continue
        rel = fi.path[len(base):].lstrip("/")
        m = _DATA.match(rel)
        if m:
            files.setdefault(int(m.group(1)), []).append((int(m.group(2)), fi.path, m.group(3)))
    out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    unread: list[str] = []
    for p, fl in files.items():
        ords, tss = [], []
        for seq, path, fmt in sorted(fl):
            ts = _read_ts(fs, path, fmt)
            if ts is None:
                unread.append(path)
                continue
            ords.append((np.int64(seq) << 32) + np.arange(len(ts), dtype=np.int64))
            tss.append(ts)
        out[p] = (np.concatenate(ords) if ords else np.zeros(0, np.int64),
                  np.concatenate(tss) if tss else np.zeros(0, np.int64))
    return out, unread


def first_at_or_after(ords: np.ndarray, ts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per boundary of ``ends``: the ordinal of the first row with ``ts >= end`` (-1: none), vectorised."""
    if not len(ts):
        return np.full(len(ends), -1, np.int64)
    run = np.maximum.accumulate(ts)
    idx = np.searchsorted(run, ends, side="left")
    return np.where(idx < len(ts), ords[np.minimum(idx, len(ts) - 1)], -1)


def _pos(d: Mapping[str, Any] | None) -> int | None:
    return None if d is None else (int(d["seq"]) << 32) + int(d["row"])


def _ord(d: Mapping[str, Any]) -> int:
    return (int(d["seq"]) << 32) + int(d["row"])


def _fmt(o: int | None) -> str:
    return "-" if o is None or o < 0 else f"{o >> 32}:{o & 0xFFFFFFFF}"


def _list(fio, prefix: str, pattern: re.Pattern) -> list[tuple[str, re.Match]]:
    try:
        files = fio.list(prefix, recursive=False)
    except StorageError:
        return []
    out = []
    for f in files:
        m = pattern.search(f.uri)
        if m:
            out.append((f.uri, m))
    return out


def runtime_log_rows(runner, md, known: Mapping[int, Any]) -> tuple[list[dict], list[str], int]:
    """The ``runtime_logs`` dataset rows for validated checkpoint ``md``; ``known``: ``{checkpoint id: metadata}`` of
    the completed checkpoints and savepoints validation knows. Returns (rows, messages, entries not checked).

    Over 80 lines: one walk over the checkpoint lineage that checks the barrier, round and lag logs against what an
    independent reader sees; each log is a commented section."""
    ctx = runner.ctx
    fio = ctx.ckpt_fio
    root = JobLayout(ctx.job_root).barriers()
    rows: list[dict] = []
    messages: list[str] = []
    unchecked = 0
    name = checkpoint_dir_name(md.checkpoint_id)
    E = int(ctx.config.epoch_seconds) * 1_000_000

    # -- barriers against the source files' _ingest_ts --------------------------------------------------------
    docs: dict[int, tuple[str, dict]] = {}
    for uri, m in _list(fio, root, _EPOCH):
        e = int(m.group(1))
        if e <= md.epoch:
            docs[e] = (uri, json.loads(fio.read_bytes(uri)))
    sources = sorted({s for _u, d in docs.values() for s in d.get("barriers", {})})
    epochs = np.asarray(sorted(docs), np.int64)
    ends = (epochs + 1) * E
    by_epoch_cid = {m2.epoch: cid for cid, m2 in known.items() if not m2.is_savepoint}
    lake = {n.name for n in ctx.job.sources() if n.table is not None}
    for src in sources:
        if src in lake:   # a lake table's commits are listed by the lake source only: no independent evidence here
            unchecked += sum(len(d.get("barriers", {}).get(src, {})) for _u, d in docs.values())
            messages.append(f"runtime logs: the barriers of lake source {src} are not checked independently")
            continue
        parts, unread = read_partition_ts(ctx.config.source_uri, src)
        for u in unread:
            messages.append(f"runtime logs: source file {u} could not be read independently (its barriers are "
                            "not checked)")
        firsts = {p: first_at_or_after(o, t, ends) for p, (o, t) in parts.items()}
        ends_of = {p: (int(o[-1] >> 32) + 1) << 32 if len(o) else 0 for p, (o, _t) in parts.items()}
        for i, e in enumerate(epochs.tolist()):
            uri, doc = docs[e]
            idle = set(doc.get("idle_partitions", {}).get(src, []))
            cp = checkpoint_dir_name(by_epoch_cid[e]) if e in by_epoch_cid else name
            for p, v in sorted(doc.get("barriers", {}).get(src, {}).items(), key=lambda kv: partition_of(kv[0])):
                logged = _ord(v)
                part = partition_of(p)
                if part not in firsts or unread:
                    unchecked += 1
                    continue
                first = int(firsts[part][i])
                if str(p) in idle:   # no row >= the end before the barrier; the barrier within what exists
                    ok = (first < 0 or first >= logged) and logged <= ends_of[part]
                    expected = f"idle: >= {_fmt(first)}" if first >= 0 else "idle"
                else:
                    ok = first >= 0 and logged == first
                    expected = _fmt(first)
                rows.append({"file": uri, "checkpoint": cp, "source": src, "partition": str(p),
                             "logged": _fmt(logged), "expected": expected, "ok": bool(ok)})

    # -- rounds against the checkpoints' _metadata ----------------------------------------------------------
    for uri, m in _list(fio, JobLayout(ctx.job_root).round_log(), _ROUND):
        e, cid, k = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if cid > md.checkpoint_id:
            continue
        try:
            doc = json.loads(fio.read_bytes(uri))
        except ValueError:
            doc = {}
        c = known.get(cid)
        parent = known.get(c.parent_id) if c is not None and c.parent_id is not None else None
        base = {"file": uri, "checkpoint": checkpoint_dir_name(cid)}
        head_ok = doc.get("checkpoint_id") == cid and doc.get("epoch") == e and doc.get("round") == k
        if c is not None:
            head_ok = head_ok and e == c.epoch and k < max(1, c.stats.rounds if c.stats else 1)
        rows.append({**base, "source": "-", "partition": "-", "logged": f"epoch {doc.get('epoch')} chk "
                     f"{doc.get('checkpoint_id')} round {doc.get('round')}",
                     "expected": f"epoch {e} chk {cid} round {k}"
                     + (f" < {c.stats.rounds if c.stats else 1} rounds" if c is not None else ""), "ok": bool(head_ok)})
        for src, ps in sorted((doc.get("starts") or {}).items()):
            for p, v in sorted(ps.items()):
                start = _pos(v)
                lo = _pos(parent.positions[src][p].to_dict()) if (
                    parent is not None and p in parent.positions.get(src, {})) else None
                # at-least-once rounds may read past barrier n (post-barrier records): no upper bound there
                hi = _pos(c.barriers[src][p].to_dict()) if (
                    c is not None and p in c.barriers.get(src, {}) and c.checkpoint_mode == "exactly_once") else None
                if lo is None and hi is None:
                    unchecked += 1
                    continue
                ok = start is not None and (lo is None or start >= lo) and (hi is None or start <= hi)
                rows.append({**base, "source": src, "partition": str(p), "logged": _fmt(start),
                             "expected": f"[{_fmt(lo)}, {_fmt(hi)}]", "ok": bool(ok)})

    # -- lag log against the checkpoints' _metadata ---------------------------------------------------------
    for uri, m in _list(fio, JobLayout(ctx.job_root).lag_log(), _LAGGED):
        e, cid = int(m.group(1)), int(m.group(2))
        if cid > md.checkpoint_id:
            continue
        try:
            doc = json.loads(fio.read_bytes(uri))
        except ValueError:
            doc = {}
        c = known.get(cid)
        base = {"file": uri, "checkpoint": checkpoint_dir_name(cid)}
        head_ok = doc.get("checkpoint_id") == cid and doc.get("epoch") == e and (c is None or c.epoch == e)
        rows.append({**base, "source": "-", "partition": "-", "logged": f"epoch {doc.get('epoch')} chk "
                     f"{doc.get('checkpoint_id')}", "expected": f"epoch {e} chk {cid}", "ok": bool(head_ok)})
        if c is None:
            unchecked += 1
            continue
        parent = known.get(c.parent_id) if c.parent_id is not None else None
        for src, ps in sorted((doc.get("barriers") or {}).items()):
            for p, v in sorted(ps.items()):
                want = c.barriers.get(src, {}).get(p)
                rows.append({**base, "source": src, "partition": str(p), "logged": _fmt(_pos(v)),
                             "expected": _fmt(_pos(want.to_dict()) if want is not None else None),
                             "ok": want is not None and _pos(v) == _pos(want.to_dict())})
        for src, ps in sorted((doc.get("read") or {}).items()):
            for p, v in sorted(ps.items()):
                lo = parent.positions.get(src, {}).get(p) if parent is not None else None
                if lo is None:
                    continue
                rows.append({**base, "source": src, "partition": str(p), "logged": _fmt(_pos(v)),
                             "expected": f">= {_fmt(_ord(lo.to_dict()))}", "ok": _ord(v) >= _ord(lo.to_dict())})
    bad = [r for r in rows if not r["ok"]]
    for r in bad[:_MAX_MESSAGES]:
        messages.append(f"runtime logs of {name}: {r['file']} ({r['checkpoint']}, {r['source']}/partition="
                        f"{r['partition']}) records {r['logged']}, the independent check expects {r['expected']}")
    return rows, messages, unchecked
