"""Dead letters compared row by row: the files on disk against the batch meaning's dead-lettered rows.

The batch plan derives the rows each operator dead-letters in the epochs ``<=`` n (a window's late records and
records with a null key or event time, a join's rows violating its ``unique`` declaration), in the runtime's record
format (:func:`pipeline.batch.bootstrap.dead_letters.operator_dead_letter_frames`: what ``bootstrap`` writes), and
compares them with the rows of the operator's dead-letter files on disk for the validated lineage, as a **multiset of
row hashes**:

* Parquet (windows): the files are read by Spark tasks and every column both sides have is hashed by Spark on both
  sides (``xxhash64``, timestamps as µs); only the counts per differing hash and a few example rows reach the driver,
  so a window behind a many-to-many join that dead-letters millions of late rows costs one Spark job, not the
  driver's memory (:func:`_window_diff`);
* JSON lines (joins, few by nature: a ``unique`` declaration's violations): the rows are fetched, and each
  record's ``values`` is compared with the expected row passed through the same JSON encoding the runtime uses
  (:func:`~pipeline.source._formats.json_default`), on the keys both sides have.

A deleted, truncated, added or changed dead-letter row fails ``epochal_users_read`` (``only_expected`` /
``only_actual`` of ``dead_letters/<uid>``).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.batch.bootstrap.dead_letters import operator_dead_letter_frames
from pipeline.batch.evaluation.prefix import PEPOCH
from pipeline.fileio import file_io_for
from pipeline.layout import checkpoint_dir_name
from pipeline.layout.dead_letters import ATTEMPT_DIR
from pipeline.runtime.operators.dead_letters import operator_dead_letter_prefix
from pipeline.runtime.spark.dataflow import arrow_schema_of
from pipeline.runtime.spark.task_requests import counted_in_span
from pipeline.source._formats import json_default

__all__ = ["dead_letter_row_diff", "disk_files"]

_CHK = ATTEMPT_DIR
MAX_EXAMPLES = 5
# columns that describe where or when a row was written, not the record (never compared); a window's dead letters
# carry the source positions _seq/_row when bootstrap writes them (the batch frame has them) but not when the
# runtime does (its input keeps only the columns the job reads), so after a bootstrap the files differ in them
_WHERE = frozenset({PEPOCH, "_wm_channel", "_seq", "_row"})


def disk_files(fio, prefix: str, md) -> list[str]:
    """The dead-letter files of an operator for the validated lineage: per epoch ``<=`` n, the attempt directory of
    the newest checkpoint at most n (as the sweep leaves it)."""
    try:
        files = [f.uri for f in fio.list(prefix, recursive=True)]
    except Exception:  # noqa: BLE001 - no directory: nothing was dead-lettered
        return []
    chosen: dict[int, int] = {}
    by: dict[tuple[int, int], list[str]] = {}
    for u in files:
        m = _CHK.search(u)
        if not m:
            continue
        epoch, cid = int(m.group(1)), int(m.group(2))
        if epoch > md.epoch or cid > md.checkpoint_id:
            continue
        by.setdefault((epoch, cid), []).append(u)
        chosen[epoch] = max(chosen.get(epoch, cid), cid)
    return sorted(u for e, c in chosen.items() for u in by[(e, c)])


def _window_diff(spark, fio, files: list[str], parts: list) -> tuple[int, int, int, int, list[dict]]:
    """A window's dead letters, batch meaning (``parts``: Spark frames) against the Parquet ``files`` on disk, as a
    multiset of row hashes computed by Spark on both sides: the files are read by Spark tasks (through FileIO, so
    ``s3://`` too) and cast to the batch frame's types, every compared column is hashed the same way (Spark's
    ``xxhash64``; timestamps as µs), and only the counts and the hashes that differ reach the driver. A many-to-many
    join in front of a window can dead-letter millions of rows: none of them is collected. Returns ``(rows
    expected, rows on disk, only expected, only on disk, examples)``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampType
    exp = parts[0]
    for df in parts[1:]:
        exp = exp.unionByName(df, allowMissingColumns=True)
    parquet = [u for u in files if u.endswith(".parquet")]
    disk_cols: set[str] = set()
    for u in parquet[:1]:
        disk_cols = set(pq.read_schema(pa.BufferReader(fio.read_bytes(u))).names)
    cols = sorted((set(exp.columns) & disk_cols) - _WHERE) if parquet else sorted(set(exp.columns) - _WHERE)
    exp = exp.select(*cols)
    target = arrow_schema_of(exp)

    def read(batches):
        for b in batches:
            for u in b.column(0).to_pylist():
                t = pq.read_table(pa.BufferReader(file_io_for(u).read_bytes(u)), columns=cols)
                yield from t.select(target.names).cast(target).to_batches()

    n_tasks = max(1, min(len(parquet), 16))
    act = (spark.createDataFrame([(u,) for u in parquet], "uri string").repartition(n_tasks)
           .mapInArrow(counted_in_span(read), exp.schema)) if parquet else exp.limit(0)
    canon = [F.unix_micros(F.col(f"`{f.name}`")) if isinstance(f.dataType, TimestampType) else F.col(f"`{f.name}`")
             for f in exp.schema.fields]
    h = F.xxhash64(*canon) if canon else F.lit(0)
    ge = exp.select(h.alias("h")).groupBy("h").agg(F.count(F.lit(1)).alias("ce"))
    ga = act.select(h.alias("h")).groupBy("h").agg(F.count(F.lit(1)).alias("ca"))
    j = (ge.join(ga, "h", "full_outer")
         .select("h", F.coalesce("ce", F.lit(0)).alias("ce"), F.coalesce("ca", F.lit(0)).alias("ca")))
    tot = j.agg(F.sum("ce"), F.sum("ca"), F.sum(F.greatest(F.col("ce") - F.col("ca"), F.lit(0))),
                F.sum(F.greatest(F.col("ca") - F.col("ce"), F.lit(0)))).collect()[0]
    n_e, n_a, only_e, only_a = (int(x or 0) for x in tot)
    examples: list[dict] = []
    if only_e or only_a:
        bad = [r[0] for r in j.filter(F.col("ce") != F.col("ca")).select("h").limit(4 * MAX_EXAMPLES).collect()]
        for side, df in (("batch meaning", exp), ("on disk", act)):
            for r in df.filter(h.isin(bad)).limit(MAX_EXAMPLES).collect():
                examples.append({"side": side, **{k: (str(v) if v is not None else None)
                                                  for k, v in r.asDict().items()}})
    return n_e, n_a, only_e, only_a, examples


