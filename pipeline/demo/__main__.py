"""The Epochal demo (README command 1): ``python -m pipeline.demo``.

1. starts a moto S3 server on loopback (a separate process),
2. generates the demo data for ``orders_payments`` into ``s3://epochal-demo/sources``,
3. runs the job through its epochs with a checkpoint every epoch, and SIGKILLs it once mid-epoch
   (the whole process group: driver, JVM, Python workers),
4. resumes from the latest completed checkpoint and finishes,
5. exports the committed output and checks it against an independent recomputation from the input
   files (pyarrow/pandas, not the project's code path), and prints a summary.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time

from pipeline.demo.generate import generate
from pipeline.demo.oracle import compare, expected
from pipeline.sink.delta import delta_storage_options
from pipeline.testing.jobproc import run_job_process
from pipeline.testing.moto_server import spawn_moto_server

__all__ = ["main"]


def _say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Over 80 lines: the demo's script in the order a user watches it (generate, run, kill, restore, validate, print);
    each step is a call."""
    ap = argparse.ArgumentParser(prog="python -m pipeline.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orders", type=int, default=240_000, help="orders in total")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--epoch-seconds", type=int, default=60)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--crash-after", type=int, default=4, help="SIGKILL during the epoch after this checkpoint")
    ap.add_argument("--no-crash", action="store_true")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workdir", default=os.path.join(os.getcwd(), ".epochal", "demo"))
    ap.add_argument("--file", action="store_true", help="use file:// under --workdir instead of moto S3")
    a = ap.parse_args(argv)


    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir, exist_ok=True)
    moto = None
    env: dict[str, str] = {}
    try:
        if a.file:
            root = "file://" + os.path.abspath(a.workdir)
        else:
            _say("starting moto S3 on loopback ...")
            moto = spawn_moto_server(["epochal-demo"])
            env.update(moto.env())
            os.environ.update(env)
            root = "s3://epochal-demo"
            _say(f"S3 endpoint {moto.endpoint_url} (bucket epochal-demo)")
        src, ckpt, sink = f"{root}/sources", f"{root}/checkpoints", f"{root}/sinks"
        env.update({"PIPELINE_SOURCE_URI": src, "PIPELINE_CHECKPOINT_URI": ckpt, "PIPELINE_SINK_URI": sink,
                    "PIPELINE_EPOCH_SECONDS": str(a.epoch_seconds), "PIPELINE_PARALLELISM": str(a.parallelism),
                    "PYSPARK_PYTHON": sys.executable})
        t = time.time()
        g = generate(src, epochs=a.epochs, partitions=a.partitions, orders_per_epoch=a.orders // a.epochs,
                     seed=a.seed, epoch_seconds=a.epoch_seconds)
        events = sum(g.rows.values())
        _say(f"generated {g.rows} ({events} events, {a.epochs} epochs x {a.partitions} partitions) "
             f"in {time.time() - t:.1f}s into {src}")

        rounds: list[dict] = []
        crashed = None
        if not a.no_crash:
            seen = {"completed": 0}

            def kill_when(line: str) -> bool:
                if "checkpoint" in line and "completed" in line and line.startswith("checkpoint"):
                    seen["completed"] += 1
                return seen["completed"] >= a.crash_after and line.startswith("EPOCHAL_PHASE")

            delay = random.Random(a.seed).uniform(0.0, 1.5)
            _say(f"run 1: will SIGKILL the job {delay:.2f}s into the epoch after checkpoint {a.crash_after}")
            r1 = run_job_process(["run", "--job", "orders_payments", "--json"], env, kill_when=kill_when,
                                 kill_delay_s=delay, echo=lambda l: print("   | " + l, flush=True))
            if r1.killed:
                crashed = r1.killed_at
                _say(f"SIGKILLed the job process group (last marker: {r1.killed_at}); exit code {r1.returncode}")
            elif r1.returncode != 0:
                _say("run 1 failed:\n" + "\n".join(r1.stderr_lines[-20:]))
                return 1
            else:
                rounds += json.loads(r1.stdout)["rounds"]
        _say("run 2: resuming from the latest completed checkpoint ..." if crashed else "run: processing ...")
        r2 = run_job_process(["run", "--job", "orders_payments", "--json"], env,
                             echo=lambda l: print("   | " + l, flush=True))
        if r2.returncode != 0:
            _say("resume failed:\n" + "\n".join(r2.stderr_lines[-30:]))
            return 1
        rep2 = json.loads(r2.stdout)
        rounds += rep2["rounds"]
        out = os.path.join(a.workdir, "export")
        for table in ("paid_orders", "merchant_revenue"):
            r = run_job_process(["export", "--job", "orders_payments", "--table", table,
                                 "--to", os.path.join(out, table), "--json"], env)
            if r.returncode != 0:
                _say(f"export {table} failed:\n" + "\n".join(r.stderr_lines[-20:]))
                return 1
        lst = run_job_process(["checkpoints", "list", "--job", "orders_payments", "--json"], env)
        cps = json.loads(lst.stdout) if lst.returncode == 0 else []
        t = time.time()
        report = compare(expected(src), os.path.join(out, "paid_orders"), os.path.join(out, "merchant_revenue"))
        oracle_s = time.time() - t
        delta = _delta_report(sink, expected(src)) if _sinks_are_delta(env) else None
        rd = report.to_dict()
        processing_s = sum(r["duration_s"] for r in rounds)
        completed = [r for r in rounds if r["completed"]]
        print()
        print("=" * 78)
        print("Epochal demo summary: job orders_payments")
        print(f"  storage              : {'moto S3 ' + moto.endpoint_url if moto else root}")
        print(f"  epochs               : {a.epochs} x {a.epoch_seconds}s, {a.partitions} partitions per source")
        print(f"  events               : {events} (orders {g.rows['orders']}, payments {g.rows['payments']})")
        print(f"  crash                : {'SIGKILL at ' + str(crashed) + ', resumed from the latest checkpoint' if crashed else 'none'}")
        print(f"  checkpoints completed: {len(completed)} after the crash+resume "
              f"(retained now: {[c['id'] for c in cps if c.get('status') == 'COMPLETED']})")
        if processing_s:
            ev = sum(sum(r['records'].values()) for r in completed)
            print(f"  throughput           : {ev / processing_s:,.0f} events/s over {processing_s:.1f}s of rounds "
                  "(after the crash; JVM start excluded)")
        if completed:
            durs = [r["checkpoint_s"] * 1000 for r in completed]
            sizes = [r["state_bytes"] for r in completed]
            print(f"  checkpoint finalize  : min {min(durs):.0f} ms, max {max(durs):.0f} ms "
                  "(ack + _metadata + sink commit)")
            print(f"  state size           : {min(sizes) / 1024:.0f} KiB .. {max(sizes) / 1024:.0f} KiB per checkpoint")
        for c in cps:
            if c.get("status") == "COMPLETED":
                written = c.get("checkpointed_bytes", c["state_bytes"])   # below the full size once deltas apply
                print(f"    chk-{c['id']:<4} epoch {c['epoch']} duration {c['duration_ms']:.0f} ms, "
                      f"checkpointed {written / 1024:.0f} KiB of full size {c['state_bytes'] / 1024:.0f} KiB "
                      f"(docs/state.md), acks {c['acks']}")
        po, mr = rd["paid_orders"], rd["merchant_revenue"]
        print(f"  paid_orders          : {po['actual_rows']} rows (expected {po['expected_rows']}), "
              f"missing {po['missing']}, extra {po['extra']}, duplicates {po['duplicates']}")
        print(f"  merchant_revenue     : {mr['actual_rows']} rows (expected {mr['expected_rows']}), "
              f"missing {mr['missing']}, extra {mr['extra']}")
        print(f"  oracle               : independent pyarrow/pandas recomputation in {oracle_s:.1f}s")
        if delta is not None:
            d = delta.to_dict()
            print(f"  Delta tables (delta-rs): paid_orders {d['paid_orders']['actual_rows']} rows, merchant_revenue "
                  f"{d['merchant_revenue']['actual_rows']} rows, read directly from {sink}/orders_payments/: "
                  f"{'same as the oracle' if delta.ok else 'DIFFERENT from the oracle'}")
        ok = report.ok and (delta is None or delta.ok)
        print(f"  OUTPUT CORRECT       : {'YES - exactly once' if ok else 'NO'}")
        print("=" * 78)
        return 0 if ok else 1
    finally:
        if moto is not None:
            moto.stop()


def _sinks_are_delta(env: dict) -> bool:
    """The demo job writes Delta tables unless PIPELINE_SINK_FORMAT says otherwise."""
    return env.get("PIPELINE_SINK_FORMAT", os.environ.get("PIPELINE_SINK_FORMAT", "")).strip().lower() in ("", "delta")


def _delta_report(sink: str, exp):
    """The committed Delta tables read by delta-rs itself (what Spark, DuckDB or Trino would see), vs the oracle.
    S3 settings come from the ``AWS_*`` environment (set for the demo's moto server)."""
    from deltalake import DeltaTable

    tables = {}
    for table in ("paid_orders", "merchant_revenue"):
        uri = f"{sink.rstrip('/')}/orders_payments/{table}"
        location = uri[len("file://"):] if uri.startswith("file://") else uri
        tables[table] = DeltaTable(location, storage_options=delta_storage_options(uri)).to_pyarrow_table()
    return compare(exp, tables)


if __name__ == "__main__":
    sys.exit(main())
