#!/usr/bin/env python3
"""Throughput benchmark: Epochal vs a one-shot Spark batch vs Spark Structured Streaming, same data, same run.

    scripts/bench.sh                      # ~2M orders (+ payments), 8 partitions per source, 24 epochs
    scripts/bench.sh --orders 200000      # smaller
    scripts/bench.sh --parallelism 1,2,4  # Epochal once per parallelism
    scripts/bench.sh --s3                 # Epochal reads/writes a moto S3 server on loopback

What it does
    1. Generates the demo data with the project's own generator (``pipeline.demo.generate``) into a local
       directory (reused when it already holds the same timeline). With ``--s3`` the same bytes are also
       uploaded to a moto S3 server (``pipeline.testing.moto_server``) for Epochal; the peers always read
       the local copy.
    2. Runs each system in a fresh process (fresh JVM), one after the other, each after waiting for a quiet
       CPU (the machine has 2 cores and is shared):
       * ``epochal``: ``python -m pipeline run --job orders_payments --json`` with a checkpoint every epoch.
         The benchmark starts it through a thin wrapper (``throughput.py _epochal-child``) that creates the
         SparkSession the runner would create, *before* calling the same CLI entry point, so that JVM and
         session start are timed apart (``session s``). ``job s`` is the CLI's run time after that (restore,
         planning, every round, checkpoints, sink commits, retention); ``rounds s`` is the sum of the
         rounds' ``duration_s`` from the JSON report.
       * ``oneshot``: ``../shared/bench/oneshot.py`` (one Spark batch job, no checkpoints: the practical
         upper bound), called as an external instrument.
       * ``sss``: ``../shared/bench/peer_sss.py`` (Spark Structured Streaming, AvailableNow, one micro-batch
         per epoch's files), also external.
       The peers are skipped with a message when ``/work/shared/bench`` (``--peer-dir``) is absent.
    3. Verifies every system's committed output against the independent oracle ``pipeline.demo.oracle``:
       Epochal's through ``python -m pipeline export``; the peers' by resolving their commit protocols
       (Spark file-sink ``_spark_metadata`` log, ``_LATEST`` version pointer) the way a correct reader would.
    4. Prints a table (system, events, job s, events/s, ratio vs one-shot, correct) and Epochal's checkpoint
       overhead; writes the full results as JSON to ``bench-results/`` and the table to
       ``docs/performance.md`` (between markers, one block per dataset size).

Shared machine
    Before every measured run the benchmark waits (bounded by ``--quiet-max-wait``) until the machine's
    busy share of all cores is below ``--quiet-gate``. During the run it samples ``/proc`` and reports the
    *foreign* CPU: CPU used by processes outside the measured process tree, as a share of all cores. A run
    whose foreign CPU exceeds ``--max-foreign`` percent is re-measured (``--retries``) and, if it stays
    noisy, marked "disturbed" in the table.

Profiling (``--profile``)
    One extra Epochal run (not the measured one) with the Spark event log on, cProfile on the driver, every
    checkpoint retained (so that every checkpoint's per-operator sync/async times stay readable) and each
    epoch's Spark jobs tagged. The breakdown (Spark stages per round, task time split, driver hot spots,
    operator task sync/async) is printed and saved next to the results.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench_data import prepare_data, upload_to_s3, verify_dirs
from bench_machine import HZ, NCPU, run_monitored, say, wait_quiet
from bench_profile import _profile_lines, summarize_profile
from bench_report import epochal_lines, table_lines, write_markdown

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PEER_DIR = os.environ.get("EPOCHAL_PEER_BENCH", "/work/shared/bench")
JOB = "orders_payments"


# ------------------------------------------------------------------------------------------- systems
def _python() -> str:
    return sys.executable


def _env_prefix() -> str:
    """The run's settings that change what is measured, as the shell prefix of the documented command."""
    return "".join(f"{k}={os.environ[k]} " for k in ("PIPELINE_MAX_EPOCHS_PER_ROUND",) if k in os.environ)


