"""The SparkSession Epochal runs on: ``local[*]`` by default, any cluster master at scale (spark-submit), or a
long-lived Spark Connect server (``PIPELINE_SPARK_MASTER=sc://host:port``).

The master a launcher or an existing session set wins over ``PIPELINE_SPARK_MASTER`` and the default
(:mod:`pipeline.master`).

**Classic session** (local, standalone, YARN, Kubernetes): the runner hands each round's values to the tasks as
local properties of the SparkContext and re-plans a cached analysed plan through the JVM
(:mod:`pipeline.runtime.operators.round_params`); AWS credential-chain inputs travel with the tasks
(:mod:`pipeline.credentials`).

**Spark Connect**: no SparkContext, no JVM in this process. The round's values travel inside the task functions
(the plan is built per round; :class:`pipeline.runtime.driver.spark_plan.SparkPlan`), the session's SQL settings are set
through ``spark.conf``, and the job's own module is uploaded as a session artifact so that the server's Python
workers can import it. The server's executors need the ``pipeline`` package installed (the docker-compose image
has it) and take AWS credentials from their own environment / the default chain: a Connect client never ships
secrets to a shared server.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from pipeline import settings
from pipeline.credentials import REDACTION_REGEX, forward_to_executors
from pipeline.exceptions import ConfigError
from pipeline.master import choose_master, connect_url, is_connect_session, probe_connect
from pipeline.runtime.spark.class_archive import promote
from pipeline.runtime.spark.jvm_logs import relay_jvm_stderr
from pipeline.runtime.spark.jvm_options import use_jvm_options

__all__ = ["get_spark", "stop_spark", "is_connect_session", "ship_job_code", "preimport_workers", "SQL_CONF",
           "local_shuffle_conf", "start_python_workers", "prepare_class_archive"]

_SESSION = None

#: SQL settings every Epochal session runs with (runtime-settable, so they also apply over Spark Connect)
SQL_CONF = {
    "spark.sql.session.timeZone": "UTC",
    # partition i after our shuffle must be operator subtask i: no adaptive coalescing
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "50000",
    # no byte limit per Arrow batch towards the Python tasks (batches end at maxRecordsPerBatch rows, as in Spark
    # 3.x): with any other value Spark 4 measures the batch being built after *every row* (ArrowWriter.sizeInBytes
    # walks the struct of all columns), a quarter of the executors' JVM CPU on the 2M benchmark (docs/performance.md)
    "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
    "spark.sql.execution.pythonUDF.arrow.enabled": "true",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}


def _connect(url: str, parallelism: int, app: str):
    """A Spark Connect session on ``url``; a server that does not answer is a clear error, raised before any
    checkpoint id is claimed (the callers start the session first)."""
    probe_connect(url)
    from pyspark.sql import SparkSession
    try:
        spark = SparkSession.builder.remote(url).appName(app).getOrCreate()
        _set_session_conf(spark, {**SQL_CONF, "spark.sql.shuffle.partitions": str(parallelism)})
    except Exception as e:  # noqa: BLE001 - whatever the client raises, one line naming the server
        detail = " ".join(str(e).split())[:300]
        raise ConfigError(f"Spark Connect server {url} accepts connections but no Spark Connect session could be "
                          f"opened ({type(e).__name__}: {detail}); is it a Spark Connect server of a compatible "
                          "version? See docs/deployment.md") from None
    return spark


def _set_session_conf(spark, conf: dict[str, str]) -> None:
    """Set the session's SQL settings in one request to the server (pyspark's ``RuntimeConf._set_all``), not one
    request per setting; one per setting where that method is missing."""
    set_all = getattr(spark.conf, "_set_all", None)
    if set_all is not None:
        set_all(conf, silent=False)
        return
    for k, v in conf.items():
        spark.conf.set(k, v)


def get_spark(master: str | None = None, parallelism: int = 2, app: str = "epochal"):
    """Create (once per process) the SparkSession. Workers use this interpreter (pyarrow on executors).
    ``master``: the configured ``PIPELINE_SPARK_MASTER`` (empty/None: not configured)."""
    global _SESSION
    if _SESSION is not None:
        return _SESSION
    url = connect_url(master)
    if url is not None:
        _SESSION = _connect(url, parallelism, app)
        return _SESSION
    env = settings.environ()
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkContext._active_spark_context  # noqa: SLF001 - the only way to see a running context
    choice = choose_master(master, active_master=active.master if active is not None else None)
    if choice.note():
        print(choice.note(), file=sys.stderr)
    if active is None:
        use_jvm_options(env)  # JIT options of the JVM about to start (EPOCHAL_JVM_OPTS; a batch process set its own)
    b = SparkSession.builder.appName(app)
    if choice.builder_master:
        b = b.master(choice.builder_master)
    b = (b
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", str(parallelism))
         .config("spark.python.worker.reuse", "true")
         .config("spark.driver.memory", settings.get_str("EPOCHAL_DRIVER_MEMORY"))
         .config("spark.executorEnv.PYTHONPATH", os.pathsep.join(p for p in sys.path if p)))
    for k, v in SQL_CONF.items():
        b = b.config(k, v)
    for k, v in local_shuffle_conf(choice.master).items():
        b = b.config(k, v)
    if preimport_workers(choice.master, env):  # task modules imported once per executor, not per worker
        b = b.config("spark.python.daemon.module", "pipeline.runtime.spark.worker_daemon")
    b = b.config("spark.redaction.regex", REDACTION_REGEX)
    for k in ("EPOCHAL_KILL_AT", "EPOCHAL_KILL_SCOPE", "EPOCHAL_PHASE_MARKERS", "EPOCHAL_ATTEMPT_FAULT",
              "EPOCHAL_TASK_PROFILE",  # opt-in cProfile of the task functions (pipeline.runtime.operators.task_profile)
              # the S3 retry knobs (pipeline.storage_retry, pipeline.fileio.s3) hold on the executors too
              "PIPELINE_S3_RETRY_SECONDS", "PIPELINE_S3_RETRY_BASE_MS", "PIPELINE_S3_RETRY_MAX_BACKOFF_SECONDS",
              "PIPELINE_S3_BOTO_ATTEMPTS", "PIPELINE_S3_PART_MB"):
        if env.get(k):
            b = b.config(f"spark.executorEnv.{k}", env[k])
    with relay_jvm_stderr():  # EPOCHAL_JVM_LOGS=python: JVM log lines at their level (Airflow tasks)
        _SESSION = b.getOrCreate()
    # AWS credential-chain inputs travel with the tasks, never in the Spark configuration
    forward_to_executors(_SESSION.sparkContext, env)
    _SESSION.sparkContext.setLogLevel(settings.get_str("EPOCHAL_SPARK_LOG_LEVEL"))
    _quiet_task_failures(_SESSION)
    return _SESSION


def local_shuffle_conf(master: str | None) -> dict[str, str]:
    """Spark settings for a local master's shuffles: no order-independent row checksum. Spark 4 (on by default)
    hashes every shuffled row (XXH64 over the UnsafeRow) so that, when a map task is *retried*, the driver can tell
    whether its output changed and re-run the consumer stages; a local master runs every task once (a failed task
    fails the round, which Epochal replays from the write-ahead log), so the hash only costs CPU: 4% of the
    executor threads' samples of the 2M benchmark at one epoch per round (docs/performance.md). A cluster keeps
    Spark's default (its map outputs can be lost with an executor and recomputed)."""
    if not master or not str(master).startswith("local"):
        return {}
    # both: Spark computes the checksums when either is on (ShuffleExchangeExec.prepareShuffleDependency)
    return {"spark.sql.shuffle.orderIndependentChecksum.enabled": "false",
            "spark.sql.shuffle.orderIndependentChecksum.enableFullRetryOnMismatch": "false"}


