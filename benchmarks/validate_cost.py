"""Benchmark: what does ``epochal validate`` cost against the job's own processing? (prints figures; not a test)

    .venv/bin/python benchmarks/validate_cost.py                              # every job at 10k and 100k events
    .venv/bin/python benchmarks/validate_cost.py --jobs iot --sizes 10000     # one job, one size
    .venv/bin/python benchmarks/validate_cost.py --root /tmp/vc --keep        # reuse data and checkpoints

For each job (the demo ``orders_payments``, ``ad_clicks`` and the dedup-heavy ``benchmarks.iot_job``: two
deduplicates with one key per row, a join, an ``emit="update"`` window, a ``process`` step, Delta and Iceberg sinks)
and each size (events = the rows of its sources, about): generate the sources (24 epochs of 60 s), run the job as
a user would (``python -m pipeline run --job J``, one process, a checkpoint per epoch), then validate the newest
checkpoint in a fresh process (``python -m pipeline validate --job J``). Wall time and the CPU of each process
tree (Python driver, JVM, Python workers; sampled from /proc every 0.2 s) are printed with the ratio
validate / run and ``/proc/loadavg`` before and after each measured command. The issue-29 target: the ratio stays
<= 1.5 and 100k events validate in under 60 s on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EPOCHS = 24
JOBS = {"demo": "orders_payments", "ad_clicks": "ad_clicks", "iot": "benchmarks.iot_job:build_job"}


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _ticks(pid: int) -> tuple[int, int] | None:
    try:
        st = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = st[st.rfind(")") + 2:].split()
    return int(rest[1]), int(rest[11]) + int(rest[12])     # parent, utime + stime


def run_measured(cmd: list[str], env: dict, log: Path, cwd: Path | str = REPO) -> dict:
    """Run ``cmd`` (in ``cwd``); wall time and the CPU seconds of its process tree (the last sample of every process seen)."""
    hz = os.sysconf("SC_CLK_TCK")
    seen: dict[int, int] = {}
    before = loadavg()
    t0 = time.perf_counter()
    with open(log, "w") as out:
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        while p.poll() is None:
            procs = {}
            for d in os.listdir("/proc"):
                if d.isdigit():
                    t = _ticks(int(d))
                    if t is not None:
                        procs[int(d)] = t
            tree, todo = set(), [p.pid]
            while todo:
                x = todo.pop()
                tree.add(x)
                todo.extend(c for c, (pp, _) in procs.items() if pp == x and c not in tree)
            for x in tree:
                if x in procs:
                    seen[x] = max(seen.get(x, 0), procs[x][1])
            time.sleep(0.2)
    wall = time.perf_counter() - t0
    return {"rc": p.returncode, "wall_s": round(wall, 1), "cpu_s": round(sum(seen.values()) / hz, 1),
            "load_before": before, "load_after": loadavg()}


def generate(job: str, events: int, src: Path) -> dict:
    sys.path.insert(0, str(REPO))
    if job == "demo":
        from pipeline.demo.generate import generate as gen
        s = gen(src.as_uri(), epochs=EPOCHS, partitions=2, orders_per_epoch=max(1, events // 2 // EPOCHS))
        return {"rows": str(s.rows)}
    if job == "ad_clicks":
        from pipeline.demo.ad_generate import generate_ads
        return generate_ads(src.as_uri(), epochs=EPOCHS, partitions=2,
                            impressions_per_epoch=max(1, int(events / 1.3 / EPOCHS)))
    from benchmarks.iot_job import generate as gen_iot
    return gen_iot(str(src), events=events // 2, epochs=EPOCHS)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/tmp/epochal-validate-cost")
    ap.add_argument("--jobs", default="demo,ad_clicks,iot")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="reuse data and checkpoints of an earlier call")
    a = ap.parse_args(argv)
    results = []
    for job in a.jobs.split(","):
        for size in (int(s) for s in a.sizes.split(",")):
            root = Path(a.root) / f"{job}-{size}"
            if not a.keep:
                shutil.rmtree(root, ignore_errors=True)
            root.mkdir(parents=True, exist_ok=True)
            env = {**os.environ, "PYTHONPATH": str(REPO), "PIPELINE_SOURCE_URI": (root / "src").as_uri(),
                   "PIPELINE_CHECKPOINT_URI": (root / "ckpt").as_uri(), "PIPELINE_SINK_URI": (root / "sink").as_uri(),
                   "PIPELINE_EPOCH_SECONDS": "60", "PIPELINE_PARALLELISM": str(a.parallelism),
                   "EPOCHAL_HOME": str(root / "home")}
            row: dict = {"job": job, "events": size}
            if not (root / "src").exists():
                row["data"] = generate(job, size, root / "src")
            py = [sys.executable, "-m", "pipeline"]
            if not (root / "ckpt").exists():
                row["run"] = run_measured(py + ["run", "--job", JOBS[job], "--epochs", str(EPOCHS)], env,
                                          root / "run.log")
            row["validate"] = run_measured(py + ["validate", "--job", JOBS[job]], env, root / "validate.log")
            if "run" in row and row["run"]["cpu_s"]:
                row["ratio_wall"] = round(row["validate"]["wall_s"] / row["run"]["wall_s"], 2)
                row["ratio_cpu"] = round(row["validate"]["cpu_s"] / row["run"]["cpu_s"], 2)
            summary = root / "ckpt"
            found = list(summary.glob("*/validation/chk-*/summary.json"))
            if found:
                doc = json.loads(max(found, key=lambda f: f.stat().st_mtime).read_text())
                row["validation"] = {"success": doc.get("success"), "duration_s": round(doc.get("duration_s", 0), 1),
                                     "timings": {k: round(v, 1) for k, v in (doc.get("timings") or {}).items()
                                                 if v >= 0.5}}
            results.append(row)
            r, v = row.get("run", {}), row["validate"]
            print(f"{job:9s} {size:>8,} events: run {r.get('wall_s', '-')} s wall / {r.get('cpu_s', '-')} s CPU "
                  f"(load {r.get('load_before', '-')} -> {r.get('load_after', '-')}); validate {v['wall_s']} s wall / "
                  f"{v['cpu_s']} s CPU (load {v['load_before']} -> {v['load_after']}, rc {v['rc']}); "
                  f"ratio wall {row.get('ratio_wall', '-')} CPU {row.get('ratio_cpu', '-')}", flush=True)
    out = Path(a.root) / "validate_cost.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"figures: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
