"""A job of the lagging-partition validation test's own making (never the demo), and its data in stages: one
``views`` partition lags across two epochs, then catches up (docs/batch.md "Lagging partitions").

* ``lv``: ``clicks`` inner-joins ``views`` on ``ad`` (TTL 90 s, 60 s epochs: whether a pair is emitted depends on
  the rows' own epochs), output to the append sink ``pairs``;
* ``ads``: an aggregate of the pairs by ``ad`` (count, sum of ``cost``) into the upsert sink ``ads``.

Stages of ``views/partition=1`` (the other partitions hold every epoch from the start):

0. rows of epoch 0 and the first half of epoch 1: epoch 0's barrier is known, epoch 1 lags;
1. rows of the second half of epoch 1 (late: epoch 1's checkpoint has read the partition already) and of epoch 2:
   epoch 2 still lags, so its checkpoint reads them and tags them 2 - the late rows of epoch 1 included;
2. rows of epochs 3 and 4: the partition catches up, epoch 3's barrier is logged for every partition.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import Job

TS = pa.timestamp("us", tz="UTC")
CLICKS = pa.schema([("click", pa.string()), ("ad", pa.string()), ("cost", pa.float64()), ("_ingest_ts", TS)])
VIEWS = pa.schema([("view", pa.string()), ("ad", pa.string()), ("_ingest_ts", TS)])
E = 60
T0 = 1_790_100_000 // E * E          # an epoch boundary, seconds
EPOCHS = 5
LAGGING = ("views", 1)
#: ``_ingest_ts`` bounds (seconds after T0) of the lagging partition's rows in each stage
STAGES = ((0, 90), (90, 180), (180, EPOCHS * E))


def build() -> Job:
    job = Job("lag_ads", max_parallelism=16)
    clicks = job.source("clicks", CLICKS, key="ad")
    views = job.source("views", VIEWS, key="ad")
    pairs = clicks.join(views, on="ad", uid="lv", ttl_seconds=90, output=("ad", "click", "view", "cost"))
    pairs.sink("pairs")
    pairs.aggregate(uid="ads", key="ad", aggs={"n": ("count", None), "total": ("sum", "cost")}).sink(
        "ads", mode="upsert")
    return job


def _rows(rng, prefix: str, n: int, lo_s: int, hi_s: int) -> list[tuple[str, str, int]]:
    out = [(f"{prefix}{i}", f"ad{int(rng.integers(6))}",
            (T0 + lo_s) * 1_000_000 + int(rng.integers((hi_s - lo_s) * 1_000_000))) for i in range(n)]
    return sorted(out, key=lambda r: r[2])


def _write(root: Path, name: str, schema: pa.Schema, part: int, seq: int, rows) -> None:
    d = root / name / f"partition={part}"
    d.mkdir(parents=True, exist_ok=True)
    cols = {schema.names[0]: [r[0] for r in rows], "ad": [r[1] for r in rows]}
    if name == "clicks":
        cols["cost"] = [round(0.05 + (int(r[0].rsplit("-", 1)[1]) % 17) * 0.13, 2) for r in rows]
    cols["_ingest_ts"] = pa.array([r[2] for r in rows], TS)
    pq.write_table(pa.table(cols, schema=schema), d / f"{seq:08d}.parquet")


def write_sources(root: Path, *, per_epoch: int = 8, seed: int = 11) -> Path:
    """Every partition but the lagging one, whole (two files each), and stage 0 of the lagging one."""
    rng = np.random.default_rng(seed)
    for name, schema in (("clicks", CLICKS), ("views", VIEWS)):
        for p in (0, 1):
            if (name, p) == LAGGING:
                continue
            rows = _rows(rng, f"{name[0]}{p}-", per_epoch * EPOCHS, 0, EPOCHS * E)
            half = len(rows) // 2
            _write(root, name, schema, p, 0, rows[:half])
            _write(root, name, schema, p, 1, rows[half:])
    write_stage(root, 0, per_epoch=per_epoch, seed=seed)
    return root


def write_stage(root: Path, stage: int, *, per_epoch: int = 8, seed: int = 11) -> None:
    """Stage ``stage`` of the lagging partition: one new file (``seq = stage``)."""
    lo, hi = STAGES[stage]
    rng = np.random.default_rng(seed + 100 + stage)
    n = max(1, per_epoch * (hi - lo) // E)
    _write(root, "views", VIEWS, LAGGING[1], stage, _rows(rng, f"l{stage}-", n, lo, hi))
