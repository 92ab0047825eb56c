"""Random jobs for the property-based crash test, rebuilt in the child process from ``BT_JOB_SEED``.

``python -m pipeline run --job randjobs:job`` (with ``tests/batch`` on ``PYTHONPATH``) builds the same job as
:func:`random_job` with the seed in the environment. Shapes are drawn from what the operators support:
a join (random TTL, optional filter/select on either side) feeding an append sink and/or an aggregate with an
upsert sink; an aggregate over a raw source; random aggregate functions. Even seeds deduplicate the left input
(random TTL) before the join; seeds with ``seed % 3 != 2`` add an event-time window (tumbling or sliding, random
out-of-orderness and lateness, ``final`` into an append sink or ``update`` into an upsert sink) over the right
input (event time up to 89 s behind arrival: out of order, late records) or over the dedup's output. So seeds
0..5 cover every combination, and the CI profile (seed 0) has both.
"""
from __future__ import annotations

import os
import random

from batch_jobs import LEFT, RIGHT

from pipeline import Job


def random_job(seed: int) -> Job:
    rnd = random.Random(seed)
    job = Job(f"rand{seed}", max_parallelism=rnd.choice([8, 16, 32]))
    a = job.source("lefts", LEFT, key="k")
    b = job.source("rights", RIGHT, key="k")
    dedup = a.deduplicate(uid="dd", key="k", ttl_seconds=rnd.choice([60, 150, 3600])) if seed % 2 == 0 else None
    if seed % 3 != 2:
        over_dedup = dedup is not None and rnd.random() < 0.4
        src = dedup.select("k", "grp AS wk", "x AS wv", "_ingest_ts AS et") if over_dedup and dedup is not None \
            else b.select("k", "tag AS wk", "y AS wv",
                          "timestamp_micros(unix_micros(_ingest_ts) - (y % 90) * 1000000) AS et")
        size = rnd.choice([60, 120])
        emit = rnd.choice(["final", "update"])
        w = src.window(uid="win", key=rnd.choice(["k", "wk"]), event_time="et", size_seconds=size,
                       slide_seconds=rnd.choice([None, size // 2]), max_out_of_orderness_seconds=rnd.choice([0, 20]),
                       allowed_lateness_seconds=rnd.choice([0, 30]),
                       aggs={"n": ("count", None), "total": ("sum", "wv"), "top": ("max", "wv")}, emit=emit)
        w.sink("windows", mode="append" if emit == "final" else "upsert")
    if dedup is not None:
        a = dedup
    if rnd.random() < 0.5:
        a = a.filter(rnd.choice(["x > 10", "grp <> 'g3'", "x < 90"]))
    rb = b.select("k", "y", "tag AS rtag") if rnd.random() < 0.7 else b.filter("tag = 'ok'").select(
        "k", "y", "tag AS rtag")
    ttl = rnd.choice([90, 150, 400, 3600])
    j = a.join(rb, on="k", uid="j", ttl_seconds=ttl)
    if rnd.random() < 0.8:
        j.sink("joined")
    fns = {"n": ("count", None), "xs": ("sum", "x"), "ys": ("sum", "y"), "ymin": ("min", "y"),
           "xmax": ("max", "x")}
    keep = dict(rnd.sample(sorted(fns.items()), rnd.randint(1, 4)))
    j.aggregate(uid="agg", key=rnd.choice(["grp", "rtag"]), aggs=keep).sink("totals", mode="upsert")
    if rnd.random() < 0.5:
        a.aggregate(uid="raw", key="grp", aggs={"rows": ("count", None), "xsum": ("sum", "x")}).sink(
            "raw_totals", mode="upsert")
    return job


def job() -> Job:
    return random_job(int(os.environ["BT_JOB_SEED"]))
