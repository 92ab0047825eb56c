"""What users read: the open tables (Delta, Iceberg) read through their format, and the dead letters on disk.

The other suites compare Epochal's commit log (``_commits/``: the staged files each checkpoint committed) with the
batch evaluation. Readers of an Iceberg or Delta sink do not read that log: they read the table's current version
through the format (pyiceberg, delta-rs, Spark, Trino, DuckDB...), whose data files may be copies. So, per open-
format sink, the table's current version is read through the format (``open_read``: pyiceberg's scan, delta-rs'
``to_pyarrow_table``) and compared **row by row** (a multiset of exact row hashes over every column) with the rows
of the commit log; with the recovery suites' comparison of the commit log with the batch meaning, what users read
equals the batch meaning. A changed value, a deleted or an added row in a data file of the current version fails.

Dead letters: per operator that dead-letters records (a window's late records, a join's rows violating its
``unique`` declaration), the rows of its dead-letter files on disk for the epochs of the validated lineage are
counted (Parquet footers, JSON lines) and compared with the batch evaluation's count of such records. A deleted or
truncated dead-letter file fails.

Dataset ``users_read``: one row per object - ``object`` (``table/<t>`` or ``dead_letters/<uid>``), ``kind``,
``version`` (the table version read), ``rows_expected``, ``rows_actual``, ``only_expected``, ``only_actual``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.fileio import file_io_for
from pipeline.layout import checkpoint_dir_name
from pipeline.layout.dead_letters import ATTEMPT_DIR
from pipeline.runtime.operators.dead_letters import operator_dead_letter_prefix
from pipeline.sink.table import CommittedTable

__all__ = ["open_table_rows", "dead_letter_rows", "row_hashes", "COLUMNS"]

COLUMNS = ["object", "kind", "version", "rows_expected", "rows_actual", "only_expected", "only_actual"]
MAX_EXAMPLES = 5


def _canonical(t: pa.Table, cols: list[str]) -> pd.DataFrame:
    """Exact, type-independent values: timestamps as µs (int64), integers as int64, floats by their IEEE bits,
    everything else as its string form (a large_string and a string are equal)."""
    out: dict[str, Any] = {}
    for c in cols:
        a = t[c].combine_chunks() if t.num_rows else pa.array([], t[c].type)
        if pa.types.is_timestamp(a.type):
            a = pc.cast(pc.cast(a, pa.timestamp("us", tz=a.type.tz), safe=False), pa.int64())
        elif pa.types.is_integer(a.type) or pa.types.is_boolean(a.type):
            a = pc.cast(a, pa.int64())
        elif pa.types.is_floating(a.type):
            v = pc.cast(a, pa.float64()).to_numpy(zero_copy_only=False)
            mask = pc.is_null(a).to_numpy(zero_copy_only=False)
            bits = np.where(mask, 0, np.nan_to_num(v, nan=0.0)).view(np.int64)
            a = pa.array(bits, pa.int64(), mask=mask)
        else:
            a = pc.cast(a, pa.string()) if not pa.types.is_nested(a.type) else \
                pa.array([None if x is None else repr(x) for x in a.to_pylist()], pa.string())
        out[c] = a.to_pandas()
    return pd.DataFrame(out)


def row_hashes(t: pa.Table, cols: list[str]) -> np.ndarray:
    """A 64-bit hash of every row over ``cols`` (in this order), vectorised (pandas' hashing)."""
    if not t.num_rows:
        return np.zeros(0, np.uint64)
    return pd.util.hash_pandas_object(_canonical(t, cols), index=False).to_numpy(np.uint64)


def _diff(expected: pa.Table, actual: pa.Table, cols: list[str]) -> tuple[int, int, list[dict]]:
    """Rows of ``expected`` missing from ``actual`` and the other way round (multisets), and example rows."""
    he, ha = row_hashes(expected, cols), row_hashes(actual, cols)
    ue, ce = np.unique(he, return_counts=True)
    ua, ca = np.unique(ha, return_counts=True)
    both = pd.DataFrame({"h": ue, "e": ce}).merge(pd.DataFrame({"h": ua, "a": ca}), on="h", how="outer").fillna(0)
    only_e = int(np.clip(both["e"] - both["a"], 0, None).sum())
    only_a = int(np.clip(both["a"] - both["e"], 0, None).sum())
    examples: list[dict] = []
    if only_e or only_a:
        bad = set(both.loc[both["e"] != both["a"], "h"].astype(np.uint64).tolist())
        for side, t, h in (("commit log", expected, he), ("table", actual, ha)):
            idx = [i for i, x in enumerate(h.tolist()) if x in bad][:MAX_EXAMPLES]
            for r in t.select(cols).take(pa.array(idx, pa.int64())).to_pylist():
                examples.append({"side": side, **{k: (str(v) if v is not None else None) for k, v in r.items()}})
    return only_e, only_a, examples


def open_table_rows(runner) -> tuple[list[dict], list[dict], list[str]]:
    """One dataset row per Delta/Iceberg sink: its current version read through the format vs the commit log's
    rows; example rows of the differences; messages."""
    rows, examples, messages = [], [], []
    for s in runner.job.sinks():
        tbl = runner.ctx.table(s.table)
        if type(tbl) is CommittedTable or not hasattr(tbl, "open_read"):
            continue     # Epochal's own format: readers read the commit log's files (checksums: checkpoint_files)
        obj, kind = f"table/{s.table}", type(tbl).__name__
        committed = CommittedTable.read(tbl)
        version = "?"
        try:
            version = tbl.version_id()
            current = tbl.open_read() if tbl.exists() else pa.table({})
        except Exception as e:  # noqa: BLE001 - an unreadable table is a failure, named
            messages.append(f"{obj}: the table could not be read through its format: {type(e).__name__}: {e}")
            rows.append({"object": obj, "kind": kind, "version": version, "rows_expected": committed.num_rows,
                         "rows_actual": 0, "only_expected": committed.num_rows, "only_actual": 0})
            continue
        cols = sorted(c for c in committed.column_names if not c.startswith("__epochal"))
        missing = [c for c in cols if c not in current.column_names]
        if missing and committed.num_rows:
            messages.append(f"{obj}: the table ({version}) lacks columns {missing} of the committed rows")
            rows.append({"object": obj, "kind": kind, "version": version, "rows_expected": committed.num_rows,
                         "rows_actual": current.num_rows, "only_expected": committed.num_rows,
                         "only_actual": current.num_rows})
            continue
        if not committed.num_rows:
            cols = [c for c in current.column_names]
            committed = pa.table({c: pa.array([], current[c].type) for c in cols}) if cols else committed
        only_e, only_a, ex = _diff(committed, current, cols)
        examples += [{"object": obj, **e} for e in ex]
        rows.append({"object": obj, "kind": kind, "version": version, "rows_expected": committed.num_rows,
                     "rows_actual": current.num_rows, "only_expected": only_e, "only_actual": only_a})
    return rows, examples, messages


_CHK = ATTEMPT_DIR


def _count_rows(fio, uri: str) -> int:
    data = fio.read_bytes(uri)
    if uri.endswith(".parquet"):
        import pyarrow.parquet as pq
        return int(pq.ParquetFile(pa.BufferReader(data)).metadata.num_rows)
    return sum(1 for ln in data.splitlines() if ln.strip())


def dead_letter_rows(runner, md, expected: Mapping[str, int], uids: list[str]) -> list[dict]:
    """One dataset row per operator ``uids`` that dead-letters records: the rows of its files on disk for the
    epochs ``<=`` the validated one (per epoch the attempt directory of the newest checkpoint at most the validated
    one, as the sweep leaves it) vs ``expected[uid]`` (the batch evaluation's count)."""
    root = getattr(runner.ctx, "dead_letter_root", None)
    if not root:
        return []
    fio = file_io_for(root)
    out = []
    for uid in uids:
        prefix = operator_dead_letter_prefix(root, runner.job.name, uid)
        try:
            files = [f.uri for f in fio.list(prefix, recursive=True)]
        except Exception:  # noqa: BLE001 - no directory: nothing was dead-lettered
            files = []
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
        actual = sum(_count_rows(fio, u) for e, c in chosen.items() for u in by[(e, c)])
        exp = int(expected.get(uid, 0))
        out.append({"object": f"dead_letters/{uid}", "kind": "dead letters", "version": checkpoint_dir_name(md.checkpoint_id),
                    "rows_expected": exp, "rows_actual": actual, "only_expected": max(0, exp - actual),
                    "only_actual": max(0, actual - exp)})
    return out
