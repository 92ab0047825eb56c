"""A job and data with bad records in several epochs (never the demo): the bootstrap dead-letter test's.

Sources (E = 60 s):

* ``reads`` (key ``k``), partition 0: Parquet files that each span two epochs (the barrier cuts them: two dead-letter
  files per file), with null and empty keys; partition 1: JSON Lines files with a value that cannot be cast and a
  null ``_ingest_ts``; partition 2: good Parquet files and one file of random bytes.
* ``tags`` (key ``k``): one tag per sensor, declared unique by the join, repeated in several epochs.

Job ``bt_boot_dead_letters``: ``reads`` joined with ``tags`` (``unique="right"``: a repeated tag is dead-lettered) into
``tagged``; tumbling 60 s windows per group ``g`` over ``reads`` (no out-of-orderness: records whose event time lags
are late; records with a null group have no window) into ``per_g``.
"""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import Job

TS = pa.timestamp("us", tz="UTC")
READS = pa.schema([("k", pa.string()), ("g", pa.string()), ("v", pa.float64()), ("et", TS), ("_ingest_ts", TS)])
TAGS = pa.schema([("k", pa.string()), ("tag", pa.string()), ("_ingest_ts", TS)])
E_US = 60_000_000
T0 = 1_790_000_040 // 60 * 60 * 1_000_000   # an epoch boundary
SEC = 1_000_000


def dead_letter_job(name: str = "bt_boot_dead_letters") -> Job:
    job = Job(name, max_parallelism=8)
    r = job.source("reads", READS, key="k")
    t = job.source("tags", TAGS, key="k")
    r.join(t.select("k", "tag"), on="k", uid="jt", how="inner", unique="right", ttl_seconds=600).sink("tagged")
    r.window(uid="wl", key="g", event_time="et", size_seconds=60,
             aggs={"n": ("count", None), "vs": ("sum", "v")}).sink("per_g")
    return job


def _iso(us: int | None) -> str | None:
    if us is None:
        return None
    import datetime as dt
    return dt.datetime.fromtimestamp(us / SEC, dt.UTC).isoformat().replace("+00:00", "Z")


def _read_rows(epoch: int, part: int, n: int, start_s: int, step_s: int) -> list[dict]:
    rows = []
    for j in range(n):
        ing = T0 + epoch * E_US + (start_s + j * step_s) * SEC
        lag = 200 if (j + epoch + part) % 5 == 0 else (j * 7 + part) % 40   # every 5th row late for its window
        rows.append({"k": f"s{(j + epoch * 3 + part) % 7}", "g": None if (j + epoch) % 9 == 4 else f"g{j % 3}",
                     "v": float(j + epoch), "et": ing - lag * SEC, "_ingest_ts": ing})
    return rows


def _parquet(path: Path, rows: list[dict], schema: pa.Schema) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    cols = {f.name: [r[f.name] for r in rows] for f in schema}
    arrays = [pa.array(cols[f.name], pa.int64()).cast(TS) if f.type == TS else pa.array(cols[f.name], f.type)
              for f in schema]
    pq.write_table(pa.Table.from_arrays(arrays, schema=schema), path)


def write_epoch(root: Path, epoch: int) -> None:
    """The files of ``epoch`` (bad records in every epoch but the first, of several kinds)."""
    # partition 0: 10 rows from 30 s into the epoch to 84 s: the next epoch's barrier lies inside (row 5)
    rows = _read_rows(epoch, 0, 10, 30, 6)
    if epoch % 2 == 1:
        rows[2]["k"] = None                 # before the cut
        rows[7]["k"] = None                 # after the cut
    if epoch % 2 == 0 and epoch:
        rows[3]["k"] = ""
    _parquet(root / "reads" / "partition=0" / f"{epoch:08d}.parquet", rows, READS)
    # partition 1: JSON Lines, a value that cannot be cast, a null _ingest_ts
    rows = _read_rows(epoch, 1, 8, 2, 7)
    lines = []
    for j, r in enumerate(rows):
        d = {"k": r["k"], "g": r["g"], "v": r["v"], "et": _iso(r["et"]), "_ingest_ts": _iso(r["_ingest_ts"])}
        if epoch in (1, 3) and j == 4:
            d["v"] = "not-a-number"
        if epoch == 2 and j == 6:
            d["_ingest_ts"] = None
        lines.append(json.dumps(d))
    p1 = root / "reads" / "partition=1"
    p1.mkdir(parents=True, exist_ok=True)
    (p1 / f"{epoch:08d}.jsonl").write_text("\n".join(lines) + "\n")
    # partition 2: good rows; epoch 2's file is random bytes
    p2 = root / "reads" / "partition=2" / f"{epoch:08d}.parquet"
    if epoch == 2:
        p2.parent.mkdir(parents=True, exist_ok=True)
        p2.write_bytes(b"PAR1 this is not parquet \x00\x01\x02" * 7)
    else:
        _parquet(p2, _read_rows(epoch, 2, 6, 5, 9), READS)
    # tags: one per sensor, repeated (a violation of unique="right") in epochs 2 and 3
    tags = [{"k": f"s{(epoch * 2 + i) % 7}", "tag": f"t{epoch}-{i}", "_ingest_ts": T0 + epoch * E_US + (10 + i) * SEC}
            for i in range(2)]
    if epoch == 2:
        tags.append({"k": tags[0]["k"], "tag": "again", "_ingest_ts": T0 + epoch * E_US + 40 * SEC})
    _parquet(root / "tags" / "partition=0" / f"{epoch:08d}.parquet", tags, TAGS)


def window_chain_job(name: str = "bt_boot_window_chain") -> Job:
    """Operators reading an ``emit="final"`` window's output (the ``reads`` data above): a window over the window
    (per group, 120 s over the 60 s windows' starts) and a join of the window rows with the raw readings (by group,
    TTL 120 s)."""
    job = Job(name, max_parallelism=8)
    r = job.source("reads", READS, key="k")
    w1 = r.window(uid="w1", key="g", event_time="et", size_seconds=60, max_out_of_orderness_seconds=20,
                  aggs={"n": ("count", None), "vs": ("sum", "v")})
    w1.sink("w1_out")
    w1.window(uid="w2", key="g", event_time="window_start", size_seconds=120,
              aggs={"n2": ("sum", "n"), "c": ("count", None)}).sink("w2_out")
    w1.join(r.select("g", "k", "v AS rv"), on="g", uid="wj", ttl_seconds=120).sink("joined")
    return job
