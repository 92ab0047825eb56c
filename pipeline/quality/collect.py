"""Collectors: build the small datasets the suites validate, from storage, Spark and the recomputation.

Cost model (what makes validation of a 2M-order checkpoint take seconds, not minutes):

* **metadata** (driver, no Spark): ``_metadata`` of the snapshot, the retained checkpoints and the
  savepoints, the sink commit logs, and one HEAD (size) per referenced file;
* **data** (one Spark pass): every state file of the snapshot and every committed file of the append
  sinks is read once by an executor, which checksums it, reads its Parquet footer and turns its rows
  into the normal form of :mod:`pipeline.quality.normalize`; Spark aggregates that per key group and per
  group and only those summaries (a few thousand rows) reach the driver. Upsert sinks (compacted per-key
  totals) are small and read on the driver;
* **recovery** (driver, in a thread while Spark works): the recovery model recomputes every object from
  the source files up to the barrier positions; its rows are summarised the same way (key groups are
  recomputed with NumPy, :mod:`pipeline.quality.keygroups`). Key groups whose summaries differ are then
  compared row by row (one extra Spark job per affected object, only on failure) to name missing and
  extra rows.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.exceptions import ObjectNotFoundError, SinkError, StorageError
from pipeline.fileio import file_io_for
from pipeline.layout import snapshot_name
from pipeline.quality.jobspec import JobObjects, job_objects, sink_obj, state_obj
from pipeline.quality.keygroups import key_groups, xxhash64
from pipeline.quality.keygroups import key_groups as kgf
from pipeline.quality.normalize import (
    KG_SUMS,
    MAX_MEASURES,
    SUMMARY_DDL,
    SUMMARY_SCHEMA,
    ObjectSpec,
    count_keys,
    group_sums,
    normalize,
    read_files_task,
    schema_signature,
    summarize,
)
from pipeline.quality.recovery import plan_recomputation
from pipeline.runtime.dataflow import schema_ddl
from pipeline.sink.table import CommittedTable

__all__ = ["Snapshot", "Collected", "collect", "ordinal"]

log = logging.getLogger("epochal.quality")

_DRILL_KGS = 8          # key groups compared row by row per object when summaries differ
_MAX_EXAMPLES = 5
_HEAD_WORKERS = 16


def ordinal(pos: Any) -> int:
    """A source position ``(seq, row)`` as one orderable integer."""
    return int(pos.seq) * (1 << 32) + int(pos.row)


def _iso_us(iso: str) -> int:
    dt = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return int(dt.timestamp()) * 1_000_000 + dt.microsecond


@dataclass(frozen=True)
class Snapshot:
    """The checkpoint or savepoint being validated."""

    completed: Any                     # pipeline.checkpoint.completed.CompletedCheckpoint
    name: str                          # chk-<id> | sp-<id>

    @property
    def md(self):
        return self.completed.metadata

    @property
    def location(self) -> str:
        return self.completed.location


@dataclass
class Collected:
    datasets: dict[str, pd.DataFrame] = field(default_factory=dict)
    examples: dict[str, list[dict]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)          # dataset -> why its suites did not run
    errors: dict[str, str] = field(default_factory=dict)           # dataset -> why it could not be built (fails)
    messages: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)


class _Timer:
    def __init__(self, out: dict[str, float], name: str) -> None:
        self.out, self.name = out, name

    def __enter__(self):
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.out[self.name] = self.out.get(self.name, 0.0) + time.perf_counter() - self.t


def _frame(rows: list[dict], columns: Iterable[str]) -> pd.DataFrame:
    cols = list(columns)
    df = pd.DataFrame(rows, columns=cols)
    return df.astype(object).where(pd.notna(df), None) if len(df) else df


# ------------------------------------------------------------------------------------------- storage
def _stat(fio_for: Callable[[str], Any], uri: str, checksum: bool) -> dict:
    """exists / bytes / sha256 / rows of one file (sha256 and rows only when ``checksum``)."""
    fio = fio_for(uri)
    try:
        if not checksum:
            return {"exists": True, "bytes": fio.size(uri), "sha256": None, "rows": None}
        data = fio.read_bytes(uri)
    except ObjectNotFoundError:
        return {"exists": False, "bytes": None, "sha256": None, "rows": None}
    except StorageError as e:
        return {"exists": False, "bytes": None, "sha256": None, "rows": None, "error": str(e)}
    rows = None
    if uri.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
            rows = pq.ParquetFile(pa.BufferReader(data)).metadata.num_rows
        except Exception:  # noqa: BLE001 - reported as a row-count mismatch
            rows = -1
    return {"exists": True, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "rows": rows,
            "data": data}


def _stat_many(fio_for, uris: Iterable[str], checksum: set[str]) -> dict[str, dict]:
    uris = sorted(set(uris))
    if not uris:
        return {}
    with ThreadPoolExecutor(max_workers=min(_HEAD_WORKERS, len(uris))) as pool:
        res = list(pool.map(lambda u: _stat(fio_for, u, u in checksum), uris))
    out = {}
    for u, r in zip(uris, res):
        r.pop("data", None)
        out[u] = r
    return out


# ---------------------------------------------------------------------------------- pyarrow summaries
PER_KG_COLUMNS = ["obj", "kg", "rows", "keys", "dup_keys", "null_keys", "kg_mismatch", "out_of_range", "files",
                  "null_values", "negative_values", "after_barrier", "expired", "fp_num", "fp_ts", "fp_str"]


def _per_kg_arrow(norm: pa.Table, obj: str, **kw) -> pd.DataFrame:
    """Per (obj, kg) summary of normal-form rows, computed with pyarrow (driver side)."""
    if norm.num_rows == 0:
        return pd.DataFrame(columns=PER_KG_COLUMNS)
    g = summarize(norm, **kw).to_pandas()
    g["files"] = 1
    g["obj"] = obj
    return g[PER_KG_COLUMNS]


def _per_group_arrow(norm: pa.Table, obj: str, n_measures: int) -> pd.DataFrame:
    g = group_sums(norm, n_measures).to_pandas()
    g.insert(0, "obj", obj)
    return g


def _dup_examples_arrow(norm: pa.Table, limit: int = 20) -> list[dict]:
    if norm.num_rows == 0:
        return []
    t = pa.table({"obj": norm["obj"], "kg": norm["kg"], "key": norm["key"]})
    per_key = t.group_by(["obj", "kg", "key"]).aggregate([([], "count_all")])
    d = per_key.filter(pc.and_(pc.greater(per_key["count_all"], 1), pc.is_valid(per_key["key"])))
    return [{"object": r["obj"], "kg": r["kg"], "key": r["key"], "count": r["count_all"]}
            for r in d.slice(0, limit).to_pylist()]


# -------------------------------------------------------------------------------------- row diffs
def _comparable(t: pa.Table, cols: list[str]) -> pa.Table:
    out = {}
    for c in cols:
        a = t[c]
        if pa.types.is_floating(a.type) or pa.types.is_decimal(a.type):
            a = pc.cast(pc.round(pc.multiply(pc.cast(a, pa.float64()), 100.0)), pa.int64())
        elif pa.types.is_timestamp(a.type):
            a = pc.cast(pc.cast(a, pa.timestamp("us", tz=a.type.tz), safe=False), pa.int64())
        elif pa.types.is_integer(a.type):
            a = pc.cast(a, pa.int64())
        else:
            a = pc.cast(a, pa.string())
        out[c] = a
    return pa.table(out)


def _readable(rec: dict, types: Mapping[str, pa.DataType]) -> dict:
    out = {}
    for k, v in rec.items():
        t = types.get(k)
        if v is None or t is None:
            out[k] = v
        elif pa.types.is_floating(t):
            out[k] = v / 100.0
        elif pa.types.is_timestamp(t):
            out[k] = datetime.utcfromtimestamp(v / 1e6).isoformat() + "Z"
        else:
            out[k] = v
    return out


def row_diff(actual: pa.Table, expected: pa.Table) -> dict:
    """Exact multiset difference of two tables over the expected table's columns (floats in cents)."""
    cols = [c for c in expected.column_names if c != "_kg"]
    missing_cols = [c for c in cols if c not in actual.column_names]
    if missing_cols:
        return {"missing": expected.num_rows, "extra": actual.num_rows, "missing_rows": [], "extra_rows": [],
                "extra_table": None, "error": f"actual rows lack columns {missing_cols}"}
    a = _comparable(actual, cols).group_by(cols).aggregate([([], "count_all")]).rename_columns(cols + ["n_act"])
    e = _comparable(expected, cols).group_by(cols).aggregate([([], "count_all")]).rename_columns(cols + ["n_exp"])
    j = a.join(e, keys=cols, join_type="full outer")
    n_act = pc.fill_null(j["n_act"], 0)
    n_exp = pc.fill_null(j["n_exp"], 0)
    miss_n = pc.max_element_wise(pc.subtract(n_exp, n_act), 0)
    extra_n = pc.max_element_wise(pc.subtract(n_act, n_exp), 0)
    types = {c: expected.schema.field(c).type for c in cols}
    miss = j.filter(pc.greater(miss_n, 0))
    extra = j.filter(pc.greater(extra_n, 0))
    ex_m = [{**_readable({c: r[c] for c in cols}, types), "_expected": r["n_exp"] or 0, "_actual": r["n_act"] or 0}
            for r in miss.slice(0, _MAX_EXAMPLES).to_pylist()]
    ex_x = [{**_readable({c: r[c] for c in cols}, types), "_expected": r["n_exp"] or 0, "_actual": r["n_act"] or 0}
            for r in extra.slice(0, _MAX_EXAMPLES).to_pylist()]
    return {"missing": int(pc.sum(miss_n).as_py() or 0), "extra": int(pc.sum(extra_n).as_py() or 0),
            "missing_rows": ex_m, "extra_rows": ex_x, "extra_table": extra.select(cols), "error": None}


