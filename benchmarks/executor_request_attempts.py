#!/usr/bin/env python3
"""Experiment: do Spark accumulators count the S3 requests of Python workers exactly (mapInArrow, mapInPandas),
and what happens to the requests of a task attempt that fails and is retried?

    .venv/bin/python benchmarks/executor_request_attempts.py [--tasks 4]

A classic local session ``local[2,4]`` (two cores, up to 4 attempts per task), a moto S3 server (child process,
loopback) behind a counting proxy (:class:`~pipeline.testing.s3_faults.S3FaultProxy`). Each task of a Spark job
sends 3 GETs and 1 PUT through :class:`~pipeline.fileio.S3FileIO` inside
:func:`pipeline.runtime.spark.task_requests.counted`; the accumulator's difference is compared with what the proxy saw:

1. ``mapInArrow``, every task succeeds: equal;
2. ``mapInPandas``, every task succeeds: equal;
3. ``mapInArrow``, partition 0's first attempt fails after its requests (Spark retries it): the proxy sees one
   attempt's requests more than the accumulator (failed attempts send no accumulator update).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _task(root: str, fail_first: bool):
    def fn(batches):
        from pyspark import TaskContext

        from pipeline.fileio import S3FileIO
        fio = S3FileIO()
        ctx = TaskContext.get()
        for b in batches:
            part = ctx.partitionId()
            fio.write_bytes(f"{root}/t{part}-a{ctx.attemptNumber()}", b"x")
            for _ in range(3):
                fio.read_bytes(f"{root}/t{part}-a{ctx.attemptNumber()}")
            if fail_first and part == 0 and ctx.attemptNumber() == 0:
                raise RuntimeError("experiment: first attempt of partition 0 fails after its requests")
            yield b
    return fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=4)
    args = ap.parse_args()
    from pipeline.fileio.request_counter import KINDS
    from pipeline.testing.moto_server import spawn_moto_server
    from pipeline.testing.s3_faults import S3FaultProxy
    moto = spawn_moto_server(["acc-exp"])
    proxy = S3FaultProxy(moto.endpoint_url).start()
    os.environ.update({**moto.env(), "AWS_ENDPOINT_URL": proxy.endpoint_url, "AWS_ENDPOINT_URL_S3": proxy.endpoint_url})
    os.environ["PIPELINE_SPARK_MASTER"] = "local[2,4]"
    try:
        import pandas as pd  # noqa: F401 - mapInPandas

        from pipeline.runtime.spark.session import get_spark
        from pipeline.runtime.spark.task_requests import TaskRequestCounter, counted
        spark = get_spark("local[2,4]", 2)
        print(f"pyspark {spark.version}, master {spark.sparkContext.master}, load {os.getloadavg()[0]:.1f}")
        counter = TaskRequestCounter.for_session(spark)
        assert counter is not None
        root = "s3://acc-exp/run"

        def measure(name: str, run) -> None:
            mark, before = counter.mark(), dict(proxy.by_kind)
            run()
            acc = counter.since(mark).total
            seen = {k: proxy.by_kind.get(k, 0) - before.get(k, 0) for k in KINDS}
            print(f"{name}: accumulator {acc.to_dict()} (total {acc.total}); proxy {seen} (total {sum(seen.values())})")

        df = spark.range(0, args.tasks, 1, args.tasks)
        measure("mapInArrow, all succeed", lambda: df.mapInArrow(counted(_task(root, False), counter),
                                                                 "id long").collect())

        def pandas_fn(frames):
            inner = _task(root, False)
            yield from inner(frames)
        measure("mapInPandas, all succeed", lambda: df.mapInPandas(counted(pandas_fn, counter), "id long").collect())
        measure("mapInArrow, partition 0 fails once", lambda: df.mapInArrow(counted(_task(root, True), counter),
                                                                           "id long").collect())
    finally:
        proxy.stop()
        moto.stop()


if __name__ == "__main__":
    main()
