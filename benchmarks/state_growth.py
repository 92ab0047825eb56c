#!/usr/bin/env python3
"""State-growth benchmark: full vs incremental state snapshots while the state grows at a constant delta.

    .venv/bin/python benchmarks/state_growth.py                         # 24 epochs x 10k events, ~5 min
    .venv/bin/python benchmarks/state_growth.py --epochs 30 --events 20000
    .venv/bin/python benchmarks/state_growth.py --backend rocksdb --epochs 31 --events 50000 --out /tmp/rdb.json
    .venv/bin/python benchmarks/state_growth.py --s3 --out /tmp/s3.json      # checkpoints on moto S3 (child process)
    .venv/bin/python benchmarks/state_growth.py --plot docs/img/state_growth.png /tmp/file.json /tmp/s3.json

The job (of this benchmark's own making): ``events(event_id, user, value)`` -> ``deduplicate(event_id)`` ->
``aggregate(count, sum per user)`` -> upsert sink. Every epoch brings ``--events`` new event ids, so the dedup
state grows by the same delta every epoch (after ``--epochs`` epochs it is ``--epochs`` times the first), while
the aggregate's state (``--users`` keys) only changes where users were touched.

Each mode runs in a fresh process (fresh JVM and Python workers; the executor environment differs):

* ``full``: ``PIPELINE_STATE_INCREMENTAL=false`` and the warm cache off (``PIPELINE_STATE_CACHE_MAX_BYTES=0``):
  every epoch reads its whole state from storage and writes it whole (the behaviour before docs/state.md);
* ``incremental``: changelog snapshots (defaults: at most 10 deltas, deltas <= 0.5 x base) and warm state;
* ``rocksdb`` (``--backend rocksdb``): incremental snapshots with ``PIPELINE_STATE_BACKEND=rocksdb``: the state
  lives in executor-local keyed stores and a round reads and writes only the keys its input touches.

Event ids are random 128-bit hex strings (like UUIDs), so the state's bytes grow with its rows. Printed per
epoch (epoch 0 includes the JVM start): the epoch's wall time (one round = one checkpoint), the state rows, the bytes the checkpoint
persisted and the full state size it represents (``_metadata`` stats). Results also go to ``--out`` (JSON), with
the peak RSS (``VmHWM``) of the run's Python workers (PySpark's daemon and the workers it forks, below the child)
and, apart, of the driver JVM (before 2026-11-26 the JVM was counted as a "Python worker": its command line
holds ``pyspark/jars``; the 666-1,364 MiB "worker" peaks in docs/state.md were the JVM's).
With ``--s3`` checkpoints and sink go to a moto S3 server in a child process (loopback); the source stays local.
``--plot PNG JSON...`` draws epoch time and checkpoint bytes vs state size from earlier ``--out`` files.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench_common import peak_rss_by_role

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2024, 1, 1, tzinfo=UTC)
EPOCH_S = 60


def _job():
    import pyarrow as pa

    from pipeline.job import Job
    schema = pa.schema([pa.field("event_id", pa.string()), pa.field("user", pa.string()),
                        pa.field("value", pa.int64()), pa.field("_ingest_ts", pa.timestamp("us", tz="UTC"))])
    job = Job("state_growth", max_parallelism=32)
    ev = job.source("events", schema, key="event_id")
    ev.deduplicate(uid="seen", key="event_id") \
        .aggregate(uid="per-user", key="user", aggs={"n": ("count", None), "total": ("sum", "value")}) \
        .sink("user_totals", mode="upsert", key=["user"])
    return job, schema


def generate(src: Path, epochs: int, events: int, users: int, partitions: int = 2) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    _, schema = _job()
    rng = np.random.default_rng(7)
    per = events // partitions
    for e in range(epochs):
        for p in range(partitions):
            d = src / "events" / f"partition={p}"
            d.mkdir(parents=True, exist_ok=True)
            ids = [f"{x:032x}" for x in rng.integers(0, 2**62, per)]  # UUID-like: state bytes grow too
            start = T0 + timedelta(seconds=e * EPOCH_S)
            ts = [start + timedelta(seconds=EPOCH_S * i / per) for i in range(per)]
            t = pa.table({"event_id": ids, "user": [f"u{u}" for u in rng.integers(0, users, per)],
                          "value": rng.integers(1, 100, per), "_ingest_ts": ts}, schema=schema)
            pq.write_table(t, d / f"{e:08d}.parquet")


def child(args) -> None:
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    job, _ = _job()
    root = Path(args.work)
    run = args.run or args.mode
    ckpt = f"{args.s3_root}/{run}/ckpt" if args.s3_root else (root / run / "ckpt").as_uri()
    cfg = load_config(env={}, source_uri=(root / "src").as_uri(),
                      checkpoint_uri=ckpt,
                      sink_uri=f"{args.s3_root}/{run}/sink" if args.s3_root else (root / run / "sink").as_uri(),
                      parallelism=2, epoch_seconds=EPOCH_S,
                      retained_checkpoints=1000, state_incremental=args.mode != "full",
                      state_backend="rocksdb" if args.mode == "rocksdb" else "heap",
                      clock_now=(T0 + timedelta(seconds=EPOCH_S * (args.epochs + 2))).isoformat())
    r = JobRunner(job, cfg, echo=lambda m: None)
    completed, cpu, load = [], [], []
    for _ in range(args.epochs):  # one epoch at a time: the CPU seconds and the load of each epoch
        c0 = _tree_cpu_s()
        rep = r.run(1)
        cpu.append(round(_tree_cpu_s() - c0, 3))
        load.append(round(os.getloadavg()[0], 2))
        completed += list(rep.completed)
    peaks = peak_rss_by_role(os.getpid())  # the JVM apart: its command line matches "pyspark" too
    workers_hwm = peaks.get("python-worker", [])
    by_id = {cp.checkpoint_id: cp.metadata for cp in r.coordinator.store.list()}
    rows = []
    for i, rr in enumerate(completed):
        md = by_id[rr.checkpoint_id]
        st = md.stats
        assert st is not None
        deltas = max((len(h.deltas) for h in md.state_handles()), default=0)
        rows.append({"epoch": rr.epoch, "checkpoint": rr.checkpoint_id, "epoch_s": round(rr.duration_s, 3),
                     "cpu_s": cpu[i] if len(completed) == len(cpu) else None,
                     "load1": load[i] if len(completed) == len(load) else None,
                     "state_rows": st.rows, "bytes": st.bytes, "persisted_bytes": st.checkpointed_bytes,
                     "max_chain_deltas": deltas})
    Path(args.out).write_text(json.dumps({"epochs": rows, "workers_peak_rss": workers_hwm,
                                          "jvm_peak_rss": peaks.get("jvm", [])}))


def _tree_cpu_s() -> float:
    """CPU seconds (user + system, reaped children included) of this process and every descendant: the driver,
    the JVM and the Python workers (Linux /proc; 0 elsewhere). Less sensitive to other agents' load than wall time."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(d.name)] = int(f[1])
        ticks[int(d.name)] = sum(int(x) for x in f[11:15])  # utime stime cutime cstime
    me, total = os.getpid(), 0
    for pid in ticks:
        p, seen = pid, 0
        while p != me and p in parents and seen < 64:
            p, seen = parents[p], seen + 1
        if p == me:
            total += ticks[pid]
    return total / os.sysconf("SC_CLK_TCK")


