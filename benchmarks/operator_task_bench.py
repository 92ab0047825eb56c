#!/usr/bin/env python3
"""Micro-benchmark of one operator subtask's Python work in a round (no Spark): the real ``mapInArrow`` task
functions of the join (chained, as when its output feeds an aggregate) and of the aggregate, run in this process
on synthetic Arrow input shaped as Spark hands it over (both join sides in one union with ``_side``, ``_kg``, the
rows' own epochs, the epoch tag, one beacon row, batches of 50,000 rows), with state, sink files and acks on
local files.

    .venv/bin/python benchmarks/operator_task_bench.py                      # 8 epochs x 80k rows per side, tagged
    .venv/bin/python benchmarks/operator_task_bench.py --epochs 1 --rounds 8 # the same epochs, one per round
    .venv/bin/python benchmarks/operator_task_bench.py --profile 30          # + cProfile, top 30 by own time

What it measures is the part of a Spark task spent in Epochal's Python code (split per epoch, the kernels, state
and sink writes, the acks, building the flowing batches); the JVM side (shuffle read, rows <-> Arrow) is not in
it. The job is generic (string keys, a few string / double / timestamp columns, about 80% of the right rows find
their left row, TTL 1 h): not the demo job. Prints the best of ``--repeat`` runs, CPU seconds and the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from pipeline.operators.join import JoinType, Uniqueness  # noqa: E402
from pipeline.operators.ttl import ROW_EPOCH  # noqa: E402
from pipeline.runtime.operators import task as ops  # noqa: E402
from pipeline.runtime.operators.aggregate import (  # noqa: E402
    EXACT_SUM,  # noqa: E402
    AggTaskSpec,
    make_agg_task,
)
from pipeline.runtime.operators.join import JoinTaskSpec, make_join_task  # noqa: E402
from pipeline.runtime.operators.report_codec import from_ipc, from_table  # noqa: E402
from pipeline.runtime.operators.round_params import EPOCH_TAG, TAGGED_KEY  # noqa: E402
from pipeline.runtime.operators.task import BEACON  # noqa: E402
from pipeline.state import backend  # noqa: E402
from pipeline.state.snapshot import SnapshotOptions  # noqa: E402

TS = pa.timestamp("us", tz="UTC")
E_US = 60_000_000
FIRST = 29_000_000
LEFT = pa.schema([("id", pa.string()), ("who", pa.string()), ("shop", pa.string()), ("qty", pa.float64()),
                  ("t_left", TS), ("_ingest_ts", TS)])
RIGHT = pa.schema([("id", pa.string()), ("ref", pa.string()), ("paid", pa.float64()), ("t_right", TS),
                   ("_ingest_ts", TS)])
OUT = pa.schema([pa.field(n, t, nullable=True) for n, t in (
    ("id", pa.string()), ("who", pa.string()), ("shop", pa.string()), ("qty", pa.float64()), ("ref", pa.string()),
    ("paid", pa.float64()), ("t_left", TS), ("t_right", TS))])
FLOW = pa.schema([pa.field("shop", pa.string()), pa.field("paid", pa.float64()), pa.field(ROW_EPOCH, pa.int64())])
UNION = pa.schema(list(LEFT) + [f for f in RIGHT if f.name not in LEFT.names] + [
    pa.field(ROW_EPOCH, pa.int64()), pa.field(EPOCH_TAG, pa.int64()), pa.field("_side", pa.int8()),
    pa.field("_kg", pa.int32()), pa.field("_subtask", pa.int32()), pa.field(BEACON, pa.bool_())])


def epoch_rows(rng: np.random.Generator, epoch: int, n: int) -> pa.Table:
    """One epoch's input of the subtask: ``n`` left rows (new ids) and ``n`` right rows (about 80% for ids of this
    or the previous epoch, the rest unknown ids; every id once per side)."""
    base = (epoch - FIRST) * n
    lid = np.arange(base, base + n)
    window = np.arange(base - n // 4, base + n - n // 4)  # consecutive epochs' windows are disjoint: ids unique
    known = window[(window >= 0) & (window % 5 != 0)]
    rid = rng.permutation(np.concatenate([known, 10 ** 9 + np.arange(base, base + n - len(known))]))
    t0 = epoch * E_US

    def ts(m):
        return pa.array(np.sort(rng.integers(t0, t0 + E_US, m)), TS)

    def ids(v):
        return pa.array([f"k-{i:010d}" for i in v])

    left = {"id": ids(lid), "who": pa.array([f"c{i:08d}" for i in rng.integers(0, 400_000, n)]),
            "shop": pa.array([f"m{i:05d}" for i in rng.integers(0, 500, n)]),
            "qty": pa.array(rng.random(n) * 100), "t_left": ts(n), "_ingest_ts": ts(n), "_side": 0}
    right = {"id": ids(rid), "ref": pa.array([f"p{i:09d}" for i in range(base, base + len(rid))]),
             "paid": pa.array(rng.random(len(rid)) * 100), "t_right": ts(len(rid)), "_ingest_ts": ts(len(rid)),
             "_side": 1}
    parts = []
    for side, m in ((left, n), (right, len(rid))):
        cols = {}
        for f in UNION:
            if f.name in side and f.name != "_side":
                cols[f.name] = side[f.name]
            elif f.name == "_side":
                cols[f.name] = pa.repeat(pa.scalar(side["_side"], pa.int8()), m)
            elif f.name in (ROW_EPOCH, EPOCH_TAG):
                cols[f.name] = pa.repeat(pa.scalar(epoch, pa.int64()), m)
            elif f.name == "_kg":
                cols[f.name] = pa.array(rng.integers(0, 64, m), pa.int32())
            else:
                cols[f.name] = pa.nulls(m, f.type)
        parts.append(pa.table(cols, schema=UNION))
    return pa.concat_tables(parts)


def params(root: str, uid: str, cid: int, epoch: int, *, chained: bool, ttl_s: int) -> dict:
    end = (epoch + 1) * E_US
    return {"barrier_us": end, "checkpoint": f"chk-{cid}", "parent_handles": {},
            "state_prefix": f"{root}/chk-{cid}/rounds/0/state/{uid}", "output_prefix": f"{root}/sink/{uid}/txn-{cid}",
            "output_name": uid, "file_tag": "r0", "ttl_cutoff_us": end - ttl_s * 1_000_000,
            "ack_prefix": f"{root}/chk-{cid}/rounds/0/acks/{uid}" if chained else None, "replay_handles": {},
            "channel_prefix": None, "prior_output": [], "epoch": epoch, "complete": True,
            "snapshot": SnapshotOptions(checkpoint_id=cid, round=0, shared=f"{root}/shared/{uid}").to_params()}


def run_round(task, uid: str, rows: pa.Table, entries: list[dict]) -> list[pa.RecordBatch]:
    """One subtask's round: ``entries`` of several epochs (a tagged round) or one (its params as they are)."""
    prop = {TAGGED_KEY: entries} if len(entries) > 1 else entries[0]["params"]
    ops.task_params = lambda key: prop  # type: ignore[assignment]  # the round's local property
    if len(entries) == 1:
        rows = rows.drop_columns([EPOCH_TAG])
    return list(task(iter(rows.to_batches(max_chunksize=50_000))))


