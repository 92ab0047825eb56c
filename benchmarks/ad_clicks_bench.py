#!/usr/bin/env python3
"""Three-way benchmark of the second example job ``ad_clicks``: Epochal vs a one-shot Spark batch vs Spark
Structured Streaming, same data, each compared with the job's independent oracle (``pipeline.demo.ad_oracle``).

    .venv/bin/python benchmarks/ad_clicks_bench.py --events 100000          # ~100k events, 12 epochs x 4 partitions
    .venv/bin/python benchmarks/ad_clicks_bench.py --events 3000 --systems oneshot,sss --no-doc   # smoke size

The job (``pipeline.jobs.ad_clicks``): clicks deduplicated on ``click_id`` (1 h), joined many-to-many with
impressions on (user, ad), then per campaign and 5-minute event-time window: distinct clicks, distinct clicked
impressions and attribution pairs (``campaign_clicks``), and impressions and distinct users
(``campaign_impressions``); watermark = max event time - 30 s, allowed lateness 60 s, final emission.

Systems (each in a fresh process, one after the other; ``job s`` excludes JVM/session start):

* ``epochal``: ``python -m pipeline run --job ad_clicks --json`` (a checkpoint every epoch), started through
  ``throughput.py _epochal-child`` (session timed apart); output read with ``python -m pipeline export``.
* ``oneshot``: one Spark batch job written here (``_oneshot-child``): every file at once, the oracle's semantics
  in Spark SQL (first copy of a click by ``_ingest_ts``; every pair, in the later of its two epochs; the
  watermark of each epoch from the per-(epoch, channel) maxima, a table of a few hundred rows computed on the
  driver; late rows and unfired windows left out; exact ``count(DISTINCT)``). The practical upper bound.
* ``sss``: Spark Structured Streaming written here (``_sss-child``). Each epoch's files are hard-linked into the
  query's input directories, then ``processAllAvailable()``: one micro-batch per epoch, as Epochal's rounds.
  Two queries in one session:
  ``campaign_impressions``: impressions ``withWatermark(event_time, 90 s)`` -> ``groupBy(window, campaign,
  user_id).count()`` -> ``groupBy(window, campaign).agg(count, sum)`` (chained stateful operators, append);
  ``campaign_clicks``: clicks ``dropDuplicates(click_id)`` -> stream-stream inner join with impressions on
  ``view_key`` (many-to-many) -> ``withWatermark(click_time, 90 s)``
  -> ``groupBy(window(click_time), campaign, click_id).agg(count, collect_set(impression_id))``
  -> ``groupBy(window, campaign).agg(count, sum, size(array_distinct(flatten(collect_list))))``: exact distinct
  counts without ``count(DISTINCT)`` (which streaming aggregations reject).
  Watermark delay 90 s = out-of-orderness 30 s + lateness 60 s, so a window is emitted and later rows are
  dropped at the same event-time points as in the job.
  Why no watermark before the join: every stateful operator drops its *input* rows behind the watermark, so a
  watermarked dedup or join drops late impressions and clicks that the job still pairs (the job judges
  lateness on the pair's click time only). Without it the dedup and join state are unbounded (the job's join has
  no TTL either; its dedup forgets a click after 1 h, which data spanning less than 1 h never reaches).
  ``--sss-join-range-minutes R`` instead watermarks both inputs (``dropDuplicates`` still before) and adds
  ``click_time BETWEEN imp_time -/+ R min``: bounded join state, but Spark holds the join's output watermark
  back by R (no window fires for R minutes of event time) and pairs further apart than R are lost.
  What SSS cannot express, and so may differ: its watermark is one global value per query (impressions: the
  max over all partitions, not Flink's per-partition minimum with idle partitions skipped); the click copy
  that passes deduplication is the first *in the micro-batch*, not the first by ``_ingest_ts``; late rows are
  dropped silently (no dead-letter output). The comparison reports, per table, how many of the oracle's rows
  each system reproduces exactly, and per column how many values agree on the windows both emitted.

Every run records events, job s, events/s, the ratio to one-shot, the process tree's CPU seconds, the
foreign CPU (other processes' share of the machine during the run) and the load average. The table goes to
stdout, to ``bench-results/ad-clicks-*.json`` and (unless ``--no-doc``) into docs/performance.md between
markers.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import throughput as tp  # noqa: E402  (sibling module: the process-tree CPU monitor and the Epochal child)
from bench_data import read_files, resolve_committed  # noqa: E402
from bench_machine import NCPU, run_monitored, say  # noqa: E402

REPO = tp.REPO
JOB = "ad_clicks"
TABLES = ("campaign_clicks", "campaign_impressions")
DOC_BEGIN = "<!-- ad-bench:begin events={events} -->"
DOC_END = "<!-- ad-bench:end events={events} -->"
US = 1_000_000


# ------------------------------------------------------------------------------------------------- data
def gen_config(a: argparse.Namespace) -> dict:
    # clicks ~ 16% of impressions (12% clicked + 2% orphans, 15% of them re-sent)
    imps = max(a.epochs, int(a.events / 1.16) // a.epochs)
    # users x ads ~ impressions / 8: each (user, ad) is seen ~8 times, so the join stays many-to-many with
    # ~1 pair per click-impression instead of growing with the square of the data
    ads = 24
    users = max(60, (imps * a.epochs) // (8 * ads))
    return {"epochs": a.epochs, "partitions": a.partitions, "impressions_per_epoch": imps, "users": users,
            "ads": ads, "seed": a.seed, "epoch_seconds": a.epoch_seconds}


def prepare_data(a: argparse.Namespace) -> tuple[str, dict]:
    from pipeline.demo.ad_generate import generate_ads
    g = gen_config(a)
    name = "ads-" + "-".join(f"{k[:3]}{v}" for k, v in sorted(g.items()))
    root = os.path.join(a.workdir, "data", name)
    marker = os.path.join(root, "_bench_generated.json")
    if os.path.exists(marker):
        info = json.loads(Path(marker).read_text())
        say(f"data: reusing {root} ({info['rows']})")
        return root, info
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    t = time.time()
    say(f"data: generating {g['impressions_per_epoch'] * a.epochs} impressions (+ clicks), {a.epochs} epochs x "
        f"{a.partitions} partitions, {g['users']} users x {g['ads']} ads into {root} ...")
    info = generate_ads("file://" + root, epochs=g["epochs"], epoch_seconds=g["epoch_seconds"],
                        partitions=g["partitions"], impressions_per_epoch=g["impressions_per_epoch"],
                        users=g["users"], ads=g["ads"], seed=g["seed"])
    info["config"] = g
    info["gen_s"] = round(time.time() - t, 1)
    with open(marker, "w") as f:
        json.dump(info, f)
    say(f"data: {info['rows']} in {info['files']} files, {info['gen_s']}s")
    return root, info


def file_epochs(root: str, epoch_seconds: int) -> list[tuple[int, str, str]]:
    """(epoch, source, path) of every non-empty source file; epoch from the Parquet statistics of _ingest_ts."""
    import pyarrow.parquet as pq
    out = []
    for source in ("impressions", "clicks"):
        base = os.path.join(root, source)
        for d, _, files in os.walk(base):
            for f in sorted(files):
                if not f.endswith(".parquet"):
                    continue
                path = os.path.join(d, f)
                md = pq.ParquetFile(path).metadata
                if md.num_rows == 0:
                    continue
                col = md.schema.to_arrow_schema().get_field_index("_ingest_ts")
                lo = min(md.row_group(i).column(col).statistics.min for i in range(md.num_row_groups))
                us = int(lo.timestamp() * US) if hasattr(lo, "timestamp") else int(lo)
                out.append((us // (epoch_seconds * US), source, path))
    return sorted(out)


# ------------------------------------------------------------------------------------------------- oracle
def verify(exp, clicks_dir: str, imps_dir: str, files_clicks: list[str] | None = None,
           files_imps: list[str] | None = None) -> dict:
    """Exact comparison (the oracle's ``compare_ad_output``) plus, per table, rows reproduced exactly and per
    column the agreement on rows whose (campaign, window) both sides emitted."""
    import pandas as pd

    from pipeline.demo.ad_oracle import _rows, compare_ad_output
    rep: dict[str, Any] = {}
    try:
        got = {"campaign_clicks": read_files(files_clicks) if files_clicks is not None
               else _read_dir(clicks_dir),
               "campaign_impressions": read_files(files_imps) if files_imps is not None
               else _read_dir(imps_dir)}
    except Exception as e:  # noqa: BLE001 - an unreadable output is a wrong output
        return {"correct": False, "error": f"{type(e).__name__}: {e}"}
    exact_dirs = {}
    for name, t in got.items():
        d = os.path.join(os.path.dirname(clicks_dir), f"_resolved_{name}")
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        import pyarrow.parquet as pq
        pq.write_table(t, os.path.join(d, "part.parquet"))
        exact_dirs[name] = d
    cmp = compare_ad_output(exp, exact_dirs["campaign_clicks"], exact_dirs["campaign_impressions"])
    rep["correct"] = bool(cmp["ok"])
    keys = ["campaign_id", "window_start", "window_end"]
    for name, want in (("campaign_clicks", exp.campaign_clicks), ("campaign_impressions", exp.campaign_impressions)):
        g = got[name].to_pandas()[list(want.columns)]
        w_rows, g_rows = set(_rows(want)), _rows(g)
        entry: dict[str, Any] = {k: cmp[name][k] for k in ("expected", "got", "missing", "extra", "duplicates")}
        entry["rows_exact"] = len(w_rows & set(g_rows))
        wk = pd.DataFrame(_rows(want), columns=list(want.columns))
        gk = pd.DataFrame(sorted(set(g_rows)), columns=list(want.columns))
        m = wk.merge(gk, on=keys, suffixes=("_want", "_got"))
        entry["windows_both"] = len(m)
        entry["columns_agree"] = {c: int((m[c + "_want"] == m[c + "_got"]).sum())
                                  for c in want.columns if c not in keys}
        rep[name] = entry
    return rep


def _read_dir(path: str):
    files, _ = resolve_committed(path)
    return read_files(files)


# ------------------------------------------------------------------------------------------------- systems
def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_epochal(a: argparse.Namespace, exp, root: str, events: int) -> dict:
    work = os.path.join(a.run_dir, "epochal")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = tp._base_env()
    env.update({"PIPELINE_SOURCE_URI": "file://" + root, "PIPELINE_CHECKPOINT_URI": "file://" + work + "/checkpoints",
                "PIPELINE_SINK_URI": "file://" + work + "/sinks", "PIPELINE_PARALLELISM": str(a.parallelism),
                "PIPELINE_EPOCH_SECONDS": str(a.epoch_seconds)})
    cmd = [tp._python(), os.path.join(os.path.dirname(os.path.abspath(__file__)), "throughput.py"), "_epochal-child",
           "--", "run", "--job", JOB, "--json"]
    load0 = _loadavg()
    r = run_monitored(cmd, env, label="epochal", echo=tp._progress_echo(), cwd=work)
    load1 = _loadavg()
    if r.returncode != 0:
        raise RuntimeError(f"epochal: run failed (rc {r.returncode}):\n" + "\n".join(r.stderr[-40:]))
    rep = json.loads(r.stdout)
    marks = tp._child_marks(r.stderr)
    rounds = rep["rounds"]
    processed = sum(sum(x["records"].values()) for x in rounds)
    res: dict[str, Any] = {"system": "epochal", "session_s": marks.get("session_s"), "job_s": marks.get("run_s"),
                           "proc_s": round(r.wall_s, 3), "rounds": len(rounds),
                           "checkpoints": sum(1 for x in rounds if x["completed"]), "events_processed": processed,
                           "load_before": load0, "load_after": load1, **r.cpu}
    out = os.path.join(work, "export")
    for t in TABLES:
        tp._cli(env, ["export", "--job", JOB, "--table", t, "--to", os.path.join(out, t), "--json"], "epochal")
    res["verify"] = verify(exp, os.path.join(out, "campaign_clicks"), os.path.join(out, "campaign_impressions"))
    if processed != events:
        res["verify"]["correct"] = False
        res["verify"]["error"] = f"processed {processed} events, the sources hold {events}"
    res["correct"] = bool(res["verify"]["correct"])
    if not a.keep_runs:
        shutil.rmtree(work, ignore_errors=True)
    return res


def run_peer(a: argparse.Namespace, exp, root: str, system: str, last_epoch: int) -> dict:
    work = os.path.join(a.run_dir, system)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    out = os.path.join(work, "out")
    cmd = [tp._python(), os.path.abspath(__file__), f"_{system}-child", "--root", root, "--out", out,
           "--work", work, "--epoch-seconds", str(a.epoch_seconds), "--through-epoch", str(last_epoch),
           "--shuffle-partitions", str(a.shuffle_partitions),
           "--join-range-minutes", str(a.sss_join_range_minutes)]
    env = tp._base_env()
    load0 = _loadavg()
    r = run_monitored(cmd, env, label=system,
                         echo=lambda l: l.startswith(("PROGRESS", "Traceback")) or "Exception" in l[:120])
    load1 = _loadavg()
    res = next((json.loads(l[7:]) for l in r.stdout.splitlines() if l.startswith("RESULT ")), None)
    if r.returncode != 0 or res is None:
        raise RuntimeError(f"{system} failed (rc {r.returncode}):\n" + "\n".join(r.stderr[-40:]))
    res["system"] = "spark structured streaming" if system == "sss" else "one-shot spark batch"
    res.update(proc_s=round(r.wall_s, 3), load_before=load0, load_after=load1, **r.cpu)
    fc, _ = resolve_committed(os.path.join(out, "campaign_clicks"))
    fi, _ = resolve_committed(os.path.join(out, "campaign_impressions"))
    res["verify"] = verify(exp, os.path.join(out, "campaign_clicks"), os.path.join(out, "campaign_impressions"),
                           fc, fi)
    res["correct"] = bool(res["verify"]["correct"])
    if not a.keep_runs:
        shutil.rmtree(work, ignore_errors=True)
    return res


# ------------------------------------------------------------------------------------- Spark children
def _spark(shuffle_partitions: int):
    t0 = time.perf_counter()
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[2]").appName("ad-clicks-bench")
             .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
             .config("spark.sql.session.timeZone", "UTC")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.range(1).count()
    print(f"BENCH_SESSION_READY {time.perf_counter() - t0:.3f}", file=sys.stderr, flush=True)
    return spark, time.perf_counter() - t0


def _schemas():
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType
    s, ts = StringType(), TimestampType()
    imps = StructType([StructField(n, s) for n in ("impression_id", "ad_id", "campaign_id", "user_id")]
                      + [StructField("event_time", ts), StructField("_ingest_ts", ts)])
    clicks = StructType([StructField(n, s) for n in ("click_id", "ad_id", "user_id")]
                        + [StructField("event_time", ts), StructField("_ingest_ts", ts)])
    return imps, clicks


def oneshot_child(a: argparse.Namespace) -> int:
    """The oracle's semantics as one Spark batch job over every file."""
    spark, session_s = _spark(a.shuffle_partitions)
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    t0 = time.perf_counter()
    E = a.epoch_seconds * US
    W, OOO, LATE = 300 * US, 30 * US, 60 * US
    imp_s, clk_s = _schemas()

    def load(source, schema):
        df = spark.read.schema(schema).option("recursiveFileLookup", "true").parquet(os.path.join(a.root, source))
        df = df.withColumn("_part", F.regexp_extract(F.input_file_name(), r"partition=(\d+)/", 1).cast("int"))
        return (df.withColumn("epoch", F.floor(F.unix_micros("_ingest_ts") / E).cast("long"))
                .withColumn("t_us", F.unix_micros("event_time")).where(F.col("epoch") <= a.through_epoch))
    imp = load("impressions", imp_s).withColumn("view_key", F.concat_ws("|", "user_id", "ad_id")).cache()
    clk = load("clicks", clk_s)
    first = (clk.withColumn("_rn", F.row_number().over(Window.partitionBy("click_id").orderBy("_ingest_ts")))
             .where("_rn = 1").withColumn("view_key", F.concat_ws("|", "user_id", "ad_id")))
    pairs = (imp.select("view_key", "impression_id", "campaign_id", F.col("epoch").alias("ie"))
             .join(first.select("view_key", "click_id", F.col("t_us").alias("t_us"), F.col("epoch").alias("ce")),
                   "view_key")
             .withColumn("epoch", F.greatest("ie", "ce")).withColumn("channel", F.lit(0)).cache())

    def windows(df, key_aggs):
        # watermark per epoch from the per-(epoch, channel) maxima: a few hundred rows, computed on the driver
        per = df.groupBy("epoch", "channel").agg(F.max("t_us").alias("m")).collect()
        by_epoch: dict[int, dict[int, int]] = {}
        for row in per:
            by_epoch.setdefault(int(row["epoch"]), {})[int(row["channel"])] = int(row["m"])
        chan_max: dict[int, int] = {}
        cur, prev, rows = None, None, []
        for m in sorted(by_epoch):
            for c, t in by_epoch[m].items():
                chan_max[c] = max(chan_max.get(c, t), t)
            cand = min(chan_max[c] for c in by_epoch[m]) - OOO
            cur = cand if cur is None else max(cur, cand)
            rows.append((m, prev))
            prev = cur
        final_wm = cur if cur is not None else -(2 ** 62)
        prev_df = spark.createDataFrame(rows, "epoch long, prev_wm long")
        d = (df.join(F.broadcast(prev_df), "epoch").withColumn("ws", F.floor(F.col("t_us") / W) * W)
             .withColumn("close", F.col("ws") + W + LATE))
        ontime = d.where(F.col("prev_wm").isNull() | (F.col("close") > F.col("prev_wm")))
        fired = ontime.where(F.col("close") <= F.lit(final_wm))
        return (fired.groupBy("campaign_id", "ws").agg(*key_aggs)
                .withColumn("window_start", F.timestamp_micros("ws"))
                .withColumn("window_end", F.timestamp_micros(F.col("ws") + W)).drop("ws"))
    clicks_out = windows(pairs, [F.countDistinct("click_id").alias("clicks"),
                                 F.countDistinct("impression_id").alias("clicked_impressions"),
                                 F.count(F.lit(1)).alias("attributions")])
    imps_out = windows(imp.withColumn("channel", F.col("_part")),
                       [F.count(F.lit(1)).alias("impressions"), F.countDistinct("user_id").alias("users")])
    clicks_out.write.mode("overwrite").parquet(os.path.join(a.out, "campaign_clicks"))
    print("PROGRESS campaign_clicks written", file=sys.stderr, flush=True)
    imps_out.write.mode("overwrite").parquet(os.path.join(a.out, "campaign_impressions"))
    job_s = time.perf_counter() - t0
    print(f"BENCH_RUN_DONE {job_s:.3f} rc=0", file=sys.stderr, flush=True)
    print("RESULT " + json.dumps({"session_s": round(session_s, 3), "job_s": round(job_s, 3)}), flush=True)
    spark.stop()
    return 0


def sss_child(a: argparse.Namespace) -> int:
    """Spark Structured Streaming: one micro-batch per epoch's files (hard-linked into the input directories)."""
    import pyspark
    spark, session_s = _spark(a.shuffle_partitions)
    from pyspark.sql import functions as F
    files = file_epochs(a.root, a.epoch_seconds)
    files = [f for f in files if f[0] <= a.through_epoch]
    stage = os.path.join(a.work, "stage")
    for s in ("impressions", "clicks"):
        os.makedirs(os.path.join(stage, s), exist_ok=True)
    t0 = time.perf_counter()
    imp_s, clk_s = _schemas()
    delay = "90 seconds"  # out-of-orderness 30 s + allowed lateness 60 s
    win = "5 minutes"
    rng = int(a.join_range_minutes)

    def stream(source, schema):
        return spark.readStream.schema(schema).parquet(os.path.join(stage, source))
    imps = stream("impressions", imp_s).withWatermark("event_time", delay)
    imp_windows = (imps.groupBy(F.window("event_time", win), "campaign_id", "user_id").agg(F.count(F.lit(1)).alias("n"))
                   .groupBy(F.window(F.window_time("window"), win), "campaign_id")
                   .agg(F.sum("n").alias("impressions"), F.count(F.lit(1)).alias("users")))
    # No watermark before the join by default: a stateful operator drops its input rows behind the watermark, so
    # a watermarked join would drop late impressions (and clicks older than the watermark but in an open window)
    # that the job still pairs; the job judges lateness on the pair's click time only. So: dedup without a
    # watermark (for data spanning less than the job's 1 h TTL the same result; unbounded state), a join without
    # one (like the job's join, which has no TTL), and the watermark on the pairs' click_time: max - 90 s, as the
    # job's single pairs channel. With a time range (--sss-join-range-minutes), both inputs need watermarks.
    ranged = rng > 0
    clicks = stream("clicks", clk_s).dropDuplicates(["click_id"])
    raw_views = stream("impressions", imp_s)
    if ranged:
        clicks, raw_views = clicks.withWatermark("event_time", delay), raw_views.withWatermark("event_time", delay)
    clicks = clicks.select(F.concat_ws("|", "user_id", "ad_id").alias("c_view_key"), "click_id",
                           F.col("event_time").alias("click_time"))
    views = raw_views.select(F.concat_ws("|", "user_id", "ad_id").alias("view_key"), "impression_id", "campaign_id",
                             F.col("event_time").alias("imp_time"))
    cond = "view_key = c_view_key" + (f" AND click_time BETWEEN imp_time - INTERVAL {rng} MINUTES "
                                      f"AND imp_time + INTERVAL {rng} MINUTES" if ranged else "")
    pairs = views.join(clicks, F.expr(cond))
    if not ranged:
        pairs = pairs.withWatermark("click_time", delay)
    click_windows = (pairs.groupBy(F.window("click_time", win), "campaign_id", "click_id")
                     .agg(F.count(F.lit(1)).alias("n"), F.collect_set("impression_id").alias("imps"))
                     .groupBy(F.window(F.window_time("window"), win), "campaign_id")
                     .agg(F.count(F.lit(1)).alias("clicks"),
                          F.size(F.array_distinct(F.flatten(F.collect_list("imps")))).alias("clicked_impressions"),
                          F.sum("n").alias("attributions")))

    def start(df, name, cols):
        out = df.select("campaign_id", F.col("window.start").alias("window_start"),
                        F.col("window.end").alias("window_end"), *[F.col(c).cast("long") for c in cols])
        return (out.writeStream.format("parquet").outputMode("append").queryName(name)
                .option("checkpointLocation", os.path.join(a.work, "checkpoint", name))
                .option("path", os.path.join(a.out, name)).start())
    queries = [start(imp_windows, "campaign_impressions", ["impressions", "users"]),
               start(click_windows, "campaign_clicks", ["clicks", "clicked_impressions", "attributions"])]
    epochs = sorted({e for e, _, _ in files})
    batches = 0
    for i, e in enumerate(epochs):
        for _, source, path in (f for f in files if f[0] == e):
            rel = os.path.relpath(path, os.path.join(a.root, source)).replace(os.sep, "-")
            os.link(path, os.path.join(stage, source, rel))
        for q in queries:
            q.processAllAvailable()
        batches += 1
        if i % 4 == 0 or i == len(epochs) - 1:
            print(f"PROGRESS epoch {i + 1}/{len(epochs)} processed ({time.perf_counter() - t0:.1f}s)",
                  file=sys.stderr, flush=True)
    stats = {}
    for q in queries:
        ops = (q.lastProgress or {}).get("stateOperators", [])
        late: dict[str, int] = {}
        for prog in q.recentProgress:  # the last 100 batches (Spark's default)
            for o in prog.get("stateOperators", []):
                late[o["operatorName"]] = late.get(o["operatorName"], 0) + o.get("numRowsDroppedByWatermark", 0)
        stats[q.name] = {"batches": (q.lastProgress or {}).get("batchId"),
                         "state_rows": sum(o.get("numRowsTotal", 0) for o in ops), "late_dropped": late}
    for q in queries:
        q.stop()
    job_s = time.perf_counter() - t0
    print(f"BENCH_RUN_DONE {job_s:.3f} rc=0", file=sys.stderr, flush=True)
    print("RESULT " + json.dumps({"session_s": round(session_s, 3), "job_s": round(job_s, 3), "epochs": batches,
                                  "queries": stats, "spark": pyspark.__version__}), flush=True)
    spark.stop()
    return 0


def child_main(kind: str, argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog=f"ad_clicks_bench.py _{kind}-child")
    for o in ("--root", "--out", "--work"):
        ap.add_argument(o, required=True)
    ap.add_argument("--epoch-seconds", type=int, default=60)
    ap.add_argument("--through-epoch", type=int, required=True)
    ap.add_argument("--shuffle-partitions", type=int, default=4)
    ap.add_argument("--join-range-minutes", type=int, default=0)
    a = ap.parse_args(argv)
    return oneshot_child(a) if kind == "oneshot" else sss_child(a)


# ------------------------------------------------------------------------------------------------- report
def table_lines(results: list[dict], events: int) -> list[str]:
    one = next((r for r in results if r["system"].startswith("one-shot")), None)
    hdr = (f"{'system':<28}{'events':>9}{'session s':>10}{'job s':>8}{'events/s':>10}{'vs one-shot':>12}"
           f"{'CPU s':>7}{'foreign%':>9}{'load avg':>16}  correct")
    lines = [hdr]
    for r in results:
        eps = events / r["job_s"]
        ratio = f"{one['job_s'] / r['job_s']:.2f}x" if one else "-"
        load = "/".join(f"{x:.1f}" for x in r["load_before"][:1] + r["load_after"][:1])
        lines.append(f"{r['system']:<28}{events:>9}{(r.get('session_s') or 0):>10.1f}{r['job_s']:>8.1f}{eps:>10.0f}"
                     f"{ratio:>12}{r['own_cpu_s']:>7.0f}{r['foreign_cpu_pct']:>9.1f}{load:>16}  "
                     f"{_correct(r)}")
    return lines


def _correct(r: dict) -> str:
    v = r["verify"]
    if "error" in v:
        return f"NO ({v['error'][:80]})"
    if v["correct"]:
        return "yes (exact)"
    parts = []
    for t in TABLES:
        e = v[t]
        cols = ", ".join(f"{c} {n}/{e['windows_both']}" for c, n in e["columns_agree"].items())
        parts.append(f"{t}: {e['rows_exact']}/{e['expected']} rows exact, {e['got']} emitted; agree on shared "
                     f"windows: {cols}")
    return "NO: " + "; ".join(parts)


def write_markdown(a: argparse.Namespace, doc: dict) -> None:
    path = os.path.join(REPO, "docs", "performance.md")
    ev = doc["events"]
    begin, end = DOC_BEGIN.format(events=a.events), DOC_END.format(events=a.events)
    one = next((r for r in doc["results"] if r["system"].startswith("one-shot")), None)
    g = doc["gen"]
    md = [begin, f"### ad_clicks, {ev:,} events ({doc['date']})", "",
          f"`{doc['command']}` on {doc['machine']}: {g['rows']['impressions']:,} impressions and "
          f"{g['rows']['clicks']:,} clicks ({g.get('duplicate_clicks', 0):,} re-sent), {a.epochs} epochs x "
          f"{a.partitions} partitions per source; Epochal parallelism {a.parallelism}, a checkpoint per epoch. "
          f"Oracle: {doc['oracle']['campaign_clicks']} campaign_clicks rows, {doc['oracle']['campaign_impressions']} "
          "campaign_impressions rows. `job s` excludes JVM/session start; `vs one-shot` is the ratio of events/s; "
          "`CPU s` is the process tree's CPU; `foreign %` is CPU taken by other processes during the run (share of "
          "all cores); `load` is the 1-minute load average before/after the run.", "",
          "| system | events | session s | job s | events/s | vs one-shot | CPU s | foreign % | load | correct |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in doc["results"]:
        ratio = f"{one['job_s'] / r['job_s']:.2f}x" if one else "-"
        md.append(f"| {r['system']} | {ev:,} | {(r.get('session_s') or 0):.1f} | {r['job_s']:.1f} | "
                  f"{ev / r['job_s']:,.0f} | {ratio} | {r['own_cpu_s']:.0f} | {r['foreign_cpu_pct']:.1f} | "
                  f"{r['load_before'][0]:.1f} / {r['load_after'][0]:.1f} | {_correct(r)} |")
    md += ["", end]
    block = "\n".join(md)
    text = Path(path).read_text()
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        anchor = "<!-- ad-bench:tables -->"
        if anchor in text:
            i = text.index(anchor) + len(anchor)
            text = text[:i] + "\n\n" + block + text[i:]
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


# ------------------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="benchmarks/ad_clicks_bench.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=300_000, help="about this many events (impressions + clicks)")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--partitions", type=int, default=4, help="partitions per source")
    ap.add_argument("--epoch-seconds", type=int, default=60)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--parallelism", type=int, default=2, help="Epochal parallelism")
    ap.add_argument("--shuffle-partitions", type=int, default=4, help="spark.sql.shuffle.partitions of the peers")
    ap.add_argument("--sss-join-range-minutes", type=int, default=0,
                    help="the time range of SSS's stream-stream join condition (state cleanup)")
    ap.add_argument("--systems", default="oneshot,epochal,sss", help="comma list of oneshot, epochal, sss")
    ap.add_argument("--workdir", default=os.path.join(REPO, ".epochal", "ad-bench"))
    ap.add_argument("--results-dir", default=os.path.join(REPO, "bench-results"))
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/performance.md")
    ap.add_argument("--quiet-gate", type=float, default=0.25, help="max busy share of all cores before a run")
    ap.add_argument("--quiet-max-wait", type=float, default=120, help="seconds to wait for a quiet CPU per run")
    ap.add_argument("--max-foreign", type=float, default=10.0, help="foreign CPU %% above which a run is disturbed")
    ap.add_argument("--retries", type=int, default=0, help="re-measurements of a disturbed run")
    ap.add_argument("--keep-runs", action="store_true")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("_oneshot-child", "_sss-child"):
        return child_main(argv[0][1:-len("-child")], argv[1:])
    a = build_parser().parse_args(argv)
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    if any(s not in ("oneshot", "epochal", "sss") for s in systems) or a.events < 100:
        print(f"bad arguments: systems {systems}, events {a.events}", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    a.workdir = os.path.abspath(a.workdir)
    a.run_dir = os.path.join(a.workdir, "runs", stamp)
    os.makedirs(a.run_dir, exist_ok=True)
    os.makedirs(a.results_dir, exist_ok=True)
    t_start = time.time()
    root, gen = prepare_data(a)
    events = gen["rows"]["impressions"] + gen["rows"]["clicks"]
    from pipeline.demo.ad_oracle import expected_ad_output
    t = time.time()
    exp = expected_ad_output("file://" + root, gen["last_epoch"], a.epoch_seconds)
    oracle = {"campaign_clicks": len(exp.campaign_clicks), "campaign_impressions": len(exp.campaign_impressions),
              **exp.stats, "late_impressions": len(exp.late_impressions), "late_pairs": len(exp.late_pairs)}
    say(f"oracle: {oracle} ({time.time() - t:.1f}s, pandas, independent of Spark)")
    say(f"dataset: {events} events; systems {systems}")
    results = []
    for s in systems:
        fn = (lambda: run_epochal(a, exp, root, events)) if s == "epochal" else (
            lambda s=s: run_peer(a, exp, root, s, gen["last_epoch"]))
        results.append(tp.measure(a, s, fn))
    lines = table_lines(results, events)
    print()
    print("=" * 110)
    print(f"ad_clicks: {events:,} events (impressions {gen['rows']['impressions']:,}, clicks "
          f"{gen['rows']['clicks']:,}), {a.epochs} epochs x {a.partitions} partitions; {NCPU} cores")
    for line in lines:
        print(line)
    print("=" * 110)
    import platform
    doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "events": events, "gen": gen,
           "command": "benchmarks/ad_clicks_bench.py " + " ".join(argv),
           "machine": f"{NCPU} cores, {platform.machine()}, Python {platform.python_version()}",
           "oracle": oracle, "results": results, "table": lines, "total_s": round(time.time() - t_start, 1)}
    out = os.path.join(a.results_dir, f"ad-clicks-e{a.events}-{stamp}.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    say(f"results: {out}")
    if not a.no_doc and results:
        write_markdown(a, doc)
    if not a.keep_runs:
        shutil.rmtree(a.run_dir, ignore_errors=True)
    return 0 if all(r["correct"] for r in results if r["system"] != "spark structured streaming") else 1


if __name__ == "__main__":
    sys.exit(main())