def _json_hashes(rows: list[Mapping[str, Any]], keys: list[str]) -> np.ndarray:
    out = np.zeros(len(rows), np.uint64)
    for i, r in enumerate(rows):
        doc = json.dumps({k: r.get(k) for k in keys}, sort_keys=True, default=json_default, ensure_ascii=False)
        out[i] = int.from_bytes(hashlib.blake2b(doc.encode(), digest_size=8).digest(), "little")
    return out


def _multiset_diff(he: np.ndarray, ha: np.ndarray) -> tuple[int, int, set[int]]:
    ue, ce = np.unique(he, return_counts=True)
    ua, ca = np.unique(ha, return_counts=True)
    e, a = dict(zip(ue.tolist(), ce.tolist())), dict(zip(ua.tolist(), ca.tolist()))
    only_e = sum(max(0, n - a.get(h, 0)) for h, n in e.items())
    only_a = sum(max(0, n - e.get(h, 0)) for h, n in a.items())
    return only_e, only_a, {h for h in set(e) | set(a) if e.get(h, 0) != a.get(h, 0)}


def dead_letter_row_diff(runner, md, result, uids: list[str]) -> tuple[list[dict], list[dict], list[str]]:
    """``users_read`` rows (``dead_letters/<uid>``) comparing rows, for the operators ``uids``; example rows; and
    the uids whose rows could not be compared (the caller compares their counts)."""
    root = getattr(runner.ctx, "dead_letter_root", None)
    if not root or result is None or not uids:
        return [], [], list(uids)
    comp = SimpleNamespace(frame=lambda nid: result.frames.get(nid), job=runner.job)
    frames: dict[str, list[tuple[str, str, Any]]] = {}
    for uid, kind, name, df in operator_dead_letter_frames(comp, result, runner.job):
        if uid in uids:
            frames.setdefault(uid, []).append((kind, name, df))
    fio = file_io_for(root)
    rows, examples, left = [], [], []
    for uid in uids:
        files = disk_files(fio, operator_dead_letter_prefix(root, runner.job.name, uid), md)
        parts = frames.get(uid)
        if parts is None:
            left.append(uid)
            continue
        kind = parts[0][0]
        if kind == "window":
            n_e, n_a, only_e, only_a, ex = _window_diff(runner.spark, fio, files, [df for _k, _n, df in parts])
            examples += [{"object": f"dead_letters/{uid}", **e} for e in ex]
            rows.append({"object": f"dead_letters/{uid}", "kind": "dead letters (rows)",
                         "version": checkpoint_dir_name(md.checkpoint_id), "rows_expected": n_e, "rows_actual": n_a,
                         "only_expected": only_e, "only_actual": only_a})
            continue
        expected = [df.toArrow() for _k, _n, df in parts]
        # joins: JSON lines, {"values": the record} (few by nature: a declaration's violations)
        exp_rows = [json.loads(json.dumps(r, default=json_default)) for t in expected for r in t.to_pylist()]
        act_rows = []
        for u in files:
            if u.endswith(".jsonl"):
                for ln in fio.read_bytes(u).splitlines():
                    if ln.strip():
                        act_rows.append(json.loads(ln).get("values") or {})
        ke = set().union(*[set(r) for r in exp_rows]) if exp_rows else set()
        ka = set().union(*[set(r) for r in act_rows]) if act_rows else set()
        keys = sorted(((ke & ka) if ke and ka else (ke | ka)) - _WHERE)
        he, ha = _json_hashes(exp_rows, keys), _json_hashes(act_rows, keys)
        n_e, n_a = len(exp_rows), len(act_rows)
        show_e = lambda rs=exp_rows, ks=keys: [{k: r.get(k) for k in ks} for r in rs]  # noqa: E731
        show_a = lambda rs=act_rows, ks=keys: [{k: r.get(k) for k in ks} for r in rs]  # noqa: E731
        only_e, only_a, bad = _multiset_diff(he, ha)
        if bad:
            for side, h, show in (("batch meaning", he, show_e), ("on disk", ha, show_a)):
                idx = [i for i, x in enumerate(h.tolist()) if x in bad][:MAX_EXAMPLES]
                if idx:
                    all_rows = show()
                    examples += [{"object": f"dead_letters/{uid}", "side": side,
                                  **{k: (str(v) if v is not None else None) for k, v in all_rows[i].items()}}
                                 for i in idx]
        rows.append({"object": f"dead_letters/{uid}", "kind": "dead letters (rows)", "version": checkpoint_dir_name(md.checkpoint_id),
                     "rows_expected": n_e, "rows_actual": n_a, "only_expected": only_e, "only_actual": only_a})
    return rows, examples, left