# --------------------------------------------------------------------------------------- the collector
class _Collector:
    def __init__(self, runner, snapshot: Snapshot, *, mode: str, drill_kgs: int = _DRILL_KGS) -> None:
        self.runner = runner
        self.snap = snapshot
        self.md = snapshot.md
        self.mode = mode
        self.drill_kgs = drill_kgs
        self.job = runner.job
        self.mp = int(self.md.max_parallelism)
        self.out = Collected()
        self._fio_cache: dict[str, Any] = {}
        self._fio_lock = threading.Lock()
        self.objects: JobObjects = job_objects(self.job, runner.config.state_ttl_seconds)
        self.barrier_us = _iso_us(self.md.barrier_time)
        # state expires with the cutoff end(L) - ttl, L the low watermark of the inputs (docs/alignment.md)
        low = self.md.extra.get("low_epoch")
        held_us = (int(self.md.epoch) - int(low)) * int(runner.config.epoch_seconds) * 1_000_000 \
            if low is not None and int(low) < int(self.md.epoch) else 0
        self.cutoffs = {o: (self.barrier_us - held_us - t * 1_000_000 if t else None)
                        for o, t in self.objects.ttl_seconds.items()}
        self.file_io_for = file_io_for

    # -- helpers -----------------------------------------------------------------------------------
    def fio(self, uri: str):
        scheme = uri.split("://", 1)[0]
        with self._fio_lock:
            if scheme not in self._fio_cache:
                self._fio_cache[scheme] = self.file_io_for(uri)
            return self._fio_cache[scheme]

    def timer(self, name: str) -> _Timer:
        return _Timer(self.out.timings, name)

    # -- metadata ----------------------------------------------------------------------------------
    def load_known(self) -> None:
        store = self.runner.coordinator.store
        self.retained = store.list()
        self.savepoints = store.savepoints()
        known: dict[int, Any] = {}
        for cp in self.retained + self.savepoints + [self.snap.completed]:
            known[cp.checkpoint_id] = cp
        self.known = known
        self.retained_ids = sorted(cp.checkpoint_id for cp in self.retained)
        self.newest_id = max(known)

    def output_view(self) -> None:
        """Per sink table: all commit entries, the entries readers see, and the parent chain."""
        self.tables: dict[str, dict] = {}
        newest = self.snap.completed.checkpoint_id >= self.newest_id
        for t in self.job.sink_tables():
            table = CommittedTable(self.runner.sink_fio, self.runner.config.sink_uri, self.job.name, t)
            info: dict[str, Any] = {"table": table, "entries": [], "view": [], "error": None, "mode": "append"}
            try:
                entries = table.entries()
            except (SinkError, StorageError) as e:
                info["error"] = f"commit log of table {t} unreadable: {e}"
                self.tables[t] = info
                continue
            info["entries"] = entries
            scope = entries if newest else [e for e in entries if e.checkpoint_id <= self.snap.completed.checkpoint_id]
            try:
                info["view"] = table.lineage(scope) if scope else []
            except SinkError as e:
                info["error"] = str(e)
            by_id = {e.checkpoint_id: e for e in entries}
            chain: list[int] = []
            head = max(scope, key=lambda e: e.checkpoint_id) if scope else None
            cur = head
            while cur is not None:
                chain.append(cur.checkpoint_id)
                if cur.mode == "upsert" and cur.full:
                    break
                cur = by_id.get(cur.parent_id) if cur.parent_id is not None else None
            info["chain"] = set(chain)
            if entries:
                info["mode"] = entries[-1].mode
            self.tables[t] = info
            if info["error"]:
                self.out.messages.append(info["error"])

    def metadata_datasets(self, checksums: dict[str, dict]) -> None:
        """checkpoint_files, checkpoint_lineage, sink_commits, committed_files."""
        snap = self.snap
        files: list[dict] = []
        wanted: dict[str, bool] = {}

        def add(owner: str, role: str, obj: str | None, fh, checksum: bool) -> None:
            files.append({"owner": owner, "role": role, "object": obj, "uri": fh.uri, "expected_bytes": fh.bytes,
                          "expected_sha256": fh.sha256, "expected_rows": fh.rows, "_checksum": checksum})
            wanted[fh.uri] = wanted.get(fh.uri, False) or checksum

        owners = [(snap.name, snap.completed, True)]
        if self.mode != "epoch":
            owners += [(snapshot_name(cp.checkpoint_id, savepoint=cp.is_savepoint), cp, False)
                       for cp in self.retained + self.savepoints
                       if cp.location.rstrip("/") != snap.location.rstrip("/")]
        for owner, cp, deep in owners:
            md = cp.metadata
            for h in md.state_handles():
                for f in h.files():  # an incremental snapshot: its base and its deltas
                    add(owner, "state", state_obj(h.operator_uid, h.name), f, deep)
            for c in md.channel_state:
                if c.file is not None:
                    add(owner, "channel", f"channel/{c.operator_uid}/{c.channel}", c.file, deep)
            for t in sorted(md.sinks):
                for f in md.sinks[t].files:
                    add(owner, "sink_staged", sink_obj(t), f, deep)
        for t, info in self.tables.items():
            view = info["view"]
            if self.mode == "epoch":
                view = [e for e in view if e.checkpoint_id == snap.completed.checkpoint_id]
            for e in view:
                for f in e.files:
                    add(f"table:{t}", "committed", sink_obj(t), f, self.mode != "epoch")
        need = {u for u, c in wanted.items() if c and u not in checksums}
        with self.timer("metadata_files"):
            stats = _stat_many(self.fio, [u for u in wanted if u not in checksums], need)
        stats.update(checksums)
        for r in files:
            s = stats.get(r["uri"], {})
            r["exists"] = bool(s.get("exists"))
            r["actual_bytes"] = s.get("bytes")
            r["actual_sha256"] = s.get("sha256") if r.pop("_checksum") else None
            r["actual_rows"] = s.get("rows") if s.get("rows") is not None and s.get("sha256") else None
        cols = ["owner", "role", "object", "uri", "exists", "expected_bytes", "actual_bytes", "expected_sha256",
                "actual_sha256", "expected_rows", "actual_rows"]
        self.out.datasets["checkpoint_files"] = _frame(files, cols)
        self.out.figures["files_checked"] = len(files)
        self.out.figures["bytes_checksummed"] = sum(
            (stats.get(u, {}).get("bytes") or 0) for u, c in wanted.items() if c)

        # -- lineage: barrier/position monotonicity along parent links
        lineage: list[dict] = []
        if self.mode == "epoch":
            metas = [snap.completed]
        else:
            metas = list({id(c): c for c in self.retained + self.savepoints + [snap.completed]}.values())
        for cp in sorted(metas, key=lambda c: c.checkpoint_id):
            md = cp.metadata
            parent = self.known.get(md.parent_id) if md.parent_id is not None else None
            if parent is None and md.parent_id is not None and self.mode == "epoch":
                try:
                    parent = self.runner.coordinator.store.get(md.parent_id)
                except Exception:  # noqa: BLE001 - subsumed parent: nothing to compare with
                    parent = None
            pmd = parent.metadata if parent is not None else None
            name = snapshot_name(md.checkpoint_id, savepoint=cp.is_savepoint)
            sources = set(md.barriers) | set(md.positions) | (set(pmd.barriers) if pmd else set())
            for s in sorted(sources):
                parts = set(md.barriers.get(s, {})) | set(md.positions.get(s, {}))
                pparts = set(pmd.barriers.get(s, {})) | set(pmd.positions.get(s, {})) if pmd else set()
                for p in sorted(parts | pparts, key=lambda x: (len(x), x)):
                    b = md.barriers.get(s, {}).get(p)
                    pos = md.positions.get(s, {}).get(p)
                    pb = pmd.barriers.get(s, {}).get(p) if pmd else None
                    pp = pmd.positions.get(s, {}).get(p) if pmd else None
                    lineage.append({
                        "checkpoint": name, "checkpoint_id": md.checkpoint_id, "parent_id": md.parent_id,
                        "kind": md.kind, "epoch": md.epoch, "parent_epoch": pmd.epoch if pmd else None,
                        "source": s, "partition": p, "in_checkpoint": p in parts,
                        "barrier_seq": b.seq if b else None, "barrier_row": b.row if b else None,
                        "barrier": ordinal(b) if b else None, "parent_barrier": ordinal(pb) if pb else None,
                        "position": ordinal(pos) if pos else None, "parent_position": ordinal(pp) if pp else None})
        self.out.datasets["checkpoint_lineage"] = _frame(lineage, [
            "checkpoint", "checkpoint_id", "parent_id", "kind", "epoch", "parent_epoch", "source", "partition",
            "in_checkpoint", "barrier_seq", "barrier_row", "barrier", "parent_barrier", "position",
            "parent_position"])

        # -- sink commit log
        commits: list[dict] = []
        committed: list[dict] = []
        min_retained = min(self.retained_ids) if self.retained_ids else snap.completed.checkpoint_id
        completed_ids = {cp.checkpoint_id for cp in self.retained} | {snap.completed.checkpoint_id}
        if self.mode == "epoch":
            completed_ids = {snap.completed.checkpoint_id}
        for t, info in self.tables.items():
            reader = {e.checkpoint_id for e in info["view"]}
            by_id = {e.checkpoint_id: e for e in info["entries"]}
            entries = info["entries"]
            if self.mode == "epoch":
                entries = [e for e in entries if e.checkpoint_id == snap.completed.checkpoint_id]
            for e in entries:
                cp = self.known.get(e.checkpoint_id)
                if cp is not None:
                    known: bool | None = True
                elif not e.files or e.checkpoint_id < min_retained:
                    known = None
                else:
                    known = False
                matches = parent_ok = None
                if cp is not None and t in cp.metadata.sinks:
                    staged = {(f.uri, f.sha256) for f in cp.metadata.sinks[t].files}
                    matches = staged == {(f.uri, f.sha256) for f in e.files}
                    parent_ok = e.parent_id == cp.metadata.parent_id
                commits.append({"table": t, "commit_id": e.checkpoint_id, "parent_id": e.parent_id,
                                "files": len(e.files), "rows": e.rows, "commit_exists": True,
                                "on_reader_lineage": e.checkpoint_id in reader,
                                "on_parent_chain": e.checkpoint_id in info.get("chain", set()),
                                "checkpoint_known": known, "matches_checkpoint": matches,
                                "parent_matches": parent_ok})
            for cid in sorted(completed_ids):
                cp = self.known.get(cid)
                if cid not in by_id and cp is not None and t in cp.metadata.sinks:
                    commits.append({"table": t, "commit_id": cid, "parent_id": cp.metadata.parent_id, "files": 0,
                                    "rows": 0, "commit_exists": False, "on_reader_lineage": False,
                                    "on_parent_chain": False, "checkpoint_known": True,
                                    "matches_checkpoint": None, "parent_matches": None})
            view = info["view"] if self.mode != "epoch" else [e for e in info["view"]
                                                               if e.checkpoint_id == snap.completed.checkpoint_id]
            for e in view:
                for f in e.files:
                    committed.append({"table": t, "commit_id": e.checkpoint_id, "uri": f.uri, "sha256": f.sha256,
                                      "rows": f.rows})
        self.out.datasets["sink_commits"] = _frame(commits, [
            "table", "commit_id", "parent_id", "files", "rows", "commit_exists", "on_reader_lineage",
            "on_parent_chain", "checkpoint_known", "matches_checkpoint", "parent_matches"])
        self.out.datasets["committed_files"] = _frame(committed, ["table", "commit_id", "uri", "sha256", "rows"])

    # -- data (Spark) --------------------------------------------------------------------------------
    def data_files(self) -> list[tuple[int, str, str, int | None, int | None, str | None]]:
        """(fid, object, uri, kg_lo, kg_hi, deltas) of every state file of the snapshot and append-sink file readers
        see; ``deltas``: an incremental snapshot's delta files (JSON) applied on top of the base ``uri``."""
        files: list[tuple[int, str, str, int | None, int | None, str | None]] = []
        self._size_hint: dict[str, int] = {}
        for h in self.md.state_handles():
            if h.file is not None and state_obj(h.operator_uid, h.name) in self.objects.specs:
                # (operators without a state spec, e.g. windows, are checked by files and checksums only)
                deltas = json.dumps([f.to_dict() for f in h.deltas]) if h.deltas else None
                files.append((len(files), state_obj(h.operator_uid, h.name), h.file.uri, h.kg_start, h.kg_end,
                              deltas))
                self._size_hint[h.file.uri] = h.bytes
        for t, info in self.tables.items():
            spec = self.objects.specs.get(sink_obj(t))
            if spec is None or spec.upsert_key or info["mode"] == "upsert":
                continue
            for e in info["view"]:
                for f in e.files:
                    files.append((len(files), sink_obj(t), f.uri, None, None, None))
                    self._size_hint[f.uri] = f.bytes
        self._fid_uri = {f[0]: f[2] for f in files}
        return files

    def _task_inputs(self, files):
        specs = {o: s for o, s in self.objects.specs.items()}
        for _, obj, *_ in files:
            specs.setdefault(obj, ObjectSpec(obj, obj.split("/", 1)[0], None))
        oids = {o: i for i, o in enumerate(sorted(specs))}
        task = read_files_task(specs, oids, max_parallelism=self.mp, barrier_us=self.barrier_us, cutoffs=self.cutoffs)
        return task, {i: o for o, i in oids.items()}

    def _slices(self, files, n: int) -> list[list]:
        """Biggest files first, dealt round-robin, so that the slices are balanced."""
        order = sorted(files, key=lambda f: -self._size_hint.get(f[2], 0))
        return [order[i::n] for i in range(n) if order[i::n]]

    def data_pass(self, files, engine: str) -> dict:
        """Read, checksum and summarise every data file once; returns the summaries (see module doc).

        ``engine``: ``spark`` (executors summarise, Spark counts keys across files), ``local`` (the same
        executor function in a driver thread pool, keys counted with NumPy; for small snapshots when no
        Spark session is running, it saves the JVM start), or ``auto``.
        """
        if not files:
            return {"per_kg": pd.DataFrame(columns=PER_KG_COLUMNS), "per_group": pd.DataFrame(), "files": {},
                    "dups": []}
        if engine == "auto":
            total = sum(self._size_hint.values())
            engine = "spark" if (self.runner.spark_started or total > _local_max_bytes()) else "local"
        self.out.figures["engine"] = engine
        side, keys, dups, names = (self._spark_pass if engine == "spark" else self._local_pass)(files)
        side["obj"] = side["oid"].map(names)
        frec = side[side["rec"] == "f"]
        recs = {}
        for r in frec.to_dict("records"):
            recs[r["uri"]] = {"fid": r["fid"], "obj": r["obj"], "uri": r["uri"], "sha256": r["sha256"],
                              "nbytes": None if pd.isna(r["nbytes"]) else int(r["nbytes"]),
                              "nrows": None if pd.isna(r["nrows"]) else int(r["nrows"]),
                              "schema": r["schema"], "error": r["error"]}
        k = side[side["rec"] == "k"]
        if len(k):
            per_kg = k.groupby(["obj", "kg"], as_index=False).agg(
                **{c: (c, "sum") for c in KG_SUMS}, files=("fid", "nunique"))
            keys = keys.assign(obj=keys["oid"].map(names))
            per_kg = per_kg.merge(keys[["obj", "kg", "keys", "dup_keys"]], on=["obj", "kg"], how="left")
            per_kg[["keys", "dup_keys"]] = per_kg[["keys", "dup_keys"]].fillna(0)
            per_kg = per_kg[PER_KG_COLUMNS]
            for c in PER_KG_COLUMNS[1:]:
                per_kg[c] = per_kg[c].astype("int64")
        else:
            per_kg = pd.DataFrame(columns=PER_KG_COLUMNS)
        g = side[side["rec"] == "g"]
        per_group = (g.groupby(["obj", "gkey"], as_index=False)[[f"m{i}" for i in range(MAX_MEASURES)]].sum(min_count=1)
                     if len(g) else pd.DataFrame())
        self.out.figures["rows_read"] = int(per_kg["rows"].sum()) if len(per_kg) else 0
        self.out.figures["data_files_read"] = len(files)
        return {"per_kg": per_kg.reset_index(drop=True), "per_group": per_group, "files": recs, "dups": dups}

    def _spark_pass(self, files):
        """Executors read, checksum and summarise each file with pyarrow (per key group, per group, and the key
        hashes as one list per file); one action brings those summaries to the driver, where the distinct and
        duplicated keys are counted with one NumPy sort per object (:func:`~pipeline.quality.normalize.count_keys`:
        8 bytes a row, no shuffle)."""
        with self.timer("spark_session"):
            spark = self.runner.spark
        task, names = self._task_inputs(files)
        par = spark.sparkContext.defaultParallelism
        slices = self._slices(files, max(1, min(len(files), par * 2)))
        ordered = [f for sl in slices for f in sl]
        src = spark.createDataFrame(spark.sparkContext.parallelize(ordered, len(slices)),
                                    "fid int, obj string, uri string, kg_lo int, kg_hi int, deltas string")
        with self.timer("spark_read"):
            table = src.mapInArrow(task, SUMMARY_DDL).toArrow()
        return self._summaries(table, names)

    def _local_pass(self, files):
        """The executor function in a driver thread pool; keys counted with one NumPy sort per object."""
        task, names = self._task_inputs(files)
        workers = max(1, min(len(files), (os.cpu_count() or 2) * 2))
        slices = self._slices(files, workers)

        def run(sl):
            b = pa.RecordBatch.from_pylist([dict(zip(("fid", "obj", "uri", "kg_lo", "kg_hi", "deltas"), f))
                                            for f in sl],
                                           schema=pa.schema([("fid", pa.int64()), ("obj", pa.string()),
                                                             ("uri", pa.string()), ("kg_lo", pa.int64()),
                                                             ("kg_hi", pa.int64()), ("deltas", pa.string())]))
            return list(task(iter([b])))

        with self.timer("local_read"):
            with ThreadPoolExecutor(max_workers=len(slices)) as pool:
                batches = [b for part in pool.map(run, slices) for b in part]
            table = pa.Table.from_batches(batches, schema=SUMMARY_SCHEMA) if batches else SUMMARY_SCHEMA.empty_table()
        return self._summaries(table, names)

    def _summaries(self, table: pa.Table, names):
        """Both engines: the file/key-group/group records as pandas, keys counted from the hashes with NumPy."""
        is_h = pc.equal(table["rec"], "h")
        side = table.filter(pc.invert(is_h)).drop_columns(["khashes"]).to_pandas()
        with self.timer("keys"):
            rows, found, where = count_keys(table.filter(is_h), self.mp)
            keys = pd.DataFrame(rows, columns=["oid", "kg", "keys", "dup_keys"])
            where_uri = {k: [self._fid_uri.get(f) for f in v] for k, v in where.items()}
            dups = self._dup_examples(found, where_uri, names) if found else []
        return side, keys, dups, names

    def _dup_examples(self, found, where, names) -> list[dict]:
        """Key strings of duplicated key hashes, read back from the files that hold them (driver)."""
        import pyarrow.parquet as pq
        out = []
        for oid, khash in found[:_MAX_EXAMPLES]:
            obj = names[oid]
            spec = self.objects.specs.get(obj)
            uris = where.get((oid, khash), [])
            ex = {"object": obj, "kg": int(khash % self.mp), "key": None, "count": len(uris), "files": uris}
            if spec is not None and spec.key and uris:
                try:
                    t = pq.read_table(pa.BufferReader(self.fio(uris[0]).read_bytes(uris[0])))
                    keys = pc.cast(t[spec.key], pa.string())
                    hit = np.nonzero(xxhash64(keys) == khash)[0]
                    if len(hit):
                        ex["key"] = keys[int(hit[0])].as_py()
                        ex["row"] = {k: (str(v) if v is not None else None) for k, v in t.slice(int(hit[0]), 1)
                                     .to_pylist()[0].items()}
                except Exception:  # noqa: BLE001 - an example is a bonus
                    pass
            out.append(ex)
        return out

    # -- upsert sinks (driver) -------------------------------------------------------------------
    def upsert_pass(self) -> dict:
        """Resolve upsert sinks (newest row per key on the lineage) on the driver and summarise them."""
        import pyarrow.parquet as pq
        per_kg, per_group, dups, tables, recs = [], [], [], {}, {}
        for t, info in self.tables.items():
            obj = sink_obj(t)
            spec = self.objects.specs.get(obj)
            if spec is None or not (spec.upsert_key or info["mode"] == "upsert"):
                continue
            parts = []
            uris = [(f.uri, e.checkpoint_id) for e in info["view"] for f in e.files]
            for uri, txn in uris:
                st = _stat(self.fio, uri, True)
                data = st.pop("data", None)
                rec = {"uri": uri, "sha256": st.get("sha256"), "nbytes": st.get("bytes"), "nrows": st.get("rows"),
                       "schema": None, "error": None if st.get("exists") else "missing", "obj": obj}
                if data is not None:
                    try:
                        tb = pq.read_table(pa.BufferReader(data))
                        rec["schema"] = schema_signature(tb.schema)
                        parts.append(tb.append_column("__txn", pa.array(np.full(tb.num_rows, txn, np.int64))))
                    except Exception as e:  # noqa: BLE001
                        rec["error"] = f"not Parquet: {e}"
                recs[uri] = rec
            key = list(spec.upsert_key or ([spec.key] if spec.key else []))
            if parts:
                tb = pa.concat_tables(parts, promote_options="default")
                if key:
                    order = pa.array(np.arange(tb.num_rows), pa.int64())
                    tb = tb.append_column("__ord", order)
                    newest = tb.group_by(key).aggregate([("__txn", "max")])
                    j = tb.join(newest, keys=key)
                    tb = j.filter(pc.equal(j["__txn"], j["__txn_max"])).sort_by("__ord").drop_columns(
                        ["__ord", "__txn_max"])
                tb = tb.drop_columns(["__txn"])
            else:
                tb = pa.table({})
            tables[obj] = tb
            if tb.num_rows:
                norm = normalize(tb, spec, max_parallelism=self.mp)
                per_kg.append(_per_kg_arrow(norm, obj))
                per_group.append(_per_group_arrow(norm, obj, len(spec.measures)))
                dups += _dup_examples_arrow(norm)
        return {"per_kg": pd.concat(per_kg, ignore_index=True) if per_kg else pd.DataFrame(),
                "per_group": pd.concat(per_group, ignore_index=True) if per_group else pd.DataFrame(),
                "dups": dups, "tables": tables, "files": recs}

    # -- datasets from the data pass --------------------------------------------------------------
    def data_datasets(self, spark_out: dict, upsert_out: dict, files) -> None:
        recs = {**spark_out["files"], **upsert_out["files"]}
        # state_files: one row per state handle, with key-group range coverage
        rows = []
        by_state: dict[str, list] = {}
        for h in self.md.state_handles():
            if state_obj(h.operator_uid, h.name) in self.objects.specs:
                by_state.setdefault(state_obj(h.operator_uid, h.name), []).append(h)
        for obj, hs in sorted(by_state.items()):
            hs = sorted(hs, key=lambda h: (h.kg_start, h.kg_end))
            prev_end = -1
            for i, h in enumerate(hs):
                overlaps = any(o is not h and o.kg_start <= h.kg_end and h.kg_start <= o.kg_end for o in hs)
                gap = max(0, h.kg_start - prev_end - 1)
                if i == len(hs) - 1:
                    gap += max(0, self.mp - 1 - max(prev_end, h.kg_end))
                prev_end = max(prev_end, h.kg_end)
                r = recs.get(h.file.uri) if h.file else None
                rows.append({"object": obj, "operator": h.operator_uid, "state": h.name, "subtask": h.subtask,
                             "kg_start": h.kg_start, "kg_end": h.kg_end, "uri": h.file.uri if h.file else None,
                             "readable": (h.file is None) or (r is not None and not r.get("error")),
                             "schema": r.get("schema") if r else None,
                             "expected_schema": self.objects.schemas.get(obj) if (r and r.get("schema")) else None,
                             "range_overlaps": overlaps, "range_gap_before": gap})
        self.out.datasets["state_files"] = _frame(rows, list(rows[0]) if rows else [
            "object", "operator", "state", "subtask", "kg_start", "kg_end", "uri", "readable", "schema",
            "expected_schema", "range_overlaps", "range_gap_before"])
        per_kg = pd.concat([d for d in (spark_out["per_kg"], upsert_out["per_kg"]) if len(d)], ignore_index=True) \
            if len(spark_out["per_kg"]) or len(upsert_out["per_kg"]) else pd.DataFrame(
                columns=["obj", "kg", "rows", "keys", "dup_keys", "null_keys", "kg_mismatch", "out_of_range",
                         "files", "null_values", "negative_values", "after_barrier", "expired", "fp_num", "fp_ts",
                         "fp_str"])
        self.actual_per_kg = per_kg
        state_cols = ["object", "kg", "rows", "keys", "dup_keys", "null_keys", "kg_mismatch", "out_of_range", "files",
                      "null_values", "negative_values", "after_barrier", "expired"]
        sink_cols = ["object", "kg", "rows", "keys", "dup_keys", "null_keys", "null_values", "negative_values"]
        pk = per_kg.rename(columns={"obj": "object"})
        st = pk[pk["object"].str.startswith("state/")] if len(pk) else pk
        sk = pk[pk["object"].str.startswith("sink/")] if len(pk) else pk
        st = st[[c for c in state_cols]] if len(st) else pd.DataFrame(columns=state_cols)
        sk = sk[[c for c in sink_cols]] if len(sk) else pd.DataFrame(columns=sink_cols)
        # keyless sinks (e.g. a changelog) have no unique key: their rows are reported, not deduplicated
        keyless = {o for o, s in self.objects.specs.items() if s.key is None}
        if len(sk):
            sk.loc[sk["object"].isin(keyless), ["keys", "dup_keys"]] = 0
        # a many-to-many join holds and emits several rows per key: duplicates are its meaning, not an error
        repeated = {o for o, s in self.objects.specs.items() if not s.unique_key}
        if len(sk):
            sk.loc[sk["object"].isin(repeated), "dup_keys"] = 0
        if len(st):
            st.loc[st["object"].isin(repeated), "dup_keys"] = 0
        self.out.datasets["state_key_groups"] = st.sort_values(["object", "kg"]).reset_index(drop=True)
        self.out.datasets["sink_key_groups"] = sk.sort_values(["object", "kg"]).reset_index(drop=True)
        dups = [d for d in spark_out["dups"] + upsert_out["dups"] if d["object"] not in repeated]
        self.out.examples["state_duplicates"] = [d for d in dups if d["object"].startswith("state/")][:_MAX_EXAMPLES]
        self.out.examples["sink_duplicates"] = [d for d in dups if d["object"].startswith("sink/")][:_MAX_EXAMPLES]
        self.actual_per_group = pd.concat([d for d in (spark_out["per_group"], upsert_out["per_group"]) if len(d)],
                                          ignore_index=True) if (len(spark_out["per_group"]) or
                                                                  len(upsert_out["per_group"])) else pd.DataFrame()
        self.upsert_tables = upsert_out["tables"]
        self.data_file_records = recs
        self.out.figures["state_rows"] = int(st["rows"].sum()) if len(st) else 0
        self.out.figures["sink_rows"] = int(sk["rows"].sum()) if len(sk) else 0

    def group_totals(self, expected_per_group: pd.DataFrame | None,
                     recomputed: set[str] | None = None) -> pd.DataFrame:
        """Per aggregate, group and measure: the totals of its append and upsert output, its state and the batch
        evaluation (``expected``; None where the batch evaluation does not model the aggregate's state - it is
        then reported as NOT CHECKED, not compared with zero)."""
        rows = []
        ag = self.actual_per_group

        def sums(df: pd.DataFrame | None, obj: str | None) -> dict[str, list] | None:
            if obj is None or df is None:
                return None
            if not len(df):
                return {}
            d = df[df["obj"] == obj]
            return {r["gkey"]: [r[f"m{i}"] for i in range(MAX_MEASURES)] for r in d.to_dict("records")}

        for uid, a in sorted(self.objects.aggregates.items()):
            srcs = {"append": sums(ag, a["append"]), "upsert": sums(ag, a["upsert"]), "state": sums(ag, a["state"]),
                    "expected": (sums(expected_per_group, a["state"]) if expected_per_group is not None
                                 and (recomputed is None or a["state"] in recomputed) else None)}
            groups = sorted({g for s in srcs.values() if s for g in s})
            for g in groups:
                for i, m in enumerate(a["measures"]):
                    row = {"aggregate": uid, "group": g, "measure": m}
                    for name, s in srcs.items():
                        if s is None:
                            row[name] = None
                        else:
                            v = s.get(g, [0] * MAX_MEASURES)[i]
                            row[name] = int(v) if v is not None and not pd.isna(v) else 0
                    rows.append(row)
        return _frame(rows, ["aggregate", "group", "measure", "append", "upsert", "state", "expected"])

    # -- recovery --------------------------------------------------------------------------------
    def recompute(self, plan) -> dict:
        """Run the batch plan (:mod:`pipeline.quality.recovery`) and summarise its rows like the real ones - on
        the executors; the driver gets the summaries only (the rows of a key group on demand, on failure)."""
        for obj in plan.columns:
            if obj not in self.objects.specs:
                raise ValueError(f"the batch evaluation of job {self.job.name!r} produces {obj}, which the job does "
                                 f"not have (objects: {sorted(self.objects.specs)})")
        rec = plan.materialize(self.objects.specs, self.mp)
        for k, v in rec.timings.items():
            self.out.timings[k] = self.out.timings.get(k, 0.0) + v
        return {"rec": rec, "per_kg": rec.per_kg, "per_group": rec.per_group,
                "rows": lambda obj, kgs: plan.rows(obj, kgs, self.mp, self.objects.specs[obj].key)}

    def recovery_datasets(self, exp: dict, files) -> None:
        rec = exp["rec"]
        a = self.actual_per_kg.rename(columns={"obj": "object"})
        e = exp["per_kg"].rename(columns={"obj": "object"})
        keep = ["object", "kg", "rows", "keys", "fp_num", "fp_ts", "fp_str"]
        a = a[keep] if len(a) else pd.DataFrame(columns=keep)
        e = e[keep] if len(e) else pd.DataFrame(columns=keep)
        objs = sorted(rec.objects)
        a = a[a["object"].isin(objs)]
        # keyless objects (an append sink of windows, a changelog): rows are compared, there is no key to count
        keyless = {o for o, sp in self.objects.specs.items() if sp.key is None}
        a = a.assign(keys=a["keys"].where(~a["object"].isin(keyless), 0))
        e = e.assign(keys=e["keys"].where(~e["object"].isin(keyless), 0))
        m = a.merge(e, on=["object", "kg"], how="outer", suffixes=("", "_exp"))
        for c in ("rows", "keys", "fp_num", "fp_ts", "fp_str"):
            m[c] = m[c].fillna(0).astype("int64")
            m[f"expected_{c}"] = m.pop(f"{c}_exp").fillna(0).astype("int64")
        m["missing_rows"] = 0
        m["extra_rows"] = 0
        m["orphan_rows"] = 0
        m = m.sort_values(["object", "kg"]).reset_index(drop=True)
        differs = np.zeros(len(m), dtype=bool)
        for c in ("rows", "keys", "fp_num", "fp_ts", "fp_str"):
            differs |= (m[c] != m[f"expected_{c}"]).to_numpy()
        bad = m[differs]
        examples_missing: list[dict] = []
        examples_extra: list[dict] = []
        if len(bad):
            with self.timer("recovery_drilldown"):
                for obj, grp in bad.groupby("object"):
                    grp = grp.assign(_d=(grp["rows"] - grp["expected_rows"]).abs()).sort_values("_d", ascending=False)
                    kgs = [int(k) for k in grp["kg"].head(self.drill_kgs)]
                    undrilled = [int(k) for k in grp["kg"].iloc[self.drill_kgs:]]
                    if undrilled:
                        m.loc[(m["object"] == obj) & m["kg"].isin(undrilled),
                              ["missing_rows", "extra_rows", "orphan_rows"]] = None
                    try:
                        actual = self.actual_rows(obj, set(kgs), files)
                    except Exception as ex:  # noqa: BLE001 - the summaries still fail; examples are a bonus
                        self.out.messages.append(f"could not read rows of {obj} for examples: {ex}")
                        m.loc[(m["object"] == obj) & m["kg"].isin(kgs),
                              ["missing_rows", "extra_rows", "orphan_rows"]] = None
                        continue
                    exp_table = exp["rows"](obj, set(kgs))       # the executors filter the key groups
                    spec = self.objects.specs[obj]
                    exp_key = (pc.cast(exp_table[spec.key], pa.string()) if spec.key is not None
                               else pa.nulls(exp_table.num_rows, pa.string()))
                    exp_kg = np.mod(xxhash64(exp_key), np.int64(self.mp))
                    for kg in kgs:
                        act_k = actual.filter(pc.equal(actual["__kg"], kg)).drop_columns(["__kg"]) if actual.num_rows \
                            else actual
                        exp_k = exp_table.filter(pa.array(exp_kg == kg))
                        d = row_diff(act_k, exp_k)
                        sel = (m["object"] == obj) & (m["kg"] == kg)
                        m.loc[sel, "missing_rows"] = d["missing"]
                        m.loc[sel, "extra_rows"] = d["extra"]
                        orphan = 0
                        fn = rec.orphans.get(obj)
                        if fn is not None and d["extra_table"] is not None and d["extra_table"].num_rows:
                            orphan = int(pc.sum(pc.cast(fn(d["extra_table"]), pa.int64())).as_py() or 0)
                        m.loc[sel, "orphan_rows"] = orphan
                        examples_missing += [{"object": obj, "kg": kg, **r} for r in d["missing_rows"]]
                        examples_extra += [{"object": obj, "kg": kg, **r} for r in d["extra_rows"]]
                        if d["error"]:
                            self.out.messages.append(f"{obj}: {d['error']}")
        cols = ["object", "kg", "rows", "expected_rows", "keys", "expected_keys", "fp_num", "expected_fp_num", "fp_ts",
                "expected_fp_ts", "fp_str", "expected_fp_str", "missing_rows", "extra_rows", "orphan_rows"]
        m = m[cols].astype(object)
        for c in ("missing_rows", "extra_rows", "orphan_rows"):
            m[c] = pd.Series([None if pd.isna(v) else int(v) for v in m[c]], index=m.index, dtype=object)
        self.out.datasets["recovery_key_groups"] = m.where(pd.notna(m), None)
        self.out.examples["recovery_missing"] = examples_missing[:_MAX_EXAMPLES]
        self.out.examples["recovery_extra"] = examples_extra[:_MAX_EXAMPLES]
        self.out.examples["recovery_diff"] = (examples_missing[:3] + examples_extra[:3])
        # conservation: every valid input row is in state or in the output, exactly once
        rows_of = ({o: int(g["rows"].sum()) for o, g in self.actual_per_kg.groupby("obj")}
                   if len(self.actual_per_kg) else {})
        cons = []
        for c in rec.conservation:
            in_state = sum(rows_of.get(o, 0) for o in c["state"])
            in_output = sum(rows_of.get(o, 0) for o in c["output"])
            cons.append({"source": c["source"], "input_rows": int(c["input_rows"]), "in_state": in_state,
                         "in_output": in_output, "accounted": in_state + in_output})
        self.out.datasets["recovery_conservation"] = _frame(cons, ["source", "input_rows", "in_state", "in_output",
                                                                   "accounted"])
        self.out.examples["conservation"] = [c for c in cons if c["accounted"] != c["input_rows"]]
        self.out.messages += rec.messages
        self.out.figures["recomputed"] = rec.stats

    def actual_rows(self, obj: str, kgs: set[int], files) -> pa.Table:
        """The real rows of ``obj`` in key groups ``kgs`` (Spark reads and filters; only on failure)."""
        if obj in self.upsert_tables:
            t = self.upsert_tables[obj]
            spec = self.objects.specs[obj]
            kg = key_groups(pc.cast(t[spec.key], pa.string()), self.mp) if t.num_rows else np.zeros(0, np.int32)
            return t.append_column("__kg", pa.array(kg, pa.int32())).filter(pa.array(np.isin(kg, list(kgs))))
        uris = [u for _, o, u, *_ in files if o == obj]
        readable = [u for u in uris if self.data_file_records.get(u, {}).get("schema")]
        if not readable:
            return pa.table({"__kg": pa.array([], pa.int32())})
        import pyarrow.parquet as pq
        with self.fio(readable[0]).open_input(readable[0]) as f:
            schema = pq.read_schema(f)
        schema = pa.schema([f for f in schema if f.name != "_kg"]).append(pa.field("__kg", pa.int32()))
        key = self.objects.specs[obj].key
        mp = self.mp
        wanted = sorted(kgs)

        def task(batches):
            import pyarrow.parquet as pq2

            for b in batches:
                for uri in b.column(0).to_pylist():
                    try:
                        t = pq2.read_table(io.BytesIO(file_io_for(uri).read_bytes(uri)))
                    except Exception:  # noqa: BLE001 - unreadable files are reported by the file checks
                        continue
                    k = kgf(pc.cast(t[key], pa.string()), mp)
                    sel = np.isin(k, wanted)
                    if not sel.any():
                        continue
                    t = t.append_column("__kg", pa.array(k, pa.int32())).filter(pa.array(sel))
                    yield from t.select(schema.names).cast(schema).to_batches()

        if self.out.figures.get("engine") == "local":
            with ThreadPoolExecutor(max_workers=max(1, min(len(uris), 8))) as pool:
                parts = [b for bs in pool.map(lambda u: list(task(iter([pa.RecordBatch.from_pylist([{"uri": u}])]))),
                                              uris) for b in bs]
            return pa.Table.from_batches(parts, schema=schema) if parts else schema.empty_table()
        spark = self.runner.spark
        ddl = schema_ddl(schema)
        df = spark.createDataFrame(spark.sparkContext.parallelize([(u,) for u in uris], max(1, min(len(uris), 8))),
                                   "uri string").mapInArrow(task, ddl)
        return df.toArrow()