def preimport_workers(master: str | None, env) -> bool:
    """Whether the executors' Python daemon imports the task modules before forking its workers
    (:mod:`pipeline.runtime.spark.worker_daemon`): local masters (the executors share this interpreter and ``sys.path``),
    unless ``EPOCHAL_WORKER_PREIMPORT=0``."""
    if env.get("EPOCHAL_WORKER_PREIMPORT", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return bool(master) and str(master).startswith("local")


_WORKERS_STARTED: set[str] = set()
_WARMING: list[threading.Thread] = []


def start_python_workers(spark) -> threading.Thread | None:
    """Start the Python workers of a local master's executor now, in a background thread, while the driver still
    restores and plans its first round: a trivial Arrow task per slot makes the executor start its Python daemon
    (which imports the task modules, :mod:`pipeline.runtime.spark.worker_daemon`) and fork a worker per core,
    which the round's tasks then reuse (``spark.python.worker.reuse``). That start took ~2 s of the first round of a
    fresh process (a trivial Arrow job: 2.2 s cold, 0.2 s warm). A Spark Connect server keeps its own workers; a
    cluster's executors are started by their own first tasks; ``EPOCHAL_WORKER_PREIMPORT=0`` does neither. A
    failure here is not an error: the round starts the workers itself and reports its own failures."""
    if is_connect_session(spark):
        return None
    sc = spark.sparkContext
    if sc.applicationId in _WORKERS_STARTED or not preimport_workers(sc.master, settings.environ()):
        return None
    _WORKERS_STARTED.add(sc.applicationId)  # once per Spark application: later runners find them running
    slots = max(1, int(sc.defaultParallelism))  # the executor's cores: tasks (and workers) running at once

    def run() -> None:
        try:
            spark.range(0, slots, numPartitions=slots).mapInArrow(_no_rows, "id long").collect()
        except Exception:  # noqa: BLE001, S110 - the round starts its workers itself
            pass
    t = threading.Thread(target=run, name="epochal-python-workers", daemon=True)
    t.start()
    _WARMING.append(t)
    return t


def _no_rows(batches):
    """The warm-up task of :func:`start_python_workers`: reads its input, yields nothing."""
    for _ in batches:
        pass
    return iter(())


def prepare_class_archive() -> str | None:
    """Dump the runtime JVM's class archive now, unless there is one (``scripts/bootstrap.sh``; see
    :mod:`pipeline.runtime.spark.class_archive`): a local session runs a trivial Arrow job, then its JVM exits and
    dumps the classes it loaded, and the dump becomes the archive. Returns the archive's path (None: off, not
    possible here, or there already). Call it in a process that has no Spark session."""
    from pyspark import SparkContext
    opts = use_jvm_options() or ""
    if "-XX:ArchiveClassesAtExit=" not in opts:
        return None
    part = opts.split("-XX:ArchiveClassesAtExit=", 1)[1].split()[0]
    spark = get_spark("local[*]", 2, app="epochal-class-archive")
    spark.range(0, 2, 1, 2).mapInArrow(_no_rows, "id long").collect()  # the Python runner's classes too
    gateway = SparkContext._gateway  # noqa: SLF001 - the JVM's process, to wait for its dump
    stop_spark()
    proc = getattr(gateway, "proc", None)
    if proc is None:
        return None
    if proc.stdin is not None:
        proc.stdin.close()  # the gateway JVM exits on EOF of its stdin, and dumps the archive as it exits
    proc.wait(timeout=300)
    final = promote(Path(part))
    return str(final) if final is not None else None


def ship_job_code(job) -> None:
    """Spark Connect: the job's own Python functions (``Stream.process``, ``map`` functions, ...) travel by value
    inside the tasks, so the server's Python workers need only the ``pipeline`` package, not the user's module.
    (A classic session ships ``sys.path`` to its executors instead.)"""
    import dataclasses
    import types

    from pyspark import cloudpickle
    seen: set[str] = set()

    def visit(value) -> None:
        if isinstance(value, (types.FunctionType, type)) or callable(value):
            mod = getattr(value, "__module__", None) or getattr(type(value), "__module__", None)
            if mod and mod not in seen and mod in sys.modules and not mod.startswith(("pipeline.", "pyspark", "builtins")) \
                    and mod != "pipeline":
                seen.add(mod)
                cloudpickle.register_pickle_by_value(sys.modules[mod])
        elif isinstance(value, (list, tuple)):
            for v in value:
                visit(v)
        elif isinstance(value, dict):
            for v in value.values():
                visit(v)

    for node in job.nodes:
        if dataclasses.is_dataclass(node):
            for f in dataclasses.fields(node):
                visit(getattr(node, f.name))


def _quiet_task_failures(spark) -> None:
    """A failed task is reported once, by Epochal (``epochal: <Error>: <message naming the URI/file>``, see
    :func:`pipeline.runtime.spark.dataflow.rethrow_task_error`): Spark's own ERROR lines carrying the Python worker's
    traceback (``Executor: Exception in task``, ``TaskSetManager: Lost task``) are switched off, unless
    ``EPOCHAL_SPARK_TASK_ERRORS=1`` (debugging) or an explicit ``EPOCHAL_SPARK_LOG_LEVEL`` asks for them."""
    if settings.raw("EPOCHAL_SPARK_TASK_ERRORS") == "1" or settings.raw("EPOCHAL_SPARK_LOG_LEVEL"):
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
    for t in _WARMING:  # a stop while the workers still start would cancel that job with an ERROR line
        t.join(30)
    _WARMING.clear()
    if _SESSION is not None:
        _SESSION.stop()
        _SESSION = None
