"""Airflow overhead per epoch (figures, not a timed test): a real ``airflow standalone`` (scheduler, LocalExecutor,
API server; ``scripts/airflow_standalone.sh``) runs the demo DAG over N one-minute epochs of catch-up, once with a
driver JVM per task (``local[*]``, the classic embedded default) and once with every task connected to a
long-lived Spark Connect server (``EPOCHAL_SPARK_CONNECT=1``).

Modes: ``classic`` (JVM per task), ``connect`` (Spark Connect), ``fused`` (Spark Connect and the fused epoch DAG,
``EPOCHAL_FUSED_EPOCH=1``: ``trigger >> epoch``), ``classic-fused``.

Per DAG run it reads, through Airflow's REST API, the run's wall time (first task start to last task end), the
duration of each task, and from the ``process`` task's XCom the time of the epoch's rounds (``rounds_s``: the
Spark work plus checkpoint finalisation) and of starting / connecting to Spark (``spark_start_s``; in the fused DAG
from the ``epoch`` task's XCom).

    overhead = run wall time - rounds_s

    .venv/bin/python benchmarks/airflow_overhead.py [--epochs 8] [--modes classic,connect,fused] [--orders-per-epoch 500]

Prints a table (with the 1-minute load average at the end of each mode) and writes the JSON to bench-results/
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "airflow_standalone.sh"
DAG = "epochal_orders_payments"
sys.path.insert(0, str(REPO))

from pipeline.testing.cluster import free_port  # noqa: E402

LABELS = {"classic": "driver JVM per task (local[*]), 4 tasks",
          "connect": "Spark Connect server (long-lived), 4 tasks",
          "fused": "Spark Connect server, fused epoch DAG (2 tasks)",
          "classic-fused": "driver JVM per task, fused epoch DAG (2 tasks)"}


def say(msg: str) -> None:
    print(f"[airflow-overhead {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Api:
    def __init__(self, url: str, password: str) -> None:
        self.url, self.password, self._token = url, password, None

    def _req(self, method: str, path: str, body=None, auth: bool = True):
        req = urllib.request.Request(self.url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        req.add_header("Content-Type", "application/json")
        if auth:
            if self._token is None:
                self._token = self._req("POST", "/auth/token", {"username": "admin", "password": self.password},
                                        auth=False)["access_token"]
            req.add_header("Authorization", f"Bearer {self._token}")
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read().decode()
            return json.loads(text) if text else None

    def runs(self) -> list[dict]:
        return self._req("GET", f"/api/v2/dags/{DAG}/dagRuns?order_by=logical_date&limit=200")["dag_runs"]

    def tis(self, run_id: str) -> dict[str, dict]:
        q = urllib.request.quote(run_id, safe="")
        return {t["task_id"]: t for t in self._req("GET", f"/api/v2/dags/{DAG}/dagRuns/{q}/taskInstances")["task_instances"]}

    def xcom(self, run_id: str, task: str):
        q = urllib.request.quote(run_id, safe="")
        v = self._req("GET", f"/api/v2/dags/{DAG}/dagRuns/{q}/taskInstances/{task}/xcomEntries/return_value"
                             "?deserialize=true")["value"]
        return json.loads(v) if isinstance(v, str) and v[:1] in "{[" else v

    def unpause(self) -> None:
        self._req("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})


def _ts(s: str | None) -> float | None:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() if s else None


def measure(mode: str, a: argparse.Namespace) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"airflow-overhead-{mode}-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PIPELINE_", "AWS_", "EPOCHAL_"))}
    env.update({"EPOCHAL_AIRFLOW_HOME": str(home), "AIRFLOW_PORT": str(port), "PIPELINE_EPOCH_SECONDS": "60",
                "EPOCHAL_DEMO_EPOCHS": str(a.epochs), "EPOCHAL_DEMO_ORDERS_PER_EPOCH": str(a.orders_per_epoch),
                "EPOCHAL_DEMO_PARTITIONS": "2", "PIPELINE_PARALLELISM": "2", "EPOCHAL_CATCHUP": "true",
                "EPOCHAL_POKE_SECONDS": "2", "EPOCHAL_READY_TIMEOUT": "600",
                "AIRFLOW__CORE__MAX_ACTIVE_RUNS_PER_DAG": "1"})
    env.update(dict(kv.split("=", 1) for kv in a.set))
    if mode in ("connect", "fused"):
        env.update({"EPOCHAL_SPARK_CONNECT": "1", "EPOCHAL_CONNECT_PORT": str(free_port()),
                    "EPOCHAL_CONNECT_MASTER": "local[2]"})
    if mode in ("fused", "classic-fused"):
        env["EPOCHAL_FUSED_EPOCH"] = "1"
    say(f"{mode}: starting airflow standalone (home {home}, port {port}) ...")
    t0 = time.monotonic()
    p = subprocess.run(["bash", str(SCRIPT), "start", "-d"], env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=120)
        raise RuntimeError(f"{mode}: airflow_standalone.sh start failed:\n{p.stderr[-3000:]}")
    say(f"{mode}: ready in {time.monotonic() - t0:.0f}s")
    try:
        password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        api = Api(f"http://127.0.0.1:{port}", password)
        api.unpause()
        t_unpause = time.time()
        deadline = time.monotonic() + a.timeout
        done: list[dict] = []
        while time.monotonic() < deadline:
            runs = [r for r in api.runs() if r["run_type"] == "scheduled"]
            failed = [r for r in runs if r["state"] == "failed"]
            if failed:
                raise RuntimeError(f"{mode}: failed runs {[r['dag_run_id'] for r in failed]}")
            done = [r for r in runs if r["state"] == "success"]
            if len(done) >= a.epochs:
                break
            say(f"{mode}: {len(done)}/{a.epochs} runs done")
            time.sleep(10)
        else:
            raise RuntimeError(f"{mode}: only {len(done)} of {a.epochs} runs finished within {a.timeout}s")
        rows = []
        for r in done:
            tis = api.tis(r["dag_run_id"])
            starts = [_ts(t["start_date"]) for t in tis.values() if t.get("start_date")]
            ends = [_ts(t["end_date"]) for t in tis.values() if t.get("end_date")]
            if "epoch" in tis:  # the fused DAG: process + commit + validate in the task "epoch"
                proc = (api.xcom(r["dag_run_id"], "epoch") or {}).get("process") or {}
            else:
                proc = api.xcom(r["dag_run_id"], "process") or {}
            wall = max(ends) - min(starts)
            rows.append({"run": r["dag_run_id"], "logical_date": r["logical_date"], "wall_s": round(wall, 2),
                         "start": min(starts), "end": max(ends),
                         "tasks_s": {k: round(t["duration"] or 0.0, 2) for k, t in tis.items()},
                         "rounds_s": proc.get("rounds_s", 0.0), "spark_start_s": proc.get("spark_start_s", 0.0),
                         "overhead_s": round(wall - float(proc.get("rounds_s", 0.0)), 2)})
        rows.sort(key=lambda x: x["start"])
        steady = rows[1:] or rows
        span = rows[-1]["end"] - rows[0]["start"]
        out = {"mode": mode, "epochs": len(rows), "orders_per_epoch": a.orders_per_epoch,
               "overhead_median_s": round(statistics.median(x["overhead_s"] for x in steady), 2),
               "wall_median_s": round(statistics.median(x["wall_s"] for x in steady), 2),
               "rounds_median_s": round(statistics.median(x["rounds_s"] for x in steady), 2),
               "process_task_median_s": round(statistics.median(
                   x["tasks_s"].get("process", x["tasks_s"].get("epoch", 0)) for x in steady), 2),
               "load_avg": [round(x, 2) for x in os.getloadavg()],
               "spark_start_median_s": round(statistics.median(x["spark_start_s"] for x in steady), 2),
               "catchup_s_per_epoch": round(span / len(rows), 1),
               "first_run_after_unpause_s": round(rows[0]["start"] - t_unpause, 1), "runs": rows}
        say(f"{mode}: overhead median {out['overhead_median_s']} s per epoch (wall {out['wall_median_s']} s, "
            f"rounds {out['rounds_median_s']} s, Spark start {out['spark_start_median_s']} s); catch-up "
            f"{out['catchup_s_per_epoch']} s per 60-s epoch")
        return out
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=180)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--orders-per-epoch", type=int, default=500)
    ap.add_argument("--modes", default="classic,connect")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for Airflow, e.g. AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME=0.2")
    ap.add_argument("--results", default=str(REPO / "bench-results"))
    a = ap.parse_args()
    results = [measure(m.strip(), a) for m in a.modes.split(",") if m.strip()]
    print()
    print("| Spark / DAG | runs | Airflow overhead per epoch (median) | run wall | rounds (Spark) | process task "
          "| Spark start/connect | catch-up s per 60-s epoch | load avg (1 min) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        label = LABELS.get(r["mode"], r["mode"])
        print(f"| {label} | {r['epochs']} | {r['overhead_median_s']:.1f} s | {r['wall_median_s']:.1f} s | "
              f"{r['rounds_median_s']:.1f} s | {r['process_task_median_s']:.1f} s | {r['spark_start_median_s']:.1f} s "
              f"| {r['catchup_s_per_epoch']:.1f} | {r['load_avg'][0]:.1f} |")
    os.makedirs(a.results, exist_ok=True)
    path = os.path.join(a.results, f"airflow-overhead-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"\nJSON: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
