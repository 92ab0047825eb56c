"""Benchmark: what does ``epochal savepoint`` cost? (prints figures; not a test)

    .venv/bin/python benchmarks/savepoint_cost.py                               # this checkout
    .venv/bin/python benchmarks/savepoint_cost.py --code /path/to/other/checkout --root /tmp/sp-before

The demo job (``orders_payments``) runs ``--epochs`` epochs with its checkpoints and sinks on S3 (a moto server in a
child process; sources local), then ``python -m pipeline savepoint`` runs in a fresh process. Printed: the savepoint
command's wall time and process-tree CPU (:func:`benchmarks.validate_cost.run_measured`), the S3 requests **the moto
server received** during the command (its request log, counted by method: this counts the executors' and the table
formats' requests too, and does not trust moto's speed), the state size, and ``/proc/loadavg`` before and after.
``--code`` runs the CLI from another checkout (e.g. one before the savepoint copied the state: an idle Spark round).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.validate_cost import loadavg, run_measured  # noqa: E402

_REQ = re.compile(r'"(GET|PUT|POST|HEAD|DELETE) ([^ ]*) HTTP/1\.[01]"')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _requests(log: Path, start: int) -> tuple[dict[str, int], int]:
    """Requests per method in the moto log after byte offset ``start``; the new offset."""
    data = log.read_bytes()
    counts: dict[str, int] = {}
    for m in _REQ.finditer(data[start:].decode("utf-8", "replace")):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts, len(data)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="/tmp/epochal-savepoint-cost")
    ap.add_argument("--code", default=str(REPO), help="the checkout whose CLI runs (default: this one)")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--orders-per-epoch", type=int, default=2000)
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--savepoints", type=int, default=2, help="savepoints taken one after the other")
    a = ap.parse_args(argv)
    root = Path(a.root)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    port = _free_port()
    mlog = root / "moto.log"
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=open(mlog, "w"), stderr=subprocess.STDOUT)
    try:
        from pipeline.testing.moto_server import s3_env
        endpoint = f"http://127.0.0.1:{port}"
        aws = s3_env(endpoint)
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        import boto3
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=aws["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=aws["AWS_SECRET_ACCESS_KEY"],
                     region_name=aws["AWS_DEFAULT_REGION"]).create_bucket(Bucket="bench")
        from pipeline.demo.generate import generate
        generate((root / "src").as_uri(), epochs=a.epochs + 1, partitions=2, orders_per_epoch=a.orders_per_epoch,
                 seed=7)
        env = {**os.environ, **aws, "PYTHONPATH": a.code, "PIPELINE_SOURCE_URI": (root / "src").as_uri(),
               "PIPELINE_CHECKPOINT_URI": "s3://bench/ckpt", "PIPELINE_SINK_URI": "s3://bench/sink",
               "PIPELINE_PARALLELISM": str(a.parallelism), "EPOCHAL_HOME": str(root / "home")}
        py = [sys.executable, "-m", "pipeline"]
        run = run_measured(py + ["run", "--job", "orders_payments", "--epochs", str(a.epochs)], env, root / "run.log",
                           cwd=a.code)
        print(f"run: {run}", flush=True)
        _, off = _requests(mlog, 0)
        rows = []
        for i in range(a.savepoints):
            m = run_measured(py + ["savepoint", "--job", "orders_payments", "--json"], env, root / f"sp{i}.log",
                             cwd=a.code)
            reqs, off = _requests(mlog, off)
            out = (root / f"sp{i}.log").read_text()
            found = re.search(r'"savepoint": "([^"]+)"', out)
            loc = found.group(1) if found else None
            row = {**m, "moto_requests": reqs, "moto_total": sum(reqs.values()), "savepoint": loc}
            rows.append(row)
            print(f"savepoint {i + 1}: {m['wall_s']} s wall / {m['cpu_s']} s CPU, {sum(reqs.values())} S3 requests "
                  f"at the server {reqs} (load {m['load_before']} -> {m['load_after']}, rc {m['rc']}) -> {loc}",
                  flush=True)
        (root / "savepoint_cost.json").write_text(json.dumps({"code": a.code, "run": run, "savepoints": rows,
                                                              "load_end": loadavg()}, indent=1))
        print(f"figures: {root / 'savepoint_cost.json'}")
    finally:
        moto.terminate()
        moto.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
