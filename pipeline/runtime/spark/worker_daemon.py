"""The Python worker daemon of the executors: PySpark's own daemon, with the task modules imported once, before it
forks its workers.

PySpark starts one daemon per executor (``python -m pyspark.daemon``) and forks a Python worker from it for every
concurrently running task. Each worker then imports what Epochal's task functions need - pyarrow (Parquet,
compute, IPC), the operator, reader and state modules, boto3 for S3 - on its first task: about 0.5-1 s of CPU per
worker on this machine, paid again by every new process (every catch-up, every Airflow task with its own JVM).
Importing them in the daemon instead means the forked workers inherit them (copy-on-write): paid once per
executor, not once per worker.

The session selects it with ``spark.python.daemon.module`` (:mod:`pipeline.runtime.spark.session`); a classic local
or standalone session only (Spark Connect servers start their own workers). ``EPOCHAL_WORKER_PREIMPORT=0`` keeps
PySpark's plain daemon. An import that fails here is not an error: the worker imports the module itself when a
task needs it, and reports the failure there, naming the task.

Only imports run before the fork: no thread, no file handle, no client is created (a forked child must not
inherit a thread pool or a connection).
"""
from __future__ import annotations

import importlib

__all__ = ["PREIMPORTED", "preimport"]

#: what the executor-side task functions import (readers, operators, state, FileIO, Arrow/pandas serialisers)
PREIMPORTED = (
    "pyarrow", "pyarrow.compute", "pyarrow.parquet", "pyarrow.ipc", "pyarrow.fs", "pandas",
    "pyspark.worker", "pyspark.sql.pandas.serializers", "pyspark.sql.pandas.types",
    "pipeline.runtime.spark.dataflow", "pipeline.runtime.spark.operator_plans", "pipeline.runtime.operators.task",
    "pipeline.runtime.operators.join", "pipeline.runtime.operators.aggregate", "pipeline.runtime.operators.dedup",
    "pipeline.runtime.operators.window", "pipeline.runtime.operators.process", "pipeline.runtime.operators.round_params",
    "pipeline.source.reader",
    "pipeline.state.backend", "pipeline.state.snapshot", "pipeline.state.cache", "pipeline.state.changelog",
    "pipeline.fileio.local", "pipeline.fileio.s3",
)


def preimport(modules=PREIMPORTED) -> list[str]:
    """Import ``modules``; returns the ones that could not be imported (their workers import them on use)."""
    failed = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the worker imports it again on use and reports the error there
            failed.append(name)
    return failed


if __name__ == "__main__":  # python -m pipeline.runtime.spark.worker_daemon (spark.python.daemon.module)
    preimport()
    from pyspark import daemon

    daemon.manager()