def _base_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = _python()
    env.setdefault("PYSPARK_DRIVER_PYTHON", _python())
    for k in ("PYSPARK_SUBMIT_ARGS", "EPOCHAL_KILL_AT", "EPOCHAL_PHASE_MARKERS"):
        env.pop(k, None)
    return env


def _interesting(line: str) -> bool:
    return (line.startswith(("checkpoint ", "restored", "no unread", "BENCH_", "epochal:", "Traceback"))
            or "Error" in line[:80]) and "WARN" not in line[:40]


def _epochal_env(a: argparse.Namespace, uris: dict[str, str], P: int, extra: dict[str, str] | None = None) -> dict:
    env = _base_env()
    env.update({"PIPELINE_SOURCE_URI": uris["source"], "PIPELINE_CHECKPOINT_URI": uris["checkpoint"],
                "PIPELINE_SINK_URI": uris["sink"], "PIPELINE_PARALLELISM": str(P),
                "PIPELINE_EPOCH_SECONDS": str(a.epoch_seconds)})
    env.update(a.s3_env or {})
    env.update(extra or {})
    return env


def _epochal_uris(a: argparse.Namespace, work: str, local_root: str, tag: str) -> dict[str, str]:
    if a.s3:
        base = f"s3://{a.s3_bucket}/runs/{tag}-{time.time_ns()}"  # fresh per attempt (a re-measurement starts empty)
        return {"source": f"s3://{a.s3_bucket}/sources", "checkpoint": f"{base}/checkpoints", "sink": f"{base}/sinks"}
    return {"source": "file://" + local_root, "checkpoint": "file://" + os.path.join(work, "checkpoints"),
            "sink": "file://" + os.path.join(work, "sinks")}


def _cli(env: dict, args: Sequence[str], label: str) -> dict | list:
    p = subprocess.run([_python(), "-m", "pipeline", *args], capture_output=True, text=True, env=env,
                       start_new_session=True)
    if p.returncode != 0:
        raise RuntimeError(f"{label}: `python -m pipeline {' '.join(args)}` failed (rc {p.returncode}):\n"
                           + p.stderr[-2000:])
    return json.loads(p.stdout)


def _sink_files(sink_uri: str) -> dict[str, int]:
    """Parquet data files per sink table folder (file:// only; after the run, before any compaction)."""
    if not sink_uri.startswith("file://"):
        return {}
    root = os.path.join(sink_uri[len("file://"):], JOB)
    out = {}
    for table in ("paid_orders", "merchant_revenue"):
        n = 0
        for _d, _s, files in os.walk(os.path.join(root, table)):
            n += sum(1 for f in files if f.endswith(".parquet"))
        out[table] = n
    return out


