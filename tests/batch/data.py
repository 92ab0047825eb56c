"""Source data of the batch-equivalence tests: repeated or unique keys, late partners, idle partitions."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from batch_jobs import LEFT, RIGHT

T0 = 1_780_000_000 // 60 * 60 * 1_000_000   # an epoch boundary (E = 60 s), in microseconds
E_US = 60_000_000


def _write(root: Path, source: str, schema: pa.Schema, rows: dict, partitions: int, epochs: int,
           idle: set[tuple[int, int]]) -> None:
    t = pa.table(rows, schema=schema).sort_by("_ingest_ts")
    ts = t["_ingest_ts"].cast(pa.int64()).to_numpy()
    part = np.arange(t.num_rows) % partitions
    for p in range(partitions):
        seq = 0
        for e in range(epochs):
            if (p, e) in idle:
                continue
            lo, hi = T0 + e * E_US, T0 + (e + 1) * E_US
            sel = (part == p) & (ts >= lo) & (ts < hi)
            if e == epochs - 1:
                sel = (part == p) & (ts >= lo)
            if (p, e + 1) in idle:   # the idle epoch's rows arrive late, with the next file
                sel |= (part == p) & (ts >= hi) & (ts < hi + E_US)
            chunk = t.filter(pa.array(sel))
            d = root / source / f"partition={p}"
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(chunk, d / f"{seq:08d}.parquet")
            seq += 1


def generate(root: Path, *, seed: int, epochs: int = 4, n_left: int = 120, repeated: bool = False,
             partitions: int = 2, idle: set[tuple[int, int]] = frozenset(), bad_keys: float = 0.0) -> None:
    """``lefts``/``rights`` under ``root``. ``repeated``: keys repeat on both sides (many-to-many);
    ``bad_keys``: share of left rows with a null key (bad records: the runtime dead-letters them)."""
    rng = np.random.default_rng(seed)
    span = epochs * E_US
    pool = n_left // 4 if repeated else n_left
    lk = rng.integers(0, pool, n_left) if repeated else rng.permutation(n_left)
    lt = T0 + rng.integers(0, span - E_US // 2, n_left)
    left = {"k": [f"k{v:04d}" for v in lk], "grp": [f"g{v % 5}" for v in lk],
            "x": np.round(rng.uniform(0, 100, n_left), 2), "_ingest_ts": lt}
    n_right = int(n_left * 0.8)
    idx = rng.integers(0, n_left, n_right) if repeated else rng.permutation(n_left)[:n_right]
    delay = rng.integers(-200, 260, n_right) * 1_000_000
    rt = np.clip(lt[idx] + delay, T0, T0 + span - 1)
    right = {"k": [left["k"][i] for i in idx], "y": rng.integers(1, 1000, n_right),
             "tag": np.where(rng.random(n_right) < 0.1, "drop", "ok"), "_ingest_ts": rt}
    if bad_keys:
        left["k"] = [None if rng.random() < bad_keys else k for k in left["k"]]
    _write(root, "lefts", LEFT, left, partitions, epochs, set(idle))
    _write(root, "rights", RIGHT, right, partitions, epochs, set(idle))
