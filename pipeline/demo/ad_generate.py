"""Deterministic data generator for the example job ``ad_clicks`` (:mod:`pipeline.jobs.ad_clicks`).

Writes ``<root>/impressions/partition=<p>/<seq:08d>.parquet`` and ``<root>/clicks/partition=<p>/...`` (the source
contract: ``_ingest_ts`` non-decreasing within a partition, one file per partition and epoch, ``seq`` from 0).

* Epoch ``r`` (``_ingest_ts`` in ``[start + r*E, start + (r+1)*E)``) has ``impressions_per_epoch`` impressions of
  random users (``u<k>``) and ads (``a<k>``; campaign ``c<ad % campaigns>``), spread over the partitions. Few
  users and ads: the same user sees the same ad repeatedly (repeated join keys on both sides).
* Event time = ingest time - delay: 85% 0-20 s, 10% 20-90 s (out of order beyond the 30 s bound), 5% 5-15 min
  (late: their windows have usually fired already).
* 12% of impressions get a click by the same user on the same ad, ingested 1-90 s later (possibly in a later
  epoch) in a random partition, with its own event-time delay; 2% extra clicks have no impression. 15% of clicks
  are re-sent (identical but for a ``_ingest_ts`` 0-120 s later, any partition): duplicates.
* Partition ``p`` of a source delivers nothing in epoch ``r`` when ``(r + p) % 7 == 6`` (idle partitions); data
  due there moves to the next partition.

Everything is a pure function of the arguments (seed included). CLI:
``python -m pipeline.demo.ad_generate --root URI [--epochs N] [--impressions N] [--partitions P] [--seed S]``.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.fileio import file_io_for, join_uri
from pipeline.jobs.ad_clicks import CLICKS_SCHEMA, IMPRESSIONS_SCHEMA

__all__ = ["generate_ads", "main"]

US = 1_000_000


def _delays(rng: np.random.Generator, n: int) -> np.ndarray:
    u = rng.random(n)
    d = rng.integers(0, 20 * US, n)
    d = np.where(u > 0.85, rng.integers(20 * US, 90 * US, n), d)
    return np.where(u > 0.95, rng.integers(300 * US, 900 * US, n), d)


def _idle(r: int, p: int) -> bool:
    return (r + p) % 7 == 6


def _place(rng, r_of: np.ndarray, P: int) -> np.ndarray:
    part = rng.integers(0, P, len(r_of))
    for _ in range(P):  # move rows off idle partitions
        idle = np.array([_idle(int(r), int(p)) for r, p in zip(r_of, part)], dtype=bool)
        if not idle.any():
            break
        part = np.where(idle, (part + 1) % P, part)
    return part


def generate_ads(root: str, *, epochs: int = 15, epoch_seconds: int = 60, partitions: int = 3,
                 impressions_per_epoch: int = 300, users: int = 60, ads: int = 24, campaigns: int = 6,
                 seed: int = 7, start: str = "2026-01-01T00:00:00Z") -> dict:
    """Over 8 parameters: the generator's knobs, each a keyword with a default the docs name."""
    E = epoch_seconds * US
    t0 = int(datetime.fromisoformat(start.replace("Z", "+00:00")).astimezone(timezone.utc).timestamp()) * US
    t_end = t0 + epochs * E
    rng = np.random.default_rng(seed)
    n = epochs * impressions_per_epoch
    ing = np.sort(rng.integers(t0, t_end, n))
    user = rng.integers(0, users, n)
    ad = rng.integers(0, ads, n)
    imp = {"impression_id": np.array([f"i{i:07d}" for i in range(n)]), "ad_id": np.array([f"a{a}" for a in ad]),
           "campaign_id": np.array([f"c{a % campaigns}" for a in ad]), "user_id": np.array([f"u{u}" for u in user]),
           "event_time": ing - _delays(rng, n), "_ingest_ts": ing}
    # clicks: on impressions, plus orphans
    clicked = np.flatnonzero(rng.random(n) < 0.12)
    c_ing = ing[clicked] + rng.integers(1 * US, 90 * US, len(clicked))
    c_user, c_ad = user[clicked], ad[clicked]
    n_orphan = max(1, n // 50)
    c_ing = np.concatenate([c_ing, rng.integers(t0, t_end, n_orphan)])
    c_user = np.concatenate([c_user, rng.integers(0, users, n_orphan)])
    c_ad = np.concatenate([c_ad, rng.integers(0, ads, n_orphan)])
    m = len(c_ing)
    clicks = {"click_id": np.array([f"k{i:07d}" for i in range(m)]), "ad_id": np.array([f"a{a}" for a in c_ad]),
              "user_id": np.array([f"u{u}" for u in c_user]), "event_time": c_ing - _delays(rng, m),
              "_ingest_ts": c_ing}
    dup = np.flatnonzero(rng.random(m) < 0.15)
    clicks = {k: np.concatenate([v, v[dup]]) for k, v in clicks.items()}
    clicks["_ingest_ts"][m:] += rng.integers(0, 120 * US, len(dup))
    keep = clicks["_ingest_ts"] < t_end
    clicks = {k: v[keep] for k, v in clicks.items()}
    files = 0
    rows = {}
    for name, cols, schema in (("impressions", imp, IMPRESSIONS_SCHEMA), ("clicks", clicks, CLICKS_SCHEMA)):
        r_of = (cols["_ingest_ts"] - t0) // E
        part = _place(rng, r_of, partitions)
        rows[name] = int(len(r_of))
        for p in range(partitions):
            seq = 0
            for r in range(epochs):
                if _idle(r, p):
                    continue
                sel = np.flatnonzero((part == p) & (r_of == r))
                sel = sel[np.argsort(cols["_ingest_ts"][sel], kind="stable")]
                t = pa.table({f.name: (pa.array(cols[f.name][sel], pa.int64()).cast(f.type)
                                       if pa.types.is_timestamp(f.type) else pa.array(cols[f.name][sel], f.type))
                              for f in schema}, schema=schema)
                buf = pa.BufferOutputStream()
                pq.write_table(t, buf)
                uri = join_uri(root, f"{name}/partition={p}/{seq:08d}.parquet")
                file_io_for(uri).write_bytes(uri, buf.getvalue().to_pybytes())
                seq += 1
                files += 1
    return {"root": root, "epochs": epochs, "epoch_seconds": epoch_seconds, "partitions": partitions,
            "first_epoch": t0 // E, "last_epoch": t0 // E + epochs - 1, "rows": rows, "files": files,
            "duplicate_clicks": int(len(dup))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.demo.ad_generate", description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--epoch-seconds", type=int, default=60)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--impressions", type=int, default=300, help="impressions per epoch")
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    print(json.dumps(generate_ads(a.root, epochs=a.epochs, epoch_seconds=a.epoch_seconds, partitions=a.partitions,
                                  impressions_per_epoch=a.impressions, seed=a.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
