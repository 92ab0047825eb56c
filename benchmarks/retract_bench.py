#!/usr/bin/env python3
"""Micro-benchmark of the retraction kernel (an aggregate over an updating stream,
``pipeline.operators.retract.retract_step``, no Spark), as its state grows.

    .venv/bin/python benchmarks/retract_bench.py      # 20k changelog rows a round, states of 1k-30k groups, best of 5

One subtask's round: ``--rows`` changelog rows (half retractions, half additions) touching ``--touched`` groups,
against a held state of ``G`` groups read whole (the heap backend's case; RocksDB reads the touched groups only), for
growing ``G``: the state-scale question (docs/operators.md "Updating streams"). Prints rows/s, the round's time per
state size and its ratio to the smallest state, and the load average.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipeline.operators.retract import KG, SIGN, output_fields, retract_step, state_fields  # noqa: E402

AGGS = (("n", "count", None), ("total", "sum", "v"), ("mean", "avg", "f"))


def rows_for(n: int, groups: np.ndarray, rng, sign: np.ndarray | None = None) -> pa.Table:
    g = rng.choice(groups, n)
    return pa.table({"g": pa.array(g), "v": pa.array(rng.integers(0, 1000, n)),
                     "f": pa.array(rng.integers(0, 10_000, n) / 100.0),
                     SIGN: pa.array(sign if sign is not None else np.ones(n, dtype=np.int32), pa.int32()),
                     KG: pa.array(g % 64, pa.int32())})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/retract_bench.py", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20_000)
    ap.add_argument("--touched", type=int, default=1_000)
    ap.add_argument("--groups", default="1000,10000,30000", help="groups held in state")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(7)
    schema = rows_for(1, np.arange(1), rng).schema
    sschema = pa.schema([schema.field("g"), *state_fields(AGGS, schema), pa.field(KG, pa.int32())])
    oschema = pa.schema([schema.field("g"), *output_fields(AGGS, schema)])
    base = None
    for groups in [int(x) for x in a.groups.split(",")]:
        all_groups = np.arange(groups, dtype=np.int64)
        state = retract_step("g", AGGS, sschema, oschema, sschema.empty_table(),
                             rows_for(groups * 4, all_groups, rng)).state
        # a round: the touched groups' rows retracted (rows the state holds) and new rows added
        touched = rng.choice(all_groups, min(a.touched, groups), replace=False)
        half = a.rows // 2
        adds = rows_for(half, touched, rng)
        held = retract_step("g", AGGS, sschema, oschema, state, adds).state   # rows to retract exist
        round_rows = pa.concat_tables([adds.set_column(adds.schema.get_field_index(SIGN), SIGN,
                                                       pa.array(np.full(half, -1, dtype=np.int32), pa.int32())),
                                       rows_for(half, touched, rng)])
        best = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            retract_step("g", AGGS, sschema, oschema, held, round_rows)
            best = min(best, time.perf_counter() - t0)
        base = base or best
        print(f"retract_step: {round_rows.num_rows:,} changelog rows touching {len(touched):,} groups, "
              f"{held.num_rows:,} groups held: best of {a.repeat} {best * 1000:.0f} ms "
              f"({round_rows.num_rows / best:,.0f} rows/s, {best / base:.2f}x the smallest state)")
    print(f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