def one_run(a, inputs: list[pa.Table], root: str) -> tuple[float, float, dict]:
    join = make_join_task(JoinTaskSpec(
        "j", "chk-?", "id", tuple(LEFT.names), tuple(RIGHT.names), tuple(OUT.names), 2, 128, None, {}, "", "", "",
        "", LEFT, RIGHT, OUT, flow_schema=FLOW, how=JoinType.INNER, unique=Uniqueness.BOTH,
        ttl_us=a.ttl * 1_000_000, epoch_us=E_US))
    agg_state = pa.schema([("shop", pa.string()), ("n", pa.int64()), ("paid_sum", EXACT_SUM)])
    agg_out = pa.schema([("shop", pa.string()), ("n", pa.int64()), ("paid_sum", pa.float64())])
    agg = make_agg_task(AggTaskSpec("a", "chk-?", "shop", (("n", "count", None), ("paid_sum", "sum", "paid")),
                                    agg_state, 2, 128, {}, "", "", "", "", out_schema=agg_out))
    beacon = pa.Table.from_pylist([{"_subtask": 0, BEACON: True}], schema=UNION)
    backend._RECENT.clear()
    counts = {"in": 0, "pairs": 0}
    parents: dict[str, dict] = {}
    wall = cpu = 0.0
    per_round = len(inputs) // a.rounds
    for r in range(a.rounds):
        epochs = list(range(FIRST + r * per_round, FIRST + (r + 1) * per_round))
        rows = pa.concat_tables([beacon] + inputs[r * per_round:(r + 1) * per_round])
        counts["in"] += rows.num_rows - 1
        jent = [{"checkpoint_id": 10 + e - FIRST, "epoch": e,
                 "params": params(root, "j", 10 + e - FIRST, e, chained=True, ttl_s=a.ttl)} for e in epochs]
        aent = [{"checkpoint_id": 10 + e - FIRST, "epoch": e,
                 "params": params(root, "a", 10 + e - FIRST, e, chained=False, ttl_s=a.ttl)} for e in epochs]
        if r:  # parents: the previous round's last epoch (served warm, as in a worker)
            for ent, uid in ((jent, "j"), (aent, "a")):
                ent[0]["params"]["parent_handles"] = parents[uid]
        w0, c0 = time.perf_counter(), time.process_time()
        flowing = run_round(join, "j", rows, jent)
        fl = pa.Table.from_batches(flowing, schema=FLOW.append(pa.field(EPOCH_TAG, pa.int64())) if per_round > 1
                                   else FLOW) if flowing else None
        counts["pairs"] += fl.num_rows if fl is not None else 0
        agg_in = pa.table({"shop": fl["shop"], "paid": fl["paid"], "_kg": pa.repeat(pa.scalar(0, pa.int32()),
                                                                                  fl.num_rows),
                           **({EPOCH_TAG: fl[EPOCH_TAG]} if per_round > 1 else {})}) if fl is not None else None
        agg_b = pa.table({"shop": pa.nulls(1, pa.string()), "paid": pa.nulls(1, pa.float64()),
                          "_kg": pa.nulls(1, pa.int32()), **({EPOCH_TAG: pa.nulls(1, pa.int64())}
                                                             if per_round > 1 else {}),
                          "_subtask": pa.array([0], pa.int32()), BEACON: pa.array([True])})
        if agg_in is not None:
            agg_in = agg_in.append_column("_subtask", pa.nulls(agg_in.num_rows, pa.int32())).append_column(
                BEACON, pa.nulls(agg_in.num_rows, pa.bool_()))
        agg_rows = pa.concat_tables([agg_b] + ([agg_in] if agg_in is not None else []))
        aout = run_round(agg, "a", agg_rows, aent) if per_round > 1 else run_round(
            agg, "a", agg_rows.append_column(EPOCH_TAG, pa.nulls(agg_rows.num_rows, pa.int64())), aent)
        wall += time.perf_counter() - w0
        cpu += time.process_time() - c0
        acks = from_ipc(open(f"{jent[0]['params']['ack_prefix']}/00000.arrow".removeprefix("file://"), "rb").read())
        last = 10 + epochs[-1] - FIRST
        parents["j"] = {n: [x.state.to_dict() for x in acks if x.state is not None and x.name == n and
                            (x.checkpoint_id in (None, last))] for n in ("left", "right")}
        arep = from_table(pa.Table.from_batches(aout))
        parents["a"] = {"agg": [x.state.to_dict() for x in arep if x.state is not None and
                                x.checkpoint_id in (None, last)]}
    return wall, cpu, counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/operator_task_bench.py", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=80_000, help="left rows per epoch (right rows: as many)")
    ap.add_argument("--epochs", type=int, default=8, help="epochs per round (1: one-epoch rounds)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds (the epochs in total: epochs x rounds)")
    ap.add_argument("--ttl", type=int, default=3600, help="state TTL in seconds")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", type=int, default=0, metavar="TOP", help="cProfile the last run, print TOP lines")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(7)
    total = a.epochs * a.rounds
    inputs = [epoch_rows(rng, FIRST + i, a.rows) for i in range(total)]
    a.rounds = total // a.epochs if a.epochs > 1 else total
    best_w = best_c = float("inf")
    counts: dict = {}
    for i in range(a.repeat):
        tmp = tempfile.mkdtemp(prefix="epochal-optask-")
        os.environ["PIPELINE_STATE_CACHE_DIR"] = os.path.join(tmp, "warm")
        prof = None
        if a.profile and i == a.repeat - 1:
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        try:
            w, c, counts = one_run(a, inputs, f"file://{tmp}")
        finally:
            if prof is not None:
                prof.disable()
            shutil.rmtree(tmp, ignore_errors=True)
        best_w, best_c = min(best_w, w), min(best_c, c)
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(json.dumps({"epochs_per_round": a.epochs, "rounds": a.rounds, "rows_in": counts["in"],
                      "pairs": counts["pairs"], "best_wall_s": round(best_w, 3), "best_cpu_s": round(best_c, 3),
                      "repeat": a.repeat, "load": load}))
    if prof is not None:
        import pstats
        pstats.Stats(prof).sort_stats("tottime").print_stats(a.profile)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(a.profile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