def run_epochal(a: argparse.Namespace, exp, local_root: str, events: int, P: int, tag: str, *,
                profile_dir: str | None = None, code: str | None = None, sink_format: str = "") -> dict:
    work = os.path.join(a.run_dir, tag)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    uris = _epochal_uris(a, work, local_root, tag)
    extra: dict[str, str] = {}
    if sink_format:  # every sink in this format (PIPELINE_SINK_FORMAT overrides the job's own choice)
        extra["PIPELINE_SINK_FORMAT"] = sink_format
    if code:  # a modified copy of the package (e.g. a prototype), imported before the installed one
        extra["PYTHONPATH"] = os.pathsep.join(x for x in (os.path.abspath(code), os.environ.get("PYTHONPATH")) if x)
    child = [_python(), os.path.abspath(__file__), "_epochal-child"]
    if profile_dir:
        os.makedirs(profile_dir, exist_ok=True)
        child += ["--profile-dir", profile_dir]
    env = _epochal_env(a, uris, P, extra)
    cmd = child + ["--", "run", "--job", JOB, "--json"]
    r = run_monitored(cmd, env, label=tag, echo=_interesting if a.verbose or profile_dir else _progress_echo(),
                      cwd=work, services=[a.moto_pid] if getattr(a, "moto_pid", None) else [])
    if r.returncode != 0:
        tail = "\n".join(r.stderr[-40:])
        raise RuntimeError(f"{tag}: Epochal run failed (rc {r.returncode}):\n{tail}")
    rep = json.loads(r.stdout)
    marks = _child_marks(r.stderr)
    rounds = rep["rounds"]
    completed = [x for x in rounds if x["completed"]]
    rounds_s = sum(x["duration_s"] for x in rounds)
    ckpt_s = sum(x["checkpoint_s"] for x in completed)
    snap_s = sum(x.get("snapshot_s", 0.0) for x in completed)
    processed = sum(sum(x["records"].values()) for x in rounds)
    res: dict[str, Any] = {
        "system": (f"epochal p={P}" if len(a.parallelisms) > 1 or P != 2 else "epochal")
                  + (f" [{os.path.basename(os.path.abspath(code))}]" if code else "")
                  + (f" [{sink_format}]" if sink_format else ""),
        "sink_format": sink_format or "job default",
        "parallelism": P, "storage": "s3 (moto)" if a.s3 else "file://",
        "session_s": marks.get("session_s"), "job_s": marks.get("run_s"), "rounds_s": round(rounds_s, 3),
        "proc_s": round(r.wall_s, 3), "checkpoint_finalize_s": round(ckpt_s, 3),
        "checkpoint_overhead": round(ckpt_s / rounds_s, 4) if rounds_s else None,
        "snapshot_s": round(snap_s, 3),
        # checkpointing = state snapshot writes in the tasks + finalize on the driver, share of round time
        "checkpointing_share": round((ckpt_s + snap_s) / rounds_s, 4) if rounds_s else None,
        "checkpoints": len(completed), "rounds": len(rounds), "events_processed": processed,
        # Spark rounds: a tagged round (PIPELINE_MAX_EPOCHS_PER_ROUND) completes several checkpoints in one
        "spark_rounds": len({tuple(x.get("tagged_round") or ()) or (x["checkpoint_id"], x["round"]) for x in rounds}),
        "round_durations_s": [round(x["duration_s"], 3) for x in rounds],
        "round_checkpoint_s": [round(x["checkpoint_s"], 4) for x in rounds],
        "finalize_per_checkpoint_ms": round(1000 * ckpt_s / len(completed), 1) if completed else None,
        "state_bytes_last": completed[-1]["state_bytes"] if completed else 0,
        "state_bytes_max": max((x["state_bytes"] for x in completed), default=0),
        **r.cpu,
    }
    # checkpoint history (retained checkpoints): per-operator sync/async (state snapshot) times
    try:
        res["checkpoint_stats"] = checkpoint_stats(env, rounds)
    except Exception as e:  # noqa: BLE001 - stats are a bonus
        res["checkpoint_stats"] = {"error": str(e)}
    # correctness: export the committed output (the documented read path) and compare with the oracle
    t = time.time()
    out = os.path.join(work, "export")
    try:
        for table in ("paid_orders", "merchant_revenue"):
            _cli(env, ["export", "--job", JOB, "--table", table, "--to", os.path.join(out, table), "--json"], tag)
        res["verify"] = verify_dirs(exp, os.path.join(out, "paid_orders"), os.path.join(out, "merchant_revenue"))
    except Exception as e:  # noqa: BLE001
        res["verify"] = {"correct": False, "error": str(e)}
    res["verify_s"] = round(time.time() - t, 1)
    res["sink_files"] = _sink_files(uris["sink"])
    if processed != events:
        res["verify"]["correct"] = False
        res["verify"]["error"] = f"processed {processed} events, the sources hold {events}"
    res["correct"] = bool(res["verify"]["correct"])
    if not a.keep_runs and not profile_dir:
        shutil.rmtree(work, ignore_errors=True)
    return res


def _progress_echo() -> Callable[[str], bool]:
    """Echo every 4th checkpoint line and anything that looks wrong."""
    seen = {"n": 0}

    def echo(line: str) -> bool:
        if line.startswith("checkpoint ") and "completed" in line:
            seen["n"] += 1
            return seen["n"] % 4 == 1
        return _interesting(line) and not line.startswith("checkpoint ")
    return echo


