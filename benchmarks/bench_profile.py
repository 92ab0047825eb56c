"""``--profile``: where an Epochal run's time goes, from the Spark event log (stages per round, Python worker
start/init), the driver's cProfile and the JVM's threads."""
from __future__ import annotations

import glob
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------------------ profiling
def summarize_profile(profile_dir: str, res: dict) -> dict:
    """Breakdown of an Epochal run from the Spark event log, the driver's cProfile and the task acks."""
    out: dict[str, Any] = {}
    logs = sorted(f for f in glob.glob(os.path.join(profile_dir, "eventlog", "**", "*"), recursive=True)
                  if os.path.isfile(f) and not os.path.basename(f).startswith((".", "appstatus")))
    if logs:
        out["spark"] = _eventlog_breakdown(logs, res.get("round_durations_s", []))
    prof = os.path.join(profile_dir, "driver.prof")
    if os.path.exists(prof):
        out["driver"] = _driver_breakdown(prof)
    jt = os.path.join(profile_dir, "jvm_threads.json")
    if os.path.exists(jt):
        j = json.loads(Path(jt).read_text())
        a0, a1 = j.get("at_session_ready") or {}, j.get("at_end") or {}
        if "total_s" in a0 and "total_s" in a1:
            live0 = a0.get("live_threads_s", {})
            during = {k: round(v - live0.get(k, 0), 2) for k, v in a1.get("live_threads_s", {}).items()}
            during = {k: v for k, v in sorted(during.items(), key=lambda kv: -kv[1]) if v >= 0.1}
            ended = a1["total_s"] - a0["total_s"] - sum(during.values())
            out["jvm_cpu"] = {"session_start_s": a0["total_s"], "run_s": round(a1["total_s"] - a0["total_s"], 2),
                              "threads_s": {**during, "(threads that ended)": round(max(ended, 0.0), 2)}}
    sp = os.path.join(profile_dir, "checkpoint_stats.jsonl")
    st = [json.loads(x) for x in Path(sp).read_text().splitlines()] if os.path.exists(sp) else []
    st = [c for c in st if c.get("stats")]
    if st:
        ops: dict[str, dict[str, float]] = {}
        for c in st:
            for uid, o in c["stats"]["operators"].items():
                s = ops.setdefault(uid, {"sync_ms": 0.0, "async_ms": 0.0, "in_rows": 0})
                s["sync_ms"] += o.get("sync_ms") or 0
                s["async_ms"] += o.get("async_ms") or 0
                s["in_rows"] += o.get("in_rows") or 0
        out["operator_tasks"] = {uid: {k: round(v, 1) for k, v in s.items()} for uid, s in ops.items()}
        out["operator_tasks_checkpoints"] = len(st)
    return out


def _event_lines(paths: Sequence[str]):
    for path in paths:
        if path.endswith(".zstd"):
            raise ValueError(f"{path}: compressed event log (run with spark.eventLog.compress=false)")
        with open(path) as fh:
            yield from fh


_PY_METRICS = {"time to start Python workers": "py_start_ms", "time to initialize Python workers": "py_init_ms",
               "time to run Python workers": "py_run_ms", "time to execute Python code": "py_exec_ms"}


def _eventlog_breakdown(paths: Sequence[str], round_s: list[float]) -> dict:
    """Spark jobs/stages/tasks of the run, stages classified by their place in the job's DAG."""
    jobs: dict[int, dict] = {}
    stages: dict[int, dict] = {}
    tasks: dict[int, dict[str, float]] = {}
    for line in _event_lines(paths):
        e = json.loads(line)
        ev = e.get("Event")
        if ev == "SparkListenerJobStart":
            props = e.get("Properties") or {}
            jobs[e["Job ID"]] = {"start": e["Submission Time"], "desc": props.get("spark.job.description") or "",
                                 "stages": e.get("Stage IDs", [])}
        elif ev == "SparkListenerJobEnd":
            jobs.setdefault(e["Job ID"], {})["end"] = e["Completion Time"]
        elif ev == "SparkListenerStageCompleted":
            si = e["Stage Info"]
            py = {}
            for acc in si.get("Accumulables", []):
                k = _PY_METRICS.get(acc.get("Name"))
                if k:
                    py[k] = py.get(k, 0) + int(acc.get("Value") or 0)
            stages[si["Stage ID"]] = {"tasks": si.get("Number of Tasks"), "start": si.get("Submission Time") or 0,
                                      "end": si.get("Completion Time") or 0, "parents": si.get("Parent IDs", []),
                                      **py}
        elif ev == "SparkListenerTaskEnd":
            m = e.get("Task Metrics") or {}
            ti = e.get("Task Info") or {}
            t = tasks.setdefault(e["Stage ID"], {})
            sw = m.get("Shuffle Write Metrics") or {}
            for k, v in (("tasks", 1), ("task_wall_ms", ti.get("Finish Time", 0) - ti.get("Launch Time", 0)),
                         ("task_run_ms", m.get("Executor Run Time", 0)),
                         ("task_jvm_cpu_ms", m.get("Executor CPU Time", 0) / 1e6),
                         ("deserialize_ms", m.get("Executor Deserialize Time", 0)), ("gc_ms", m.get("JVM GC Time", 0)),
                         ("shuffle_write_ms", sw.get("Shuffle Write Time", 0) / 1e6),
                         ("shuffle_write_mb", sw.get("Shuffle Bytes Written", 0) / 1e6)):
                t[k] = t.get(k, 0) + v
    kinds: dict[str, dict[str, float]] = {}
    per_job = []
    for jid in sorted(jobs):
        j = jobs[jid]
        if "end" not in j or "start" not in j:
            continue
        st = sorted(s for s in j.get("stages", []) if s in stages)
        per_job.append({"job": jid, "desc": j["desc"], "wall_ms": j["end"] - j["start"], "stages": len(st)})
        last = max(st, default=None)
        for s in st:
            if len(st) == 1:
                k = "single-stage jobs (setup, routing)"
            elif s == last:
                k = "final stage (terminal operator task -> handles)"
            elif not [p for p in stages[s]["parents"] if p in st]:
                k = "source stage (read splits in Python -> select/filter -> key group -> shuffle write)"
            else:
                k = "middle stage (chained operator task -> shuffle write)"
            acc = kinds.setdefault(k, {"stages": 0, "stage_wall_ms": 0})
            acc["stages"] += 1
            acc["stage_wall_ms"] += stages[s]["end"] - stages[s]["start"]
            for kk, vv in list(tasks.get(s, {}).items()) + [(x, stages[s].get(x, 0)) for x in _PY_METRICS.values()]:
                acc[kk] = acc.get(kk, 0) + vv
    epochs = sorted({j["desc"] for j in per_job if j["desc"].startswith("epoch ")})
    return {"jobs": len(per_job), "job_wall_s": round(sum(j["wall_ms"] for j in per_job) / 1000, 2),
            "rounds_s": round(sum(round_s), 2), "epochs_tagged": len(epochs),
            "jobs_per_epoch": round(sum(1 for j in per_job if j["desc"].startswith("epoch ")) / max(1, len(epochs)), 2),
            "by_stage_kind": {k: {kk: round(vv, 1) for kk, vv in v.items()} for k, v in kinds.items()}}


