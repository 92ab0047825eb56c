#!/usr/bin/env python3
"""Micro-benchmark of the running aggregate's kernel with ``avg``, ``count_distinct`` and ``FILTER``
(``pipeline.operators.aggregate_functions.aggregate_step``, no Spark), as its state grows.

    .venv/bin/python benchmarks/aggregate_functions_bench.py      # 50k rows a round, 1,000 groups, best of 5

One subtask's round: ``--rows`` new rows over ``--groups`` groups against a held state whose distinct sets hold
``D`` values per group, for growing ``D`` (the state-scale question of a ``count_distinct``: a round rewrites the
sets of the groups it touches). Prints rows/s and the round's time per state size, and the load average.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipeline.operators.aggregate_functions import (  # noqa: E402
    KG,
    aggregate_step,
    masked_aggs,
    output_fields,
    parse_aggs,
    state_fields,
)

AGGS = {"n": ("count", None), "avg_price": ("avg", "price"), "bidders": ("count_distinct", "bidder"),
        "big": ("count", None, "price > 5000"), "big_bidders": ("count_distinct", "bidder", "price > 5000")}


def rows_for(n: int, groups: int, universe: int, rng) -> pa.Table:
    price = rng.integers(1, 10_000, n).astype(np.float64)
    bidder = rng.integers(0, universe, n)
    return pa.table({"g": pa.array(rng.integers(0, groups, n)), "price": pa.array(price),
                     "bidder": pa.array(bidder), "__where_big": pa.array((price > 5000).astype(np.int64)),
                     "__where_big_bidders": pa.array(bidder, mask=~(price > 5000)),
                     KG: pa.array(rng.integers(0, 64, n), pa.int32())})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/aggregate_functions_bench.py", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--groups", type=int, default=1_000)
    ap.add_argument("--distinct", default="10,100,300", help="distinct values per group held in state")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    aggs, filters = parse_aggs("bench", AGGS)
    kaggs = masked_aggs(aggs, filters)
    rng = np.random.default_rng(7)
    schema = rows_for(1, 1, 1, rng).schema
    sschema = pa.schema([schema.field("g"), *state_fields(kaggs, schema), pa.field(KG, pa.int32())])
    oschema = pa.schema([schema.field("g"), *output_fields(kaggs, schema)])
    base = None
    for d in [int(x) for x in a.distinct.split(",")]:
        # a held state of ``groups`` groups with about ``d`` distinct bidders each (built by the kernel itself)
        universe = d * 4
        state = sschema.empty_table()
        while state.num_rows == 0 or np.mean(state["bidders"].to_numpy()) < d:
            state = aggregate_step("g", kaggs, sschema, oschema, state, rows_for(a.groups * d, a.groups, universe,
                                                                               rng)).state
        new = rows_for(a.rows, a.groups, universe * 2, rng)
        best = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            aggregate_step("g", kaggs, sschema, oschema, state, new)
            best = min(best, time.perf_counter() - t0)
        held = int(np.sum(state["bidders"].to_numpy()))
        base = base or best
        print(f"aggregate_step: {a.rows:,} rows, {a.groups:,} groups, {held:,} held distinct values "
              f"({held // a.groups:,}/group): best of {a.repeat} {best * 1000:.0f} ms ({a.rows / best:,.0f} rows/s, "
              f"{best / base:.2f}x the smallest state)")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
