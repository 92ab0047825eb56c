"""The data pass: every state file and committed sink file read once, checksummed and summarised (Spark
executors or a driver thread pool), upsert sinks resolved on the driver, and the state/sink datasets."""
from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import settings
from pipeline.quality.collect_base import MAX_EXAMPLES, STEP_LABELS, CollectorBase, records_frame
from pipeline.quality.filestats import stat_file
from pipeline.quality.jobspec import sink_obj, state_obj
from pipeline.quality.keygroups import xxhash64
from pipeline.quality.normalize import (
    KG_SUMS,
    MAX_MEASURES,
    SUMMARY_DDL,
    SUMMARY_SCHEMA,
    ObjectSpec,
    count_keys,
    exact_frame,
    group_sums,
    normalize,
    read_files_task,
    schema_signature,
    summarize,
)
from pipeline.runtime.driver import progress
from pipeline.runtime.spark.task_requests import counted_in_span
from pipeline.sink.deletes import live_rows

__all__ = ["DataCollector", "PER_KG_COLUMNS"]

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
    keyed = norm.filter(pc.equal(norm["null_key"], 0))  # keyed rows: an aggregate's NULL group included
    t = pa.table({"obj": keyed["obj"], "kg": keyed["kg"], "key": keyed["key"]})
    per_key = t.group_by(["obj", "kg", "key"]).aggregate([([], "count_all")])
    d = per_key.filter(pc.greater(per_key["count_all"], 1))
    return [{"object": r["obj"], "kg": r["kg"], "key": r["key"], "count": r["count_all"]}
            for r in d.slice(0, limit).to_pylist()]


def _local_small_bytes() -> int:
    """Snapshots whose data files total at most this many bytes are summarised without Spark even when a session
    runs (``EPOCHAL_QUALITY_LOCAL_SMALL_BYTES``, default 8 MiB; 0 = use the session): a Spark job's fixed cost
    (scheduling, a Python worker per task) exceeds reading a few MB in the driver's threads."""
    return settings.get_int("EPOCHAL_QUALITY_LOCAL_SMALL_BYTES")


def _local_max_bytes() -> int:
    """Snapshots whose data files total at most this many bytes are summarised without Spark when no Spark
    session is running yet (``EPOCHAL_QUALITY_LOCAL_MAX_BYTES``, default 256 MiB; 0 = always Spark)."""
    return settings.get_int("EPOCHAL_QUALITY_LOCAL_MAX_BYTES")


class DataCollector(CollectorBase):
    """Data-pass steps of the collector."""

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
                wide = self.objects.specs[state_obj(h.operator_uid, h.name)].operator_wide   # no key-group range
                files.append((len(files), state_obj(h.operator_uid, h.name), h.file.uri,
                              None if wide else h.kg_start, None if wide else h.kg_end, deltas))
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
            engine = ("local" if total <= _local_small_bytes()
                      else "spark" if (self.runner.spark_started or total > _local_max_bytes()) else "local")
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
            per_kg[["keys", "dup_keys"]] = per_kg[["keys", "dup_keys"]].infer_objects(copy=False).fillna(0)
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
            table = src.mapInArrow(counted_in_span(task), SUMMARY_DDL).toArrow()
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
            out = list(task(iter([b])))
            progress.advance(len(sl))
            return out

        with self.timer("local_read"):
            progress.step(STEP_LABELS["local_read"], total=len(files), unit="files")
            with ThreadPoolExecutor(max_workers=len(slices)) as pool:
                batches = [b for part in pool.map(run, slices) for b in part]
            table = pa.Table.from_batches(batches, schema=SUMMARY_SCHEMA) if batches else SUMMARY_SCHEMA.empty_table()
        return self._summaries(table, names)

    def _summaries(self, table: pa.Table, names):
        """Both engines: the file/key-group/group records as pandas, keys counted from the hashes with NumPy."""
        is_h = pc.equal(table["rec"], "h")
        side = exact_frame(table.filter(pc.invert(is_h)).drop_columns(["khashes"]))
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
        for oid, khash in found[:MAX_EXAMPLES]:
            obj = names[oid]
            spec = self.objects.specs.get(obj)
            uris = where.get((oid, khash), [])
            ex = {"object": obj, "kg": int(khash % self.mp), "key": None, "count": len(uris), "files": uris}
            if spec is not None and spec.key and uris:
                try:
                    t = pq.read_table(pa.BufferReader(self.fio(uris[0]).read_bytes(uris[0])))
                    keys = t[spec.key]
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
                st = stat_file(self.fio, uri, True)
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
                if key:  # the newest row per key: files are in lineage order, so the last row of its key; a
                    # group-by (not a join, whose key equality drops null keys) keeps an aggregate's NULL group
                    order = pa.array(np.arange(tb.num_rows), pa.int64())
                    tb = tb.append_column("__ord", order)
                    newest = tb.group_by(key, use_threads=False).aggregate([("__ord", "max")])["__ord_max"]
                    tb = tb.filter(pc.is_in(tb["__ord"], value_set=newest)).sort_by("__ord").drop_columns(["__ord"])
                tb = live_rows(tb.drop_columns(["__txn"]))  # a deleting sink: keys whose newest row is a tombstone go
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
        self.out.datasets["state_files"] = records_frame(rows, list(rows[0]) if rows else [
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
        # an operator-wide table (a window's watermark) holds the operator row under the channel "" (not a key)
        wide = {o for o, s in self.objects.specs.items() if s.operator_wide}
        if len(st):
            st.loc[st["object"].isin(wide), "null_keys"] = 0
        self.out.datasets["state_key_groups"] = st.sort_values(["object", "kg"]).reset_index(drop=True)
        self.out.datasets["sink_key_groups"] = sk.sort_values(["object", "kg"]).reset_index(drop=True)
        dups = [d for d in spark_out["dups"] + upsert_out["dups"] if d["object"] not in repeated]
        self.out.examples["state_duplicates"] = [d for d in dups if d["object"].startswith("state/")][:MAX_EXAMPLES]
        self.out.examples["sink_duplicates"] = [d for d in dups if d["object"].startswith("sink/")][:MAX_EXAMPLES]
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
        return records_frame(rows, ["aggregate", "group", "measure", "append", "upsert", "state", "expected"])
