#!/usr/bin/env python3
"""Alignment-mode benchmark: aligned vs unaligned vs aligned-with-timeout vs at-least-once under a backlog.

    .venv/bin/python benchmarks/alignment_bench.py                 # defaults below, ~5-15 min on 2 cores
    .venv/bin/python benchmarks/alignment_bench.py --orders 300 --burst 2400 --max-records 600   # quicker

Scenario (the backlog scenario of ``tests/scenarios``): the demo data (``pipeline.demo.generate``) plus a
burst of unpaid orders in a new ``orders`` partition inside one epoch (``pipeline.testing.scenarios``),
``--burst`` rows against ``PIPELINE_MAX_RECORDS_PER_EPOCH=--max-records`` per input per round, so that
partition needs several rounds to reach its barrier while every other channel reaches it at once.

Every mode runs the same data in this process (one SparkSession, warmed up first; each run gets fresh
checkpoint and sink roots and waits for a quiet CPU first), ``--repeat`` times round-robin; the fastest run
of each mode is reported (a shared machine only slows runs down). Every run is checked against the oracle.
Figures:

* **checkpoint latency, rounds**: rounds a checkpoint took from trigger to ``_metadata`` (max over checkpoints);
* **latency, epochs behind**: with one round per epoch interval (one DAG run per epoch), how many epochs after
  its epoch ended a checkpoint completes: ``rounds run so far - epochs since the first`` (max over the data's
  epochs). 0 = on time;
* **latency, s**: trigger to ``_metadata`` of the slowest checkpoint, wall-clock (this machine);
* **throughput**: source records / wall time of the whole run (all rounds, checkpoints, commits);
* **bytes persisted**: sum over checkpoints of state + channel-state bytes, and the in-flight part.

Writes ``docs/img/alignment_modes.png`` (matplotlib) and the table into ``docs/alignment.md`` (between the
``alignment-bench`` markers), and prints everything.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODES = {
    "aligned": dict(checkpoint_mode="exactly_once", unaligned=False),
    "unaligned": dict(checkpoint_mode="exactly_once", unaligned=True, aligned_timeout_seconds=0.0),
    "aligned+timeout": dict(checkpoint_mode="exactly_once", unaligned=True),   # timeout from --timeout
    "at_least_once": dict(checkpoint_mode="at_least_once", unaligned=False),
}
BEGIN, END = "<!-- alignment-bench:begin -->", "<!-- alignment-bench:end -->"


def say(msg: str) -> None:
    print(f"[alignment-bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def busy_fraction(window_s: float = 2.0) -> float:
    """Share of all cores busy over ``window_s`` (from /proc/stat)."""
    def jiffies() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
        return sum(v) - v[3] - v[4], sum(v)
    b0, t0 = jiffies()
    time.sleep(window_s)
    b1, t1 = jiffies()
    return (b1 - b0) / max(1, t1 - t0)


def wait_quiet(gate: float, max_wait: float) -> float:
    t0, n = time.time(), 0
    while True:
        f = busy_fraction()
        if f < gate or time.time() - t0 > max_wait:
            return f
        if n % 10 == 0:
            say(f"  waiting for a quiet CPU ({100 * f:.0f}% busy, gate {100 * gate:.0f}%)")
        n += 1


def run_mode(name: str, a: argparse.Namespace, src: str, work: str, exp) -> dict:
    from pipeline.config import load_config
    from pipeline.demo import oracle
    from pipeline.fileio import file_io_for
    from pipeline.jobs.orders_payments import build_job
    from pipeline.runtime.driver.runner import JobRunner
    from pipeline.sink.table import CommittedTable
    kw = dict(MODES[name])
    if name == "aligned+timeout":
        kw["aligned_timeout_seconds"] = a.timeout
    root = Path(work) / name.replace("+", "_")
    cfg = load_config(env={}, source_uri=src, checkpoint_uri=(root / "ckpt").as_uri(),
                      sink_uri=(root / "sink").as_uri(), parallelism=a.parallelism,
                      max_records_per_epoch=a.max_records, retained_checkpoints=100_000, **kw)
    runner = JobRunner(build_job(), cfg, echo=lambda m: None)
    busy_before = wait_quiet(a.quiet_gate, a.quiet_max_wait)
    c0 = _cpu_jiffies()
    t0 = time.perf_counter()
    rep = runner.run()
    wall = time.perf_counter() - t0
    c1 = _cpu_jiffies()
    mds = sorted((cp.metadata for cp in runner.coordinator.store.list()), key=lambda m: m.checkpoint_id)
    sink = cfg.sink_uri
    got = {t: CommittedTable(file_io_for(sink), sink, "orders_payments", t).read()
           for t in ("paid_orders", "merchant_revenue")}
    cmp = oracle.compare(exp, got)
    records = sum(sum(r.records.values()) for r in rep.rounds)
    first = mds[0].epoch if mds else 0
    cps, done_rounds, behind = [], 0, []
    last_data_epoch = first + a.epochs - 1
    for md in mds:
        al = dict(md.extra.get("alignment") or {})
        join = md.stats.operators.get("paid_orders_join")
        done_rounds += md.stats.rounds
        if md.epoch <= last_data_epoch:
            behind.append(max(0, (done_rounds - 1) - (md.epoch - first)))
        cps.append({"id": md.checkpoint_id, "epoch": md.epoch - first, "rounds": md.stats.rounds,
                    "duration_ms": md.stats.duration_ms, "mode": al.get("mode_used"),
                    "alignment_ms": al.get("alignment_ms", 0.0), "bytes": md.stats.bytes,
                    "inflight_bytes": join.inflight_bytes if join else 0,
                    "post_barrier": sum((al.get("post_barrier_records") or {}).values())})
    paid = cmp.tables["paid_orders"]
    return {
        "mode": name, "config": {k: v for k, v in kw.items()}, "wall_s": round(wall, 2), "records": records,
        "events_per_s": round(records / wall, 1) if wall else None, "rounds": len(rep.rounds),
        "checkpoints": len(mds), "latency_rounds_max": max((c["rounds"] for c in cps), default=0),
        "latency_epochs_max": max(behind, default=0), "latency_s_max": round(max((c["duration_ms"] for c in cps),
                                                                                   default=0) / 1000, 2),
        "bytes_persisted": sum(c["bytes"] for c in cps), "inflight_bytes": sum(c["inflight_bytes"] for c in cps),
        "modes_used": sorted({c["mode"] for c in cps if c["mode"]}),
        "correct": cmp.ok, "duplicates": paid.duplicates, "missing": paid.missing,
        "busy_before": round(busy_before, 2), "machine_busy": round(_busy(c0, c1), 2), "per_checkpoint": cps,
    }


def _cpu_jiffies() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4], sum(v)


def _busy(c0: tuple[int, int], c1: tuple[int, int]) -> float:
    return (c1[0] - c0[0]) / max(1, c1[1] - c0[1])


def table(results: list[dict]) -> list[str]:
    lines = ["| mode | modes used | checkpoints | rounds | latency (rounds, max) | epochs behind (max) | "
             "latency s (max) | throughput (events/s) | bytes persisted | of which in-flight | correct |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        ok = "yes (exact)" if r["correct"] else (
            f"at least once: {r['duplicates']} dup" if r["missing"] == 0 else f"NO ({r['missing']} missing)")
        lines.append(f"| {r['mode']} | {', '.join(r['modes_used'])} | {r['checkpoints']} | {r['rounds']} | "
                     f"{r['latency_rounds_max']} | {r['latency_epochs_max']} | {r['latency_s_max']:.1f} | "
                     f"{r['events_per_s']:.0f} | {r['bytes_persisted'] / 1024:.0f} KiB | "
                     f"{r['inflight_bytes'] / 1024:.0f} KiB | {ok} |")
    return lines


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    colors = {"aligned": "#1f77b4", "unaligned": "#2ca02c", "aligned+timeout": "#ff7f0e", "at_least_once": "#d62728"}
    for r in results:
        xs = [c["epoch"] for c in r["per_checkpoint"]]
        ax[0][0].plot(xs, [c["rounds"] for c in r["per_checkpoint"]], marker="o", label=r["mode"],
                      color=colors.get(r["mode"]))
        ax[0][1].plot(xs, [c["duration_ms"] / 1000 for c in r["per_checkpoint"]], marker="o", label=r["mode"],
                      color=colors.get(r["mode"]))
    ax[0][0].set(title="checkpoint completion latency (rounds)", xlabel="checkpoint epoch (relative)",
                 ylabel="rounds from trigger to _metadata")
    ax[0][1].set(title="checkpoint completion latency (seconds)", xlabel="checkpoint epoch (relative)",
                 ylabel="seconds, trigger to _metadata")
    names = [r["mode"] for r in results]
    ax[1][0].bar(names, [r["events_per_s"] for r in results], color=[colors.get(n) for n in names])
    ax[1][0].set(title="throughput (source records / wall time)", ylabel="events/s")
    state = [(r["bytes_persisted"] - r["inflight_bytes"]) / 1024 for r in results]
    infl = [r["inflight_bytes"] / 1024 for r in results]
    ax[1][1].bar(names, state, label="operator state", color="#7f7f7f")
    ax[1][1].bar(names, infl, bottom=state, label="in-flight (channel state files)", color="#2ca02c")
    ax[1][1].set(title="bytes persisted, all checkpoints", ylabel="KiB")
    ax[0][0].legend()
    ax[1][1].legend(loc="lower right", framealpha=0.9)
    for a_ in ax.flat:
        a_.grid(alpha=0.3)
        for lab in a_.get_xticklabels():
            lab.set_fontsize(8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def write_markdown(path: Path, lines: list[str], meta: str) -> None:
    text = path.read_text() if path.exists() else f"# Barrier alignment modes\n\n{BEGIN}\n{END}\n"
    block = f"{BEGIN}\n{meta}\n\n" + "\n".join(lines) + f"\n\n![alignment modes](img/alignment_modes.png)\n{END}"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--orders", type=int, default=1000, help="orders per epoch (2 partitions)")
    ap.add_argument("--burst", type=int, default=8000, help="burst of orders in one epoch, in its own partition")
    ap.add_argument("--burst-epoch", type=int, default=2)
    ap.add_argument("--max-records", type=int, default=2000, help="PIPELINE_MAX_RECORDS_PER_EPOCH")
    ap.add_argument("--timeout", type=float, default=1.0, help="PIPELINE_ALIGNED_TIMEOUT_SECONDS for aligned+timeout")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--repeat", type=int, default=2, help="runs per mode; the fastest is reported")
    ap.add_argument("--quiet-gate", type=float, default=0.6)
    ap.add_argument("--quiet-max-wait", type=float, default=60.0)
    ap.add_argument("--work", default=None, help="work directory (default: a temp dir, removed)")
    ap.add_argument("--no-docs", action="store_true", help="do not write docs/alignment.md and the PNG")
    a = ap.parse_args(argv)
    from pipeline.demo import oracle
    from pipeline.demo.generate import generate
    from pipeline.runtime.spark.session import get_spark
    from pipeline.testing.scenarios import write_burst
    work = a.work or tempfile.mkdtemp(prefix="alignment-bench-")
    src = (Path(work) / "src").as_uri()
    if not (Path(work) / "src" / "_generator.json").exists():
        generate(src, epochs=a.epochs, partitions=2, orders_per_epoch=a.orders, seed=77)
        write_burst(src, r=a.burst_epoch, rows=a.burst)
    exp = oracle.expected(src)
    say(f"data: {a.epochs} epochs x {a.orders} orders (2 partitions) + burst of {a.burst} orders in epoch "
        f"{a.burst_epoch}; max records per input per round {a.max_records}; parallelism {a.parallelism}")
    get_spark("local[*]", a.parallelism)
    warm = run_mode("aligned", argparse.Namespace(**{**vars(a), "quiet_max_wait": 0}), src,
                    str(Path(work) / "warmup"), exp)  # JVM / Python workers warm: not measured
    say(f"warm-up done ({warm['wall_s']} s)")
    names = [m.strip() for m in a.modes.split(",") if m.strip()]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(a.repeat):  # round-robin, so that a noisy minute does not hit one mode only
        for name in names:
            say(f"mode {name} (run {rep + 1}/{a.repeat}) ...")
            r = run_mode(name, a, src, str(Path(work) / f"run{rep}"), exp)
            say(f"  {r['rounds']} rounds, {r['checkpoints']} checkpoints, {r['wall_s']} s, {r['events_per_s']} "
                f"events/s, latency max {r['latency_rounds_max']} rounds / {r['latency_epochs_max']} epochs behind / "
                f"{r['latency_s_max']} s, persisted {r['bytes_persisted']} B (in-flight {r['inflight_bytes']} B), "
                f"modes {r['modes_used']}, correct {r['correct']}, machine busy {100 * r['machine_busy']:.0f}%")
            runs[name].append(r)
    # the fastest run of each mode (the shared machine only ever slows a run down); every run is kept in the JSON
    results = [dict(min(runs[n], key=lambda r: r["wall_s"]), walls=[r["wall_s"] for r in runs[n]]) for n in names]
    lines = table(results)
    print("\n".join(lines))
    busy = ", ".join(f"{100 * r['machine_busy']:.0f}%" for r in results)
    meta = (f"Measured by `benchmarks/alignment_bench.py` on {time.strftime('%Y-%m-%d')}: {a.epochs} epochs x "
            f"{a.orders} orders (+ payments) in 2 partitions, a burst of {a.burst} unpaid orders in epoch "
            f"{a.burst_epoch} in a third `orders` partition, `PIPELINE_MAX_RECORDS_PER_EPOCH={a.max_records}`, "
            f"parallelism {a.parallelism}, aligned timeout {a.timeout} s, best of {a.repeat} runs per mode, "
            f"local Spark on {os.cpu_count()} cores (shared machine: busy {busy} of all cores during the runs, ours included). "
            "Every run is checked against the oracle.")
    if not a.no_docs:
        plot(results, REPO / "docs" / "img" / "alignment_modes.png",
             f"backlog: burst of {a.burst} orders vs {a.max_records} records/input/round")
        write_markdown(REPO / "docs" / "alignment.md", lines, meta)
        say("wrote docs/img/alignment_modes.png and docs/alignment.md")
    out = Path(work) / "alignment-bench.json"
    out.write_text(json.dumps({"args": vars(a), "results": results, "all_runs": runs}, indent=1, default=str))
    say(f"results: {out}")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["correct"] or (r["mode"] == "at_least_once" and r["missing"] == 0) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