def _local_max_bytes() -> int:
    """Snapshots whose data files total at most this many bytes are summarised without Spark when no Spark
    session is running yet (``EPOCHAL_QUALITY_LOCAL_MAX_BYTES``, default 256 MiB; 0 = always Spark)."""
    return int(os.environ.get("EPOCHAL_QUALITY_LOCAL_MAX_BYTES", 256 * 1024 * 1024))


def collect(runner, snapshot: Snapshot, *, mode: str = "full", areas: tuple[str, ...] | None = None,
            drill_kgs: int = _DRILL_KGS, engine: str = "auto") -> Collected:
    """Build every dataset the suites of ``areas`` need (``mode="epoch"``: metadata only, no Spark)."""
    import dataclasses

    c = _Collector(runner, snapshot, mode=mode, drill_kgs=drill_kgs)
    areas = areas or (("metadata",) if mode == "epoch" else ("metadata", "state", "sink", "recovery"))
    with c.timer("metadata_load"):
        c.load_known()
        c.output_view()
    data_needed = any(a in areas for a in ("state", "sink", "recovery"))
    plan = None
    exp_box: dict[str, Any] = {}
    if data_needed and "recovery" in areas:
        with c.timer("batch_plan"):
            try:
                plan = plan_recomputation(runner, c.md, set(c.objects.specs))
            except Exception as e:  # noqa: BLE001 - cannot prove recovery correctness: a failure, not a skip
                log.exception("batch plan failed")
                exp_box["error"] = f"{type(e).__name__}: {e}"
        if plan is not None:
            for obj, cols in plan.columns.items():  # compare on the batch plan's columns only
                c.objects.specs[obj] = dataclasses.replace(c.objects.specs[obj], columns=cols)
            c.out.figures["not_checked"] = dict(plan.unchecked)
            c.out.messages.extend(plan.messages)

    def run_model() -> None:
        t0 = time.perf_counter()
        try:
            exp_box["value"] = c.recompute(plan)
        except Exception as e:  # noqa: BLE001 - reported as a failed recovery suite
            log.exception("batch evaluation failed")
            exp_box["error"] = f"{type(e).__name__}: {e}"
        c.out.timings["recompute"] = time.perf_counter() - t0

    worker = None
    if data_needed and plan is not None:
        worker = threading.Thread(target=run_model, name="epochal-batch-eval", daemon=True)
        worker.start()
    checksums: dict[str, dict] = {}
    files: list = []
    if data_needed:
        files = c.data_files()
        spark_out = c.data_pass(files, engine)
        with c.timer("upsert_read"):
            up = c.upsert_pass()
        c.data_datasets(spark_out, up, files)
        for uri, r in c.data_file_records.items():
            checksums[uri] = {"exists": r.get("error") not in ("missing",) and not str(r.get("error") or "").startswith(
                "unreadable"), "bytes": r.get("nbytes"), "sha256": r.get("sha256"), "rows": r.get("nrows")}
            if not checksums[uri]["exists"]:
                checksums[uri] = {"exists": False, "bytes": None, "sha256": None, "rows": None}
    if "metadata" in areas:
        c.metadata_datasets(checksums)
    if data_needed:
        exp_per_group = None
        recomputed: set[str] | None = None
        if worker is not None:
            with c.timer("recompute_wait"):
                worker.join()
        if "recovery" in areas:
            if "error" in exp_box:  # cannot prove recovery correctness: that is a failure, not a skip
                for d in ("recovery_key_groups", "recovery_conservation", "group_totals:recovery"):
                    c.out.errors[d] = f"recomputation from the sources failed: {exp_box['error']}"
            else:
                exp = exp_box["value"]
                exp_per_group = exp["per_group"]
                recomputed = set(exp["rec"].objects)
                c.recovery_datasets(exp, files)    # (drill-down re-reads the plan's cached sources)
        c.out.datasets["group_totals"] = c.group_totals(exp_per_group, recomputed)
    if plan is not None:
        plan.release()
    return c.out