def _driver_breakdown(path: str, top: int = 25) -> dict:
    import pstats
    st = pstats.Stats(path)
    total = max((v[3] for v in st.stats.values()), default=0.0)  # type: ignore[attr-defined]
    rows = []
    for (fn, line, name), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        if "pipeline" in fn or "py4j" in fn or "pyspark" in fn:
            rows.append((ct, tt, nc, f"{os.path.relpath(fn, REPO) if fn.startswith(REPO) else fn.split('site-packages/')[-1]}:{line}({name})"))
    rows.sort(reverse=True)
    return {"total_s": round(total, 2),
            "top_cumulative": [{"cum_s": round(c, 2), "self_s": round(s, 2), "calls": n, "fn": f} for c, s, n, f in rows[:top]],
            "top_self": [{"self_s": round(s, 2), "cum_s": round(c, 2), "calls": n, "fn": f}
                         for c, s, n, f in sorted(rows, key=lambda r: -r[1])[:15]]}


def _profile_lines(p: dict) -> list[str]:
    lines = ["Profile of one Epochal run (extra run, not the measured one):"]
    sp = p.get("spark")
    if sp:
        lines.append(f"  Spark: {sp['jobs']} jobs ({sp['jobs_per_epoch']} per epoch), {sp['job_wall_s']}s inside Spark "
                     f"jobs of {sp['rounds_s']}s of rounds")
        for k, v in sp["by_stage_kind"].items():
            lines.append(f"    {k}: {v['stages']} stages, {v.get('tasks', 0):.0f} tasks, stage wall {v['stage_wall_ms'] / 1000:.1f}s; "
                         f"task run {v.get('task_run_ms', 0) / 1000:.1f}s (JVM CPU {v.get('task_jvm_cpu_ms', 0) / 1000:.1f}s, "
                         f"deserialize {v.get('deserialize_ms', 0) / 1000:.1f}s, GC {v.get('gc_ms', 0) / 1000:.1f}s, "
                         f"shuffle write {v.get('shuffle_write_ms', 0) / 1000:.1f}s / {v.get('shuffle_write_mb', 0):.0f} MB); "
                         f"Python workers: start {v.get('py_start_ms', 0) / 1000:.1f}s, init {v.get('py_init_ms', 0) / 1000:.1f}s, "
                         f"run {v.get('py_run_ms', 0) / 1000:.1f}s, of which Python code {v.get('py_exec_ms', 0) / 1000:.1f}s")
    jc = p.get("jvm_cpu")
    if jc:
        names = {"Thread-N": "py4j (driver API calls: plan building/analysis)", "Executor task i": "executor tasks",
                 "CN CompilerThre": "JIT compiler", "GC Thread#N": "GC"}
        lines.append(f"  JVM CPU: session start {jc['session_start_s']:.1f}s, run {jc['run_s']:.1f}s: " + ", ".join(
            f"{names.get(k, k)} {v:.1f}s" for k, v in list(jc["threads_s"].items())[:8]))
    ops = p.get("operator_tasks")
    if ops:
        lines.append(f"  operator tasks over {p['operator_tasks_checkpoints']} checkpoints (max subtask per checkpoint, summed):")
        for uid, s in ops.items():
            lines.append(f"    {uid}: sync (restore+process) {s['sync_ms'] / 1000:.1f}s, async (state+sink writes) "
                         f"{s['async_ms'] / 1000:.1f}s, rows in {int(s['in_rows'])}")
    dr = p.get("driver")
    if dr:
        lines.append(f"  driver (cProfile, cumulative; total {dr['total_s']}s):")
        for r in dr["top_cumulative"][:18]:
            lines.append(f"    {r['cum_s']:>7.2f}s cum {r['self_s']:>6.2f}s self {r['calls']:>7} calls  {r['fn']}")
    return lines
