"""Does the default Airflow epoch DAG keep up with 30-second epochs? (figures, not a timed test)

Starts the standalone Airflow (``scripts/airflow_standalone.sh`` with its defaults: moto S3, a Spark Connect server,
the fused epoch DAG ``trigger >> epoch``, scheduler, LocalExecutor) with an ``--epoch-seconds`` schedule (30) and a
couple of epochs of history, then for ``--minutes`` feeds the demo sources live - epoch ``r``'s files are appended
(``pipeline.demo.generate --append``) right after the epoch ends on the wall clock, as a real source would deliver
them - and samples, every ``--sample-seconds``:

    lag = now - end of the newest epoch whose DAG run succeeded

A DAG that keeps up has a bounded lag: it drops to (lateness + run time) after each run and rises to about one
epoch + that before the next run completes; a DAG that falls behind has a lag that grows by the shortfall every
epoch. The **steady state** starts at the first sample after the history and the start-up backlog were caught up
(lag below two epochs); it is *observed* if at least 5 runs ended in it, every one within an epoch of its
interval's end, the lag stayed below two epochs, and the lag's peaks did not grow (the last third's highest sample
is at most 5 s above the first third's). Per run in the steady state it reports:

    completion delay = last task end - interval end
    overhead         = last task end - max(first task start, interval end + allowed lateness) - Spark rounds

i.e. what Airflow and Epochal add to the epoch's Spark rounds (``rounds_s`` in the process step's XCom) once the
epoch may be processed: the scheduler's hops, task starts, the trigger's listings and barrier log, the commit and
validation, minus nothing else. The trigger waits out the sources' allowed lateness (``--lateness``, default 5 s;
the feeder writes each epoch 1 s after its end, and no row past the barrier arrives before the next epoch's files);
that wait is the user's setting, not overhead.

Modes: ``default`` (whatever the script and ``build_epoch_dag`` give by default), ``fused`` (explicitly: the fused
DAG on Spark Connect), ``connect`` (four tasks on Spark Connect), ``classic`` (four tasks, a driver JVM per task).

    .venv/bin/python benchmarks/airflow_keepup.py [--epoch-seconds 30] [--minutes 10] [--mode default]
        [--orders-per-epoch 500] [--lateness 5] [--set KEY=VALUE ...]

Prints the lag over time and a summary with the load average (``--from-json PATH`` summarises a stored run again);
the JSON goes to bench-results/. Exit status 0 if a steady state was observed and the median overhead per epoch
was at most ``--overhead-target`` (3 s).
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


def _steady_state(samples: list[dict], per_run: list[dict], E: int) -> dict:
    """Where the steady state starts, its runs and whether it was observed (module docstring)."""
    first_ok = next((i for i, s in enumerate(samples) if s["lag_s"] is not None and s["lag_s"] < 2 * E), None)
    steady_at = samples[first_ok]["now"] if first_ok is not None else None
    window = [s for s in samples[first_ok:] if s["lag_s"] is not None] if first_ok is not None else []
    steady = [x for x in per_run if steady_at is not None and x["interval_end"] >= steady_at]
    third = len(window) // 3
    peaks_flat = bool(third) and max(s["lag_s"] for s in window[-third:]) <= max(s["lag_s"] for s in window[:third]) + 5
    delays = [x["completion_delay_s"] for x in steady]
    keeps_up = bool(steady) and all(d < E for d in delays) and all(s["lag_s"] < 2 * E for s in window)
    return {"first_ok": first_ok, "window": window, "steady": steady, "keeps_up": keeps_up,
            "steady_state_observed": keeps_up and len(steady) >= 5 and peaks_flat, "lag_peaks_flat": peaks_flat}


def _q(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def summarize(out: dict) -> None:
    samples, per_run, E = out["samples"], out["runs"], int(out.get("epoch_seconds", 60))
    st = _steady_state(samples, per_run, E)
    steady, window = st["steady"], st["window"]
    delays = [x["completion_delay_s"] for x in steady]
    overheads = [x["overhead_s"] for x in steady if x.get("overhead_s") is not None]
    rounds = [x["rounds_s"] for x in steady if x.get("rounds_s") is not None]
    first_ok = st["first_ok"]
    out.update({
        "caught_up_after_s": samples[first_ok]["t"] if first_ok is not None else None,
        "steady_runs": len(steady),
        "completion_delay_median_s": round(statistics.median(delays), 1) if delays else None,
        "completion_delay_max_s": max(delays, default=None),
        "start_delay_median_s": round(statistics.median(x["first_task_start"] - x["interval_end"] for x in steady), 1)
        if steady else None,
        "overhead_median_s": round(statistics.median(overheads), 2) if overheads else None,
        "overhead_p90_s": _q(overheads, 0.9), "overhead_max_s": max(overheads, default=None),
        "rounds_median_s": round(statistics.median(rounds), 2) if rounds else None,
        "lag_median_s": round(statistics.median(s["lag_s"] for s in window), 1) if window else None,
        "lag_max_s": max((s["lag_s"] for s in window), default=None),
        "lag_last_s": samples[-1]["lag_s"] if samples else None,
        "load_avg_median": round(statistics.median(s["load_avg"] for s in samples), 2) if samples else None,
        "load_avg_range": [min(s["load_avg"] for s in samples), max(s["load_avg"] for s in samples)] if samples
        else None,
        "keeps_up": st["keeps_up"], "steady_state_observed": st["steady_state_observed"],
        "lag_peaks_flat": st["lag_peaks_flat"]})
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
    print("| run (interval end, UTC) | first task start (s after end) | completion delay (s) | Spark rounds (s) "
          "| overhead (s) | tasks (s) |")
    print("|---|---:|---:|---:|---:|---|")
    for x in steady:
        end = time.strftime("%H:%M:%S", time.gmtime(x["interval_end"]))
        print(f"| {end} | {x['first_task_start'] - x['interval_end']:.1f} | {x['completion_delay_s']:.1f} | "
              f"{x.get('rounds_s', 0.0):.1f} | {x.get('overhead_s')} | "
              + ", ".join(f"{k} {v:.1f}" for k, v in x["tasks_s"].items()) + " |")
    print()
    print(f"mode {out['mode']}, {E}-s epochs, lateness {out.get('lateness_s')} s: caught up "
          f"{out['caught_up_after_s']} s after the unpause; then {out['steady_runs']} runs: first task "
          f"{out['start_delay_median_s']} s after the interval end (median), completion delay (interval end -> last "
          f"task end) median {out['completion_delay_median_s']} s, max {out['completion_delay_max_s']} s; Spark rounds "
          f"median {out['rounds_median_s']} s; overhead per epoch median {out['overhead_median_s']} s, p90 "
          f"{out['overhead_p90_s']} s, max {out['overhead_max_s']} s; lag median {out['lag_median_s']} s, max "
          f"{out['lag_max_s']} s, last {out['lag_last_s']} s; keeps up: {out['keeps_up']}; steady state observed: "
          f"{out['steady_state_observed']} (load avg median {out['load_avg_median']}, range {out['load_avg_range']}, "
          f"{os.cpu_count()} CPUs)")


MODES = {"default": {},
         "fused": {"EPOCHAL_SPARK_CONNECT": "1", "EPOCHAL_FUSED_EPOCH": "true"},
         "connect": {"EPOCHAL_SPARK_CONNECT": "1", "EPOCHAL_FUSED_EPOCH": "false"},
         "classic": {"EPOCHAL_SPARK_CONNECT": "0", "EPOCHAL_FUSED_EPOCH": "false"}}


def _per_run(api: Api, r: dict, lateness: float) -> dict:
    tis = api.tis(r["dag_run_id"])
    ends = [_ts(t["end_date"]) for t in tis.values() if t.get("end_date")]
    starts = [_ts(t["start_date"]) for t in tis.values() if t.get("start_date")]
    end_iv = _ts(r["data_interval_end"])
    assert end_iv is not None
    if "epoch" in tis:  # the fused DAG: process + commit + validate in the task "epoch"
        x = api.xcom(r["dag_run_id"], "epoch") or {}
        proc, keepup = x.get("process") or {}, x.get("keepup")
    else:
        proc, keepup = api.xcom(r["dag_run_id"], "process") or {}, (api.xcom(r["dag_run_id"], "validate") or {}).get(
            "keepup")
    last, first = max(e for e in ends if e is not None), min(s for s in starts if s is not None)
    rounds = float(proc.get("rounds_s") or 0.0)
    return {"run": r["dag_run_id"], "interval_end": end_iv, "first_task_start": first, "last_task_end": last,
            "completion_delay_s": round(last - end_iv, 1), "rounds_s": round(rounds, 2),
            "spark_start_s": proc.get("spark_start_s"), "epochs": proc.get("epochs"),
            "overhead_s": round(last - max(first, end_iv + lateness) - rounds, 2), "keepup_logged": keepup,
            "tasks_s": {k: round(t["duration"] or 0.0, 2) for k, t in tis.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epoch-seconds", type=int, default=30)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--mode", default="default", choices=tuple(MODES))
    ap.add_argument("--orders-per-epoch", type=int, default=500)
    ap.add_argument("--history-epochs", type=int, default=2, help="epochs of data before the start (caught up first)")
    ap.add_argument("--lateness", type=int, default=5, help="PIPELINE_ALLOWED_LATENESS_SECONDS of the sources")
    ap.add_argument("--feed-delay", type=float, default=1.0, help="seconds after an epoch's end its files are written")
    ap.add_argument("--sample-seconds", type=float, default=5)
    ap.add_argument("--overhead-target", type=float, default=3.0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra environment for Airflow")
    ap.add_argument("--results", default=str(REPO / "bench-results"))
    ap.add_argument("--from-json", metavar="PATH", help="only summarise the JSON of an earlier run")
    a = ap.parse_args()
    if a.from_json:
        stored = json.loads(Path(a.from_json).read_text())
        summarize(stored)
        return _status(stored, a.overhead_target)

    E = a.epoch_seconds
    home = Path(tempfile.mkdtemp(prefix=f"airflow-keepup-{a.mode}-"))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PIPELINE_", "AWS_", "EPOCHAL_"))}
    env.update({"EPOCHAL_AIRFLOW_HOME": str(home), "AIRFLOW_PORT": str(port), "PIPELINE_EPOCH_SECONDS": str(E),
                "EPOCHAL_DEMO_EPOCHS": str(a.history_epochs), "EPOCHAL_DEMO_ORDERS_PER_EPOCH": str(a.orders_per_epoch),
                "EPOCHAL_DEMO_PARTITIONS": "2", "PIPELINE_PARALLELISM": "2", "EPOCHAL_READY_TIMEOUT": "600", "PIPELINE_ALLOWED_LATENESS_SECONDS": str(a.lateness),
                "EPOCHAL_CONNECT_PORT": str(free_port()), "EPOCHAL_CONNECT_MASTER": "local[2]"})
    env.update(MODES[a.mode])
    env.update(dict(kv.split("=", 1) for kv in a.set))
    say(f"keep-up ({a.mode}, {E}-s epochs): starting airflow standalone (home {home}, port {port}) ...")
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
        per_run = sorted((_per_run(api, r, a.lateness) for r in runs), key=lambda x: x["interval_end"])
        out = {"mode": a.mode, "epoch_seconds": E, "minutes": a.minutes, "orders_per_epoch": a.orders_per_epoch,
               "lateness_s": a.lateness, "feed_delay_s": a.feed_delay, "set": a.set, "unpaused_at": t_start,
               "ended_at": time.time(), "samples": samples, "runs": per_run, "fed": feeder.fed,
               "env": {k: v for k, v in env.items() if k.startswith(("EPOCHAL_", "PIPELINE_"))}}
    finally:
        feeder.stop.set()
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=180)
    summarize(out)
    os.makedirs(a.results, exist_ok=True)
    path = os.path.join(a.results, f"airflow-keepup-{a.mode}-{E}s-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(f"JSON: {path}")
    return _status(out, a.overhead_target)


def _status(out: dict, target: float) -> int:
    ok = bool(out.get("steady_state_observed")) and (out.get("overhead_median_s") or 1e9) <= target
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
