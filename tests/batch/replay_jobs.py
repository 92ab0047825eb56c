"""Jobs of the replay-determinism tests (never the demo): a deterministic ``process`` job and a broken one."""
from __future__ import annotations

import itertools
import random

import pyarrow as pa
import pyarrow.compute as pc
from batch_jobs import LEFT

from pipeline import Job

STATE = pa.schema([("k", pa.string()), ("n", pa.int64()), ("total", pa.float64())])
OUT = pa.schema([("k", pa.string()), ("n", pa.int64()), ("total", pa.float64()), ("seq", pa.int64())])


def _running_totals(rows: pa.Table, state: pa.Table, seq) -> tuple[pa.Table, pa.Table]:
    """Per key: rows seen and the sum of ``x`` so far; one output row per input row."""
    acc = {r["k"]: (r["n"], r["total"]) for r in state.to_pylist()}
    out = []
    for r in rows.select(["k", "x"]).to_pylist():
        n, total = acc.get(r["k"], (0, 0.0))
        acc[r["k"]] = (n + 1, total + r["x"])
        out.append({"k": r["k"], "n": n + 1, "total": total + r["x"], "seq": seq(n + 1)})
    new_state = pa.Table.from_pylist([{"k": k, "n": v[0], "total": v[1]} for k, v in sorted(acc.items())],
                                     schema=STATE)
    return new_state, pa.Table.from_pylist(out, schema=OUT)


def deterministic_fn(rows, state):
    return _running_totals(rows, state, lambda n: n)


_CALLS = itertools.count()   # module-level: survives between calls in one Python worker


def counter_fn(rows, state):
    """Not deterministic: numbers its output rows with a module-level counter."""
    return _running_totals(rows, state, lambda n: next(_CALLS))


def random_state_fn(rows, state):
    """Not deterministic: an unseeded random draw lands in the state (its output is deterministic)."""
    new_state, out = _running_totals(rows, state, lambda n: n)
    noise = pa.array([random.random() < 0.5 for _ in range(new_state.num_rows)])
    return new_state.set_column(2, "total", pc.add(new_state["total"], pc.cast(noise, pa.float64()))), out


def process_job(fn=deterministic_fn, name: str = "bt_replay_det") -> Job:
    """A ``process`` operator (running totals per key) feeding an append sink and an aggregate over its output."""
    job = Job(name, max_parallelism=8)
    p = job.source("lefts", LEFT, key="k").process(uid="totals", key="k", fn=fn, state_schema=STATE,
                                                   output_schema=OUT)
    p.sink("running")
    p.aggregate(uid="per-k", key="k", aggs={"rows": ("count", None)}).sink("per_k", mode="upsert")
    return job