def _child_marks(stderr: list[str]) -> dict[str, float]:
    out = {}
    for line in stderr:
        m = re.match(r"BENCH_SESSION_READY ([\d.]+)", line)
        if m:
            out["session_s"] = float(m.group(1))
        m = re.match(r"BENCH_RUN_DONE ([\d.]+)", line)
        if m:
            out["run_s"] = float(m.group(1))
    return out


def checkpoint_stats(env: dict, rounds: list[dict]) -> dict:
    """Per-operator stats of the retained checkpoints (``checkpoints list`` / ``show``)."""
    rows = _cli(env, ["checkpoints", "list", "--job", JOB, "--json"], "checkpoints list")
    dur = {x["checkpoint_id"]: x["duration_s"] for x in rounds if x["completed"]}
    out = []
    for row in rows:
        if row.get("status") != "COMPLETED" or row.get("kind") != "checkpoint":
            continue
        d = _cli(env, ["checkpoints", "show", "--job", JOB, "--id", str(row["id"]), "--json"], "checkpoints show")
        ops = {uid: {k: (op["stats"] or {}).get(k) for k in ("sync_ms", "async_ms", "rows", "bytes", "in_rows")}
               for uid, op in d["operators"].items()}
        async_ms = sum((o["async_ms"] or 0) for o in ops.values())
        out.append({"id": row["id"], "epoch": row["epoch"], "duration_ms": row["duration_ms"],
                    "round_s": dur.get(row["id"]), "state_bytes": row["state_bytes"], "operators": ops,
                    "async_ms_sum_ops": round(async_ms, 1),
                    "async_share_of_round": round(async_ms / 1000 / dur[row["id"]], 4) if dur.get(row["id"]) else None})
    return {"retained": out}


def run_peer(a: argparse.Namespace, exp, local_root: str, system: str) -> dict:
    work = os.path.join(a.run_dir, system)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    out = os.path.join(work, "out")
    if system == "oneshot":
        cmd = [_python(), os.path.join(a.peer_dir, "oneshot.py"), "--root", local_root, "--out", out]
    else:
        cmd = [_python(), os.path.join(a.peer_dir, "peer_sss.py"), "--root", local_root, "--out", out,
               "--checkpoint", os.path.join(work, "checkpoint"), "--progress", os.path.join(work, "progress.jsonl"),
               "--mode", "sink2q", "--max-files-per-trigger", str(a.partitions)]
    env = _base_env()
    env.setdefault("BENCH_SHUFFLE_PARTITIONS", str(a.partitions))
    r = run_monitored(cmd, env, label=system, echo=lambda l: l.startswith(("QUERY_STARTED", "Traceback")))
    res = next((json.loads(l[7:]) for l in r.stdout.splitlines() if l.startswith("RESULT ")), None)
    if r.returncode != 0 or res is None:
        raise RuntimeError(f"{system} failed (rc {r.returncode}):\n" + "\n".join(r.stderr[-40:]))
    res["system"] = "spark structured streaming" if system == "sss" else "one-shot spark batch"
    res["proc_s"] = round(r.wall_s, 3)
    res.update(r.cpu)
    t = time.time()
    res["verify"] = verify_dirs(exp, os.path.join(out, "paid_orders"), os.path.join(out, "merchant_revenue"))
    res["verify_s"] = round(time.time() - t, 1)
    res["correct"] = bool(res["verify"]["correct"])
    if not a.keep_runs:
        shutil.rmtree(work, ignore_errors=True)
    return res