def plot(png: str, files: list[str]) -> None:
    """Epoch time and checkpoint bytes vs state size, per storage (one --out file each) and mode."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for f in files:
        data = json.loads(Path(f).read_text())
        storage = data.get("_storage", "file://")
        for mode, res in data.items():
            if mode.startswith("_"):
                continue
            es = res["epochs"][1:]  # epoch 0 includes the JVM start
            mb = [e["bytes"] / 1e6 for e in es]
            ls = {"incremental": "-", "rocksdb": "-."}.get(mode, "--")
            ax_t.plot(mb, [e["epoch_s"] for e in es], ls, marker=".", label=f"{mode}, {storage}")
            if storage == "file://" or len(files) == 1:
                ax_b.plot(mb, [e["persisted_bytes"] / 1e6 for e in es], ls, marker=".", label=f"{mode}")
    ax_t.set(xlabel="state size (MB, Parquet)", ylabel="epoch time (s)", title="epoch time vs state size")
    ax_b.set(xlabel="state size (MB, Parquet)", ylabel="MB written by the checkpoint",
             title="checkpoint bytes vs state size")
    for ax in (ax_t, ax_b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def med(xs: list[float]) -> float:
    """The median (the mean of the middle two for an even count)."""
    v = sorted(xs)
    if not v:
        return float("nan")
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def theil_sen_ratio(es: list[dict], key: str) -> float:
    """The fitted cost of the last epoch's state over the first's: a line through (state rows, ``key``) by the
    Theil-Sen estimator (median of the pairwise slopes, robust to the outliers a shared machine adds), read at the
    largest and the smallest state."""
    pts = [(e["state_rows"], e[key]) for e in es if e.get(key) is not None]
    if len(pts) < 3:
        return float("nan")
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(pts) for x2, y2 in pts[i + 1:] if x2 != x1]
    b = med(slopes)
    a = med([y - b * x for x, y in pts])
    lo, hi = min(x for x, _ in pts), max(x for x, _ in pts)
    return (a + b * hi) / (a + b * lo) if a + b * lo > 0 else float("nan")


def summarize(es: list[dict]) -> dict:
    """Early/late medians (epoch 0 left out: it starts the JVM), of all epochs and of the epochs that wrote a delta
    or a base (``materialised``: the checkpoint wrote its full size), wall and CPU, and the Theil-Sen ratios."""
    es = es[1:]
    k = max(1, len(es) // 4)
    first, last = es[:k], es[-k:]
    mat = [e for e in es if e["persisted_bytes"] >= 0.9 * e["bytes"]]
    dl = [e for e in es if e["persisted_bytes"] < 0.9 * e["bytes"]]
    out: dict = {"k": k, "rows_first": first[0]["state_rows"], "rows_last": last[-1]["state_rows"]}
    for key in ("epoch_s", "cpu_s"):
        if any(e.get(key) is None for e in es):
            continue
        out[f"{key}_first"] = med([e[key] for e in first])
        out[f"{key}_last"] = med([e[key] for e in last])
        out[f"{key}_ratio"] = out[f"{key}_last"] / out[f"{key}_first"]
        dk = max(1, len(dl) // 4)
        out[f"{key}_delta_first"] = med([e[key] for e in dl[:dk]])
        out[f"{key}_delta_last"] = med([e[key] for e in dl[-dk:]])
        out[f"{key}_delta_ratio"] = out[f"{key}_delta_last"] / out[f"{key}_delta_first"]
        out[f"{key}_materialising"] = [e[key] for e in mat]
        out[f"{key}_theil_sen_ratio"] = theil_sen_ratio(es, key)
    out["persisted_last"] = sum(e["persisted_bytes"] for e in last) / max(1, sum(e["bytes"] for e in last))
    out["persisted_delta_epochs"] = med([e["persisted_bytes"] / e["bytes"] for e in dl]) if dl else None
    loads = [e["load1"] for e in es if e.get("load1") is not None]
    out["load1_min_med_max"] = [min(loads), med(loads), max(loads)] if loads else None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--events", type=int, default=10_000, help="new events per epoch (all partitions)")
    ap.add_argument("--users", type=int, default=2_000)
    ap.add_argument("--modes", default="", help="comma-separated: full, incremental, rocksdb "
                    "(default: full,incremental; with --backend rocksdb: incremental,rocksdb)")
    ap.add_argument("--backend", choices=("heap", "rocksdb"), default="heap",
                    help="rocksdb: also run PIPELINE_STATE_BACKEND=rocksdb (mode 'rocksdb', incremental snapshots)")
    ap.add_argument("--out", default="", help="write all results as JSON here")
    ap.add_argument("--repeat", type=int, default=1, help="run each mode this many times (fresh processes); "
                    "the summary gives each run's ratios and their median")
    ap.add_argument("--work", default="")
    ap.add_argument("--s3", action="store_true", help="checkpoints on a moto S3 server (child process)")
    ap.add_argument("--plot", nargs="+", metavar=("PNG", "JSON"), help="plot earlier --out files into PNG")
    ap.add_argument("_child", nargs="?")
    ap.add_argument("--mode", default="")
    ap.add_argument("--run", default="")
    ap.add_argument("--s3-root", default="")
    args = ap.parse_args()
    if args._child == "_child":
        child(args)
        return
    if args.plot:
        plot(args.plot[0], args.plot[1:])
        return
    if not args.modes:
        args.modes = "incremental,rocksdb" if args.backend == "rocksdb" else "full,incremental"
    work = Path(args.work or tempfile.mkdtemp(prefix="state-growth-"))
    generate(work / "src", args.epochs, args.events, args.users)
    results: dict = {}
    moto = None
    extra_env: dict[str, str] = {}
    if args.s3:
        from pipeline.testing.moto_server import spawn_moto_server
        moto = spawn_moto_server(["state-growth"])
        extra_env = moto.env()
    storage = "s3 (moto)" if args.s3 else "file://"
    repeats: dict[str, list[dict]] = {}
    try:
        for rep in range(args.repeat):
            for mode in args.modes.split(","):
                run = f"{mode}-{rep}" if args.repeat > 1 else mode
                env = {**os.environ, **extra_env, "PYTHONPATH": str(REPO),
                       "PIPELINE_STATE_CACHE_DIR": str(work / run / "cache")}
                if mode == "full":
                    env["PIPELINE_STATE_CACHE_MAX_BYTES"] = "0"
                out = work / f"{run}.json"
                t0 = time.perf_counter()
                subprocess.run([sys.executable, __file__, "_child", "--mode", mode, "--run", run,
                                "--epochs", str(args.epochs),
                                "--work", str(work), "--out", str(out),
                                "--s3-root", "s3://state-growth/run" if args.s3 else ""], env=env, check=True)
                res = json.loads(out.read_text())
                res = {"wall_s": round(time.perf_counter() - t0, 1), **res}
                res["summary"] = summarize(res["epochs"])
                repeats.setdefault(mode, []).append(res)
                if rep == 0:
                    results[mode] = res
    finally:
        if moto is not None:
            moto.stop()
    modes = list(results)
    print(f"{args.epochs} epochs x {args.events} new events, {args.users} users, parallelism 2, {storage}")
    print("epoch  state_rows | " + " | ".join(f"{m}: epoch_s  persisted/full bytes (deltas)" for m in modes))
    n = len(results[modes[0]]["epochs"])
    for i in range(n):
        cells = []
        for m in modes:
            e = results[m]["epochs"][i]
            cells.append(f"{m}: {e['epoch_s']:6.2f}  {e['persisted_bytes']:>10,}/{e['bytes']:>10,} ({e['max_chain_deltas']})")
        print(f"{i:5d}  {results[modes[0]]['epochs'][i]['state_rows']:>10,} | "
              + " | ".join(cells))
    for m in modes:
        for i, res in enumerate(repeats[m]):
            sm = res["summary"]
            k = sm["k"]
            line = [f"{m} run {i}: state {sm['rows_first']:,} -> {sm['rows_last']:,} rows"]
            for key, unit in (("epoch_s", "wall"), ("cpu_s", "CPU")):
                if f"{key}_first" not in sm:
                    continue
                line.append(f"{unit}: median {sm[key + '_first']:.2f} s (epochs 1-{k}) -> {sm[key + '_last']:.2f} s "
                            f"(last {k}) = {sm[key + '_ratio']:.2f}x; delta epochs {sm[key + '_delta_ratio']:.2f}x; "
                            f"Theil-Sen fit {sm[key + '_theil_sen_ratio']:.2f}x; materialising epochs "
                            f"{', '.join(f'{v:.1f}' for v in sm[key + '_materialising'])} s")
            line.append(f"persisted in the last {k}: {sm['persisted_last']:.1%} of full (delta epochs: median "
                        f"{(sm['persisted_delta_epochs'] or 0):.1%}); load average (1 min) min/median/max "
                        f"{sm['load1_min_med_max']}; process wall {res['wall_s']} s; Python workers' peak RSS "
                        f"{max(res['workers_peak_rss'], default=0) / 2**20:.0f} MiB (JVM "
                        f"{max(res.get('jvm_peak_rss') or [0]) / 2**20:.0f} MiB)")
            print("\n    ".join(line))
        if len(repeats[m]) > 1:
            for key in ("epoch_s_ratio", "epoch_s_delta_ratio", "epoch_s_theil_sen_ratio", "cpu_s_ratio",
                        "cpu_s_delta_ratio", "cpu_s_theil_sen_ratio"):
                vals = [r["summary"].get(key) for r in repeats[m] if r["summary"].get(key) is not None]
                if vals:
                    print(f"{m}: {key} over {len(vals)} runs: {', '.join(f'{v:.2f}' for v in vals)} "
                          f"(median {med(vals):.2f})")
    if args.out:
        Path(args.out).write_text(json.dumps({**results, "_storage": storage, "_repeats": repeats}, indent=1))


if __name__ == "__main__":
    main()
