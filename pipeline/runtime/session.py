"""The SparkSession Epochal runs on: ``local[*]`` by default, any cluster master at scale (spark-submit).

The master a launcher or an existing session set wins over ``PIPELINE_SPARK_MASTER`` and the default
(:mod:`pipeline.runtime.master`).

A classic session is required (not Spark Connect): the runner hands each round's values to the tasks as
local properties of the SparkContext and re-plans a cached analysed plan through the JVM
(:mod:`pipeline.runtime.round_params`)."""
from __future__ import annotations

import os
import sys

from pipeline.credentials import REDACTION_REGEX, forward_to_executors

__all__ = ["get_spark", "stop_spark"]

_SESSION = None


def get_spark(master: str | None = None, parallelism: int = 2, app: str = "epochal"):
    """Create (once per process) the SparkSession. Workers use this interpreter (pyarrow on executors).
    ``master``: the configured ``PIPELINE_SPARK_MASTER`` (empty/None: not configured)."""
    global _SESSION
    if _SESSION is not None:
        return _SESSION
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from pipeline.runtime.master import choose_master
    active = SparkContext._active_spark_context  # noqa: SLF001 - the only way to see a running context
    choice = choose_master(master, active_master=active.master if active is not None else None)
    if choice.note():
        print(choice.note(), file=sys.stderr)
    b = SparkSession.builder.appName(app)
    if choice.builder_master:
        b = b.master(choice.builder_master)
    b = (b
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.session.timeZone", "UTC")
         .config("spark.sql.shuffle.partitions", str(parallelism))
         # partition i after our shuffle must be operator subtask i: no adaptive coalescing
         .config("spark.sql.adaptive.enabled", "false")
         .config("spark.sql.execution.arrow.maxRecordsPerBatch", "50000")
         .config("spark.sql.execution.pythonUDF.arrow.enabled", "true")
         .config("spark.python.worker.reuse", "true")
         .config("spark.driver.memory", os.environ.get("EPOCHAL_DRIVER_MEMORY", "4g"))
         .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
         .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(p for p in sys.path if p)))
    b = b.config("spark.redaction.regex", REDACTION_REGEX)
    for k in ("EPOCHAL_KILL_AT", "EPOCHAL_KILL_SCOPE", "EPOCHAL_PHASE_MARKERS", "EPOCHAL_ATTEMPT_FAULT",
              # the S3 retry knobs (pipeline.storage_retry, pipeline.fileio.s3) hold on the executors too
              "PIPELINE_S3_RETRY_SECONDS", "PIPELINE_S3_RETRY_BASE_MS", "PIPELINE_S3_RETRY_MAX_BACKOFF_SECONDS",
              "PIPELINE_S3_BOTO_ATTEMPTS", "PIPELINE_S3_PART_MB"):
        if os.environ.get(k):
            b = b.config(f"spark.executorEnv.{k}", os.environ[k])
    from pipeline.runtime.jvm_logs import relay_jvm_stderr
    with relay_jvm_stderr():  # EPOCHAL_JVM_LOGS=python: JVM log lines at their level (Airflow tasks)
        _SESSION = b.getOrCreate()
    # AWS credential-chain inputs travel with the tasks, never in the Spark configuration
    forward_to_executors(_SESSION.sparkContext, os.environ)
    _SESSION.sparkContext.setLogLevel(os.environ.get("EPOCHAL_SPARK_LOG_LEVEL", "ERROR"))
    _quiet_task_failures(_SESSION)
    return _SESSION


def _quiet_task_failures(spark) -> None:
    """A failed task is reported once, by Epochal (``epochal: <Error>: <message naming the URI/file>``, see
    :func:`pipeline.runtime.dataflow.rethrow_task_error`): Spark's own ERROR lines carrying the Python worker's
    traceback (``Executor: Exception in task``, ``TaskSetManager: Lost task``) are switched off, unless
    ``EPOCHAL_SPARK_TASK_ERRORS=1`` (debugging) or an explicit ``EPOCHAL_SPARK_LOG_LEVEL`` asks for them."""
    if os.environ.get("EPOCHAL_SPARK_TASK_ERRORS") == "1" or os.environ.get("EPOCHAL_SPARK_LOG_LEVEL"):
        return
    try:
        jvm = spark.sparkContext._jvm  # noqa: SLF001
        off = jvm.org.apache.logging.log4j.Level.OFF
        for name in ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager"):
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, off)
    except Exception:  # noqa: BLE001 - a cluster/Connect session may not expose log4j: keep Spark's logging
        pass


def stop_spark() -> None:
    global _SESSION
    if _SESSION is not None:
        _SESSION.stop()
        _SESSION = None