def measure(a: argparse.Namespace, label: str, fn: Callable[[], dict]) -> dict:
    """Wait for a quiet CPU, run, and re-measure (up to --retries) when others took CPU during the run."""
    best = None
    attempts = []
    for attempt in range(a.retries + 1):
        quiet = wait_quiet(a.quiet_gate, a.quiet_max_wait)
        say(f"{label}: running (attempt {attempt + 1}, machine busy {100 * quiet['busy_before']:.0f}% before, "
            f"waited {quiet['waited_s']:.0f}s) ...")
        res = fn()
        res.update(quiet_wait=quiet, attempt=attempt)
        res["disturbed"] = res["foreign_cpu_pct"] > a.max_foreign
        attempts.append({k: res.get(k) for k in ("job_s", "foreign_cpu_pct", "foreign_peak_pct", "correct")})
        say(f"{label}: job {res['job_s']:.1f}s (process {res['proc_s']:.1f}s), foreign CPU "
            f"{res['foreign_cpu_pct']:.1f}% (peak {res['foreign_peak_pct']:.0f}%), correct={res['correct']}"
            + ("  [DISTURBED]" if res["disturbed"] else ""))
        if best is None or (best["disturbed"] and not res["disturbed"]) or (
                best["disturbed"] == res["disturbed"] and res["job_s"] < best["job_s"]):
            best = res
        if not res["disturbed"]:
            break
        if attempt < a.retries:
            say(f"{label}: other processes took {res['foreign_cpu_pct']:.0f}% of the CPU: re-measuring")
    best["attempts"] = attempts
    return best



# ------------------------------------------------------------------------------------- child (wrapper)
def _jvm_thread_cpu(spark) -> dict:
    """CPU seconds of the JVM's live threads grouped by name (digits folded), plus the process total
    (the difference is threads that already ended, e.g. per-task Python runner threads)."""
    try:
        pid = spark.sparkContext._gateway.proc.pid
        tasks = f"/proc/{pid}/task"
        if not os.path.isdir(tasks):
            return {}
        groups: dict[str, float] = {}
        for tid in os.listdir(tasks):
            try:
                with open(f"{tasks}/{tid}/stat") as f:
                    s = f.read()
            except OSError:
                continue
            name = re.sub(r"\d+", "N", s[s.find("(") + 1:s.rfind(")")])
            rest = s[s.rfind(")") + 2:].split()
            groups[name] = groups.get(name, 0.0) + (int(rest[11]) + int(rest[12])) / HZ
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
        rest = s[s.rfind(")") + 2:].split()
        total = (int(rest[11]) + int(rest[12])) / HZ
        return {"total_s": round(total, 2), "live_threads_s": {k: round(v, 2) for k, v in
                                                               sorted(groups.items(), key=lambda kv: -kv[1]) if v >= 0.05}}
    except Exception as e:  # noqa: BLE001
        return {"error": str(e)}


