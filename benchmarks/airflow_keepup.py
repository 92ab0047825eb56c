"""Does an Airflow epoch DAG keep up with 1-minute epochs? (figures, not a timed test)

Starts the standalone Airflow (``scripts/airflow_standalone.sh``: moto S3, Spark Connect server, scheduler,
LocalExecutor) with a 60-s epoch schedule and a couple of epochs of history, then for ``--minutes`` feeds the
demo sources live - epoch ``r``'s files are appended (``pipeline.demo.generate --append``) right after the
epoch ends on the wall clock, as a real source would deliver them - and samples, every ``--sample-seconds``:

    lag = now - end of the newest epoch whose DAG run succeeded

A DAG that keeps up has a bounded lag: it drops to (trigger wait + run time) after each run and rises to about
one epoch + that before the next run completes; a DAG that falls behind has a lag that grows by the
shortfall every minute. Per run it also reports the completion delay (last task end - data interval end).

The sources' allowed lateness (``--lateness``, default 10 s) is how long ``trigger`` waits for rows at/after
the barrier before it treats a partition as idle; the feeder writes each epoch within it.

    .venv/bin/python benchmarks/airflow_keepup.py [--minutes 10] [--mode fused|connect|classic]
        [--orders-per-epoch 500] [--set KEY=VALUE ...]

Prints the lag over time and a summary (``--from-json PATH`` summarises a stored run again); the JSON goes to
bench-results/. Exit status 0 if the DAG kept up.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from airflow_overhead import SCRIPT, Api, _ts, say  # noqa: E402

from pipeline.testing.cluster import free_port  # noqa: E402

E = 60
SOURCES = "s3://epochal/demo/sources"


class Feeder(threading.Thread):
    """Appends each epoch of the demo timeline ``delay`` seconds after it ends on the wall clock."""

    def __init__(self, endpoint: str, delay: float) -> None:
        super().__init__(daemon=True)
        self.endpoint, self.delay = endpoint, delay
        self.stop = threading.Event()
        self.fed: list[dict] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            from pipeline.demo.generate import GeneratorConfig, _load_state, generate
            while not self.stop.is_set():
                state = _load_state(SOURCES)
                assert state is not None, f"no generator state under {SOURCES}"
                cfg = GeneratorConfig(**state["config"])
                end_s = (cfg.start_us + (int(state["epochs"]) + 1) * cfg.epoch_us) / 1e6
                wait = end_s + self.delay - time.time()
                if wait > 0:
                    self.stop.wait(min(wait, 5.0))
                    continue
                t0 = time.time()
                generate(SOURCES, append=True, epochs=1)
                self.fed.append({"epoch_end": end_s, "written_at": round(time.time(), 2),
                                 "write_s": round(time.time() - t0, 2)})
        except BaseException as e:  # reported by the main loop
            self.error = e


def summarize(out: dict) -> None:
    """Steady state = from the first sample at which the history and the start-up backlog were caught up (lag
    below two epochs). It keeps up if every run of an interval ending in the steady state completed within one
    epoch of its interval's end and the lag never reached two epochs again."""
    samples, per_run = out["samples"], out["runs"]
    first_ok = next((i for i, s in enumerate(samples) if s["lag_s"] is not None and s["lag_s"] < 2 * E), None)
    steady_at = samples[first_ok]["now"] if first_ok is not None else None
    window = [s for s in samples[first_ok:] if s["lag_s"] is not None] if first_ok is not None else []
    steady = [x for x in per_run if steady_at is not None and x["interval_end"] >= steady_at]
    delays = [x["completion_delay_s"] for x in steady]
    out.update({
        "caught_up_after_s": samples[first_ok]["t"] if first_ok is not None else None,
        "steady_runs": len(steady),
        "completion_delay_median_s": round(statistics.median(delays), 1) if delays else None,
        "completion_delay_max_s": max(delays, default=None),
        "start_delay_median_s": round(statistics.median(x["first_task_start"] - x["interval_end"] for x in steady), 1)
        if steady else None,
        "lag_median_s": round(statistics.median(s["lag_s"] for s in window), 1) if window else None,
        "lag_max_s": max((s["lag_s"] for s in window), default=None),
        "lag_last_s": samples[-1]["lag_s"] if samples else None,
        "load_avg_median": round(statistics.median(s["load_avg"] for s in samples), 2) if samples else None})
    out["keeps_up"] = bool(steady) and all(d < E for d in delays) and all(s["lag_s"] < 2 * E for s in window)
    print()
    print("| minute | lag samples (s) | runs succeeded | load avg |")
    print("|---:|---|---:|---:|")
    by_min: dict[int, list[dict]] = {}
    for s in samples:
        by_min.setdefault(int(s["t"] // 60), []).append(s)
    for m, ss in sorted(by_min.items()):
        lags = [s["lag_s"] for s in ss if s["lag_s"] is not None]
        print(f"| {m} | {', '.join(f'{x:.0f}' for x in lags)} | {ss[-1]['succeeded']} | {ss[-1]['load_avg']:.1f} |")
    print()
    print(f"mode {out['mode']}: caught up {out['caught_up_after_s']} s after the unpause; then {out['steady_runs']} "
          f"runs: first task {out['start_delay_median_s']} s after the interval end (median), completion delay "
          f"(interval end -> last task end) median {out['completion_delay_median_s']} s, max "
          f"{out['completion_delay_max_s']} s; lag median {out['lag_median_s']} s, max {out['lag_max_s']} s, last "
          f"{out['lag_last_s']} s; keeps up: {out['keeps_up']} (load avg median {out['load_avg_median']})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--mode", default="fused", choices=("fused", "connect", "classic"))
    ap.add_argument("--orders-per-epoch", type=int, default=500)
    ap.add_argument("--history-epochs", type=int, default=2, help="epochs of data before the start (caught up first)")
    ap.add_argument("--lateness", type=int, default=10, help="PIPELINE_ALLOWED_LATENESS_SECONDS of the sources")
    ap.add_argument("--feed-delay", type=float, default=1.0, help="seconds after an epoch's end its files are written")
    ap.add_argument("--sample-seconds", type=float, default=10)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra environment for Airflow")
    ap.add_argument("--results", default=str(REPO / "bench-results"))
    ap.add_argument("--from-json", metavar="PATH", help="only summarise the JSON of an earlier run")
    a = ap.parse_args()
    if a.from_json:
        stored = json.loads(Path(a.from_json).read_text())
        summarize(stored)
        return 0 if stored["keeps_up"] else 1

    home = Path(tempfile.mkdtemp(prefix=f"airflow-keepup-{a.mode}-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PIPELINE_", "AWS_", "EPOCHAL_"))}
    env.update({"EPOCHAL_AIRFLOW_HOME": str(home), "AIRFLOW_PORT": str(port), "PIPELINE_EPOCH_SECONDS": str(E),
                "EPOCHAL_DEMO_EPOCHS": str(a.history_epochs), "EPOCHAL_DEMO_ORDERS_PER_EPOCH": str(a.orders_per_epoch),
                "EPOCHAL_DEMO_PARTITIONS": "2", "PIPELINE_PARALLELISM": "2", "EPOCHAL_CATCHUP": "true",
                "EPOCHAL_POKE_SECONDS": "2", "EPOCHAL_READY_TIMEOUT": "600",
                "PIPELINE_ALLOWED_LATENESS_SECONDS": str(a.lateness)})
    if a.mode in ("fused", "connect"):
        env.update({"EPOCHAL_SPARK_CONNECT": "1", "EPOCHAL_CONNECT_PORT": str(free_port()),
                    "EPOCHAL_CONNECT_MASTER": "local[2]"})
    if a.mode == "fused":
        env["EPOCHAL_FUSED_EPOCH"] = "1"
    env.update(dict(kv.split("=", 1) for kv in a.set))
    say(f"keep-up ({a.mode}): starting airflow standalone (home {home}, port {port}) ...")
    p = subprocess.run(["bash", str(SCRIPT), "start", "-d"], env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, timeout=180)
        raise RuntimeError(f"airflow_standalone.sh start failed:\n{p.stderr[-3000:]}")
    state_dir = home / "epochal-standalone"
    endpoint = (state_dir / "endpoint").read_text().strip()
    os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"})
    feeder = Feeder(endpoint, a.feed_delay)
    samples: list[dict] = []
    try:
        password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
        api = Api(f"http://127.0.0.1:{port}", password)
        feeder.start()
        api.unpause()
        t_start = time.time()
        say(f"keep-up ({a.mode}): DAG unpaused; sampling the lag for {a.minutes:g} min")
        last_print = 0.0
        while time.time() < t_start + a.minutes * 60:
            if feeder.error is not None:
                raise RuntimeError(f"feeder failed: {feeder.error!r}")
            runs = [r for r in api.runs() if r["run_type"] == "scheduled"]
            failed = [r["dag_run_id"] for r in runs if r["state"] == "failed"]
            done = [r for r in runs if r["state"] == "success"]
            now = time.time()
            newest = max((_ts(r["data_interval_end"]) or 0.0 for r in done), default=None)
            s = {"t": round(now - t_start, 1), "now": round(now, 2), "load_avg": round(os.getloadavg()[0], 2),
                 "lag_s": round(now - newest, 1) if newest else None, "succeeded": len(done),
                 "active": sum(r["state"] in ("queued", "running") for r in runs), "failed": failed}
            samples.append(s)
            if failed:
                raise RuntimeError(f"failed runs: {failed}")
            if now - last_print >= 30:
                say(f"t={s['t']:>5.0f}s lag={s['lag_s']} s, runs succeeded {s['succeeded']}, active {s['active']}, "
                    f"load {s['load_avg']}")
                last_print = now
            time.sleep(a.sample_seconds)
        runs = [r for r in api.runs() if r["run_type"] == "scheduled" and r["state"] == "success"]
        per_run = []
        for r in runs:
            tis = api.tis(r["dag_run_id"])
            ends = [_ts(t["end_date"]) for t in tis.values() if t.get("end_date")]
            starts = [_ts(t["start_date"]) for t in tis.values() if t.get("start_date")]
            end_iv = _ts(r["data_interval_end"])
            assert end_iv is not None
            per_run.append({"run": r["dag_run_id"], "interval_end": end_iv, "first_task_start": min(starts),
                            "last_task_end": max(ends), "completion_delay_s": round(max(ends) - end_iv, 1),
                            "tasks_s": {k: round(t["duration"] or 0.0, 2) for k, t in tis.items()}})
        per_run.sort(key=lambda x: x["interval_end"])
        out = {"mode": a.mode, "minutes": a.minutes, "orders_per_epoch": a.orders_per_epoch, "lateness_s": a.lateness,
               "feed_delay_s": a.feed_delay, "set": a.set, "unpaused_at": t_start, "ended_at": time.time(),
               "samples": samples, "runs": per_run, "fed": feeder.fed}
    finally:
        feeder.stop.set()
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=180)
    summarize(out)
    os.makedirs(a.results, exist_ok=True)
    path = os.path.join(a.results, f"airflow-keepup-{a.mode}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(f"JSON: {path}")
    return 0 if out["keeps_up"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