def epochal_child(argv: list[str]) -> int:
    """``python -m pipeline <args>`` with the SparkSession created (and timed) first.

    The runner creates its session lazily inside the first round; creating the very same session (same
    master, same parallelism, same process) before calling the CLI keeps JVM start out of the job time,
    as the peers do. With ``--profile-dir``: Spark event log, driver cProfile, Spark jobs tagged per epoch.
    """
    ap = argparse.ArgumentParser(prog="throughput.py _epochal-child")
    ap.add_argument("--profile-dir")
    ap.add_argument("cli", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cli_args = a.cli[1:] if a.cli and a.cli[0] == "--" else a.cli
    t0 = time.perf_counter()
    if a.profile_dir:
        ev = os.path.join(a.profile_dir, "eventlog")
        os.makedirs(ev, exist_ok=True)
        os.environ["PYSPARK_SUBMIT_ARGS"] = (f"--conf spark.eventLog.enabled=true --conf spark.eventLog.dir=file://{ev} "
                                             "--conf spark.eventLog.compress=false "
                                             "--conf spark.eventLog.rolling.enabled=false pyspark-shell")
    from pipeline.config import load_config
    from pipeline.runtime.spark.session import get_spark
    cfg = load_config(None)
    spark = get_spark(cfg.spark_master, cfg.parallelism)
    spark.range(1).count()
    print(f"BENCH_SESSION_READY {time.perf_counter() - t0:.3f}", file=sys.stderr, flush=True)
    jvm_at_ready = _jvm_thread_cpu(spark) if a.profile_dir else None
    from pipeline import cli
    if a.profile_dir:
        from pipeline.runtime.driver.runner import JobRunner
        orig = JobRunner.complete_epoch

        def tagged(self, cursor, epoch, *args, **kw):
            spark.sparkContext.setJobDescription(f"epoch {epoch}")
            try:
                return orig(self, cursor, epoch, *args, **kw)
            finally:
                spark.sparkContext.setJobDescription(None)  # type: ignore[arg-type]
        JobRunner.complete_epoch = tagged  # type: ignore[method-assign]
        # every completed checkpoint's stats (per-operator sync/async of the tasks' acks), also for the
        # checkpoints that retention deletes later
        from pipeline.checkpoint.coordinator import CheckpointCoordinator
        orig_complete = CheckpointCoordinator.complete
        stats_path = os.path.join(a.profile_dir, "checkpoint_stats.jsonl")

        def recording(self, *args, **kw):
            completed = orig_complete(self, *args, **kw)
            md = completed.metadata
            with open(stats_path, "a") as fh:
                fh.write(json.dumps({"id": md.checkpoint_id, "epoch": md.epoch,
                                     "stats": md.stats.to_dict() if md.stats else None}) + "\n")
            return completed
        CheckpointCoordinator.complete = recording  # type: ignore[method-assign]
    t1 = time.perf_counter()
    if a.profile_dir:
        import cProfile
        prof = cProfile.Profile()
        rc = prof.runcall(cli.main, cli_args)
        prof.dump_stats(os.path.join(a.profile_dir, "driver.prof"))
    else:
        rc = cli.main(cli_args)
    print(f"BENCH_RUN_DONE {time.perf_counter() - t1:.3f} rc={rc}", file=sys.stderr, flush=True)
    if a.profile_dir:
        with open(os.path.join(a.profile_dir, "jvm_threads.json"), "w") as fh:
            json.dump({"at_session_ready": jvm_at_ready, "at_end": _jvm_thread_cpu(spark)}, fh)
    sys.stdout.flush()
    return int(rc or 0)


# ------------------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="benchmarks/throughput.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=int, default=2_000_000, help="orders in total (default 2,000,000)")
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--partitions", type=int, default=8, help="partitions per source")
    ap.add_argument("--epoch-seconds", type=int, default=60)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--parallelism", default="2", help="Epochal parallelism; a comma list runs Epochal once per value")
    ap.add_argument("--sink-formats", default="",
                    help="comma list of delta, iceberg, epochal: runs Epochal once per sink format "
                         "(default: the job's own, Delta for the demo)")
    ap.add_argument("--systems", default="oneshot,epochal,sss", help="comma list of oneshot, epochal, sss")
    ap.add_argument("--s3", action="store_true", help="Epochal on a moto S3 server on loopback (peers read local files)")
    ap.add_argument("--peer-dir", default=DEFAULT_PEER_DIR, help="the shared peer harness (oneshot.py, peer_sss.py)")
    ap.add_argument("--workdir", default=os.path.join(REPO, ".epochal", "bench"), help="data and run directories")
    ap.add_argument("--results-dir", default=os.path.join(REPO, "bench-results"))
    ap.add_argument("--no-doc", action="store_true", help="do not update docs/performance.md")
    ap.add_argument("--quiet-gate", type=float, default=0.25, help="max busy share of all cores before a run")
    ap.add_argument("--quiet-max-wait", type=float, default=600, help="seconds to wait for a quiet CPU per run")
    ap.add_argument("--max-foreign", type=float, default=10.0, help="foreign CPU %% above which a run is disturbed")
    ap.add_argument("--retries", type=int, default=1, help="re-measurements of a disturbed run")
    ap.add_argument("--compare-code", metavar="DIR",
                    help="also run Epochal from a modified copy of the package in DIR (DIR/pipeline), same data")
    ap.add_argument("--profile", action="store_true", help="also profile one Epochal run (see module doc)")
    ap.add_argument("--keep-runs", action="store_true", help="keep checkpoints/sinks/outputs of the runs")
    ap.add_argument("--verbose", action="store_true", help="echo every progress line of the runs")
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_epochal-child":
        return epochal_child(argv[1:])
    a = build_parser().parse_args(argv)
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as e:
        print(f"this Python ({sys.executable}) lacks {e.name}; run scripts/bench.sh (it uses .venv)", file=sys.stderr)
        return 2
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in ("oneshot", "epochal", "sss")]
    if bad or a.orders < a.epochs or a.partitions < 1:
        print(f"bad arguments: systems {bad}, orders {a.orders}, epochs {a.epochs}", file=sys.stderr)
        return 2
    a.parallelisms = [int(x) for x in str(a.parallelism).split(",") if x.strip()]
    a.sink_formats = [x.strip() for x in str(a.sink_formats).split(",") if x.strip()] or [""]
    notes: list[str] = []
    if any(s in systems for s in ("oneshot", "sss")) and not (
            os.path.exists(os.path.join(a.peer_dir, "oneshot.py")) and os.path.exists(os.path.join(a.peer_dir, "peer_sss.py"))):
        msg = (f"peer harness not found at {a.peer_dir} (oneshot.py, peer_sss.py): skipping the one-shot and "
               "Spark Structured Streaming peers; set --peer-dir or EPOCHAL_PEER_BENCH")
        say("WARNING: " + msg)
        notes.append(msg)
        systems = [s for s in systems if s == "epochal"]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    a.workdir = os.path.abspath(a.workdir)
    a.run_dir = os.path.join(a.workdir, "runs", stamp)
    os.makedirs(a.run_dir, exist_ok=True)
    os.makedirs(a.results_dir, exist_ok=True)
    t_start = time.time()
    local_root, gen = prepare_data(a)
    events = gen["rows"]["orders"] + gen["rows"]["payments"]
    moto = None
    a.s3_env = {}
    a.s3_bucket = "epochal-bench"
    results: list[dict] = []
    profile = None
    try:
        if a.s3 and "epochal" in systems:
            from pipeline.testing.moto_server import spawn_moto_server
            moto = spawn_moto_server([a.s3_bucket], python=sys.executable)
            a.s3_env = moto.env()
            a.moto_pid = moto.pid
            os.environ.update(a.s3_env)
            t = time.time()
            n = upload_to_s3(local_root, f"s3://{a.s3_bucket}/sources")
            say(f"S3: moto at {moto.endpoint_url}; uploaded {n} files in {time.time() - t:.1f}s")
        from pipeline.demo.oracle import digest, expected
        t = time.time()
        exp = expected("file://" + local_root)
        dg = digest(exp)
        say(f"oracle: expected paid_orders {dg['paid_orders']['rows']} rows, merchant_revenue "
            f"{dg['merchant_revenue']['rows']} rows ({time.time() - t:.1f}s, pyarrow, independent of Spark)")
        say(f"dataset: {events} events (orders {gen['rows']['orders']}, payments {gen['rows']['payments']}); "
            f"systems {systems}; Epochal parallelism {a.parallelisms}")
        for s in systems:
            if s == "epochal":
                for P in a.parallelisms:
                    for fmt in a.sink_formats:
                        label = f"epochal p={P}" + (f" [{fmt}]" if fmt else "")
                        results.append(measure(a, label, lambda P=P, fmt=fmt: run_epochal(
                            a, exp, local_root, events, P, f"epochal-p{P}{'-' + fmt if fmt else ''}",
                            sink_format=fmt)))
                    if a.compare_code:
                        results.append(measure(a, f"epochal p={P} [{a.compare_code}]", lambda P=P: run_epochal(
                            a, exp, local_root, events, P, f"epochal-p{P}-cmp", code=a.compare_code)))
            else:
                results.append(measure(a, s, lambda s=s: run_peer(a, exp, local_root, s)))
        if a.profile and "epochal" in systems:
            P = a.parallelisms[0]
            pdir = os.path.join(a.results_dir, f"profile-{stamp}")
            say(f"profile: one more Epochal run (p={P}) with event log + cProfile into {pdir} ...")
            wait_quiet(a.quiet_gate, a.quiet_max_wait)
            pres = run_epochal(a, exp, local_root, events, P, f"epochal-profile-p{P}", profile_dir=pdir)
            profile = {"run": {k: v for k, v in pres.items() if k != "checkpoint_stats"},
                       "breakdown": summarize_profile(pdir, pres)}
    finally:
        if moto is not None:
            moto.stop()
    # ------------------------------------------------------------------ report
    ep = [r for r in results if r["system"].startswith("epochal")]
    ep_main = [r for r in ep if "[" not in r["system"]]  # the installed package (not --compare-code)
    if len(ep_main) > 1:
        best = min(ep_main, key=lambda r: r["job_s"])
        per_p = ", ".join(f"p={r['parallelism']}: {r['job_s']:.1f}s" for r in ep_main)
        notes.append(f"best Epochal parallelism here: {best['parallelism']} ({per_p})")
    disturbed = [r["system"] for r in results if r.get("disturbed")]
    if disturbed:
        notes.append(f"DISTURBED measurements (other processes took > {a.max_foreign:.0f}% of the CPU during the run "
                     f"even after {a.retries} re-measurement(s)): {', '.join(disturbed)}; read their ratios with care")
    lines = table_lines(results, events)
    ep_lines = [l for r in ep for l in epochal_lines(r)]
    targets = []
    one = next((r for r in results if r["system"].startswith("one-shot")), None)
    sss = next((r for r in results if r["system"].startswith("spark structured")), None)
    if ep_main:
        e = min(ep_main, key=lambda r: r["job_s"])
        if one:
            targets.append(f"target Epochal >= 0.5x one-shot: {one['job_s'] / e['job_s']:.2f}x -> "
                           f"{'MET' if one['job_s'] / e['job_s'] >= 0.5 else 'NOT MET'}")
        share = e.get("checkpointing_share")
        if share is None:
            share = e["checkpoint_overhead"]
        targets.append(f"target checkpointing <= 10% of epoch time: {100 * share:.1f}% (state snapshot writes + "
                       f"finalize) -> {'MET' if share <= 0.10 else 'NOT MET'}")
        if sss:
            targets.append(f"target faster than Spark Structured Streaming: {sss['job_s'] / e['job_s']:.2f}x SSS's "
                           f"throughput -> {'MET' if e['job_s'] < sss['job_s'] else 'NOT MET'}")
    print()
    print("=" * 110)
    print(f"Throughput: {a.orders:,} orders requested, {events:,} events (orders {gen['rows']['orders']:,}, payments "
          f"{gen['rows']['payments']:,}), {a.epochs} epochs x {a.partitions} partitions; Epochal on "
          f"{'moto S3' if a.s3 else 'file://'}; {NCPU} cores")
    for l in lines + ep_lines + targets + [f"note: {n}" for n in notes]:
        print(l)
    if profile:
        print()
        for l in _profile_lines(profile["breakdown"]):
            print(l)
    print("=" * 110)
    doc = {"date": time.strftime("%Y-%m-%d %H:%M"), "orders": a.orders, "events": events, "gen": gen,
           "command": _env_prefix() + "scripts/bench.sh " + " ".join(argv), "args": {k: v for k, v in vars(a).items() if k != "s3_env"},
           "machine": f"{NCPU} cores, {platform.machine()}, Python {platform.python_version()}",
           "storage": "moto S3 (Epochal), local files (peers)" if a.s3 else "local files (file://)",
           "oracle": dg, "results": results, "targets": targets, "notes": notes, "table": lines + ep_lines,
           "profile": profile, "total_s": round(time.time() - t_start, 1)}
    out = os.path.join(a.results_dir, f"throughput-o{a.orders}-{stamp}.json")
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    say(f"results: {os.path.relpath(out, REPO) if out.startswith(REPO) else out}")
    if not a.no_doc and results:
        write_markdown(a, doc, lines, ep_lines + targets)
    if not a.keep_runs:
        shutil.rmtree(a.run_dir, ignore_errors=True)
    return 0 if all(r["correct"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
