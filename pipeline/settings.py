"""Every environment variable Epochal reads, declared once: name, type, default and doc line.

Two places read the process environment: :mod:`pipeline.config` (the ``PIPELINE_*`` keys of
:class:`~pipeline.config.PipelineConfig`, whose fields and attribute docstrings declare them) and this module (every
other variable: executor-side tuning, Airflow deployment, fault injection and test switches, and the variables
that AWS, Spark and Airflow provide). Other modules call :func:`value`, :func:`get_str`, :func:`get_int`,
:func:`get_float`, :func:`get_flag` or :func:`raw` with a declared name (an undeclared name raises ``KeyError``: a new variable is
declared here first), and :func:`environ` where a whole environment is handed on (to a subprocess, to Spark's
executors, to a function that takes an ``env`` mapping). A test fails when a module outside these two reads
``os.environ`` or ``os.getenv`` (``tests/unit/test_settings.py``), and the docs' configuration reference is
generated from :data:`SETTINGS` (``docs/hooks/refgen.py``).

An empty variable counts as unset (as for the ``PIPELINE_*`` keys): :func:`value` gives the declared default.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

__all__ = ["Setting", "SETTINGS", "environ", "raw", "value", "get_str", "get_int", "get_float", "get_flag", "declared"]


@dataclass(frozen=True, slots=True)
class Setting:
    """One environment variable: ``type`` is how it is parsed (str, int, float, flag, path, list), ``default``
    the value used when it is unset (None: no value, or computed where it is used - the doc line says how),
    ``scope`` who sets it: ``executors``, ``driver``, ``airflow``, ``internal`` (tests, benchmarks, fault
    injection) or ``provided`` (set by AWS, Spark, Airflow or the OS, read by Epochal)."""

    name: str
    type: str
    default: str | None
    doc: str
    scope: str = "driver"


def _s(name: str, type: str, default: str | None, doc: str, scope: str = "driver") -> Setting:
    return Setting(name, type, default, doc, scope)


_DECLARED: tuple[Setting, ...] = (
    # -- the driver and the executors ----------------------------------------------------------------------
    _s("EPOCHAL_HOME", "path", None, "directory of the default `file://` roots (unset: `$PWD/.epochal`)"),
    _s("EPOCHAL_EXECUTOR_S3_PROBE_SECONDS", "float", "15", "(Spark Connect on a cluster) how long the probe of "
       "the executors' S3 access may take before the run is refused"),
    _s("EPOCHAL_CONNECT_TIMEOUT", "float", "10", "seconds to wait for a Spark Connect server"),
    _s("EPOCHAL_SPARK_LOG_LEVEL", "str", "ERROR", "Spark's log level in Epochal's sessions"),
    _s("EPOCHAL_DRIVER_MEMORY", "str", "4g", "`spark.driver.memory` of the sessions Epochal starts"),
    _s("EPOCHAL_JVM_OPTS", "str", None, "JVM options of the Spark JVM an Epochal process starts (unset: C2 "
       "compiles only hot code, docs/performance.md; empty: the JVM's defaults)"),
    _s("EPOCHAL_JVM_CLASS_ARCHIVE_DIR", "path", None, "where the Spark JVM's class-data-sharing archives are kept "
       "(unset: `~/.cache/epochal/jvm-classes`; empty: none)"),
    _s("EPOCHAL_BATCH_JVM_OPTS", "str", None, "JVM options of the short-lived `validate` / `batch` / "
       "`bootstrap` processes"),
    _s("EPOCHAL_BATCH_NATIVE_READ", "flag", "1", "the batch plan reads Parquet sources with Spark's native "
       "reader (`0`: every file through the runtime's reader)"),
    _s("EPOCHAL_WORKER_PREIMPORT", "flag", "1", "modules the Python workers import ahead of the first task "
       "(`0`: none)"),
    _s("EPOCHAL_WORKER_RELEASE_MEMORY", "flag", "1", "Python workers return freed memory to the OS after a "
       "task", "executors"),
    _s("EPOCHAL_JVM_LOGS", "str", None, "`python`: the JVM's log lines are relayed at their level (the Airflow "
       "tasks set it); unset: Spark's own output"),
    _s("EPOCHAL_QUALITY_LOCAL_MAX_BYTES", "int", str(256 * 1024 * 1024), "quality suites: sink tables up to "
       "this size are read on the driver"),
    _s("EPOCHAL_QUALITY_LOCAL_SMALL_BYTES", "int", str(8 * 1024 * 1024), "quality suites: threshold of the "
       "small-table fast path"),
    _s("EPOCHAL_RESTORE_VALIDATE", "str", "full", "what a restore validates: full, cheap or none "
       "(docs/quality.md)"),
    _s("EPOCHAL_DATA_DOCS_DIR", "path", None, "where Great Expectations Data Docs are rendered (unset: under "
       "`EPOCHAL_HOME`)"),
    _s("EPOCHAL_ICEBERG_COUNTED_IO", "flag", "1", "count Iceberg's storage requests (`0`: pyiceberg's own "
       "FileIO)"),
    _s("PIPELINE_STATE_CACHE_DIR", "path", None, "local directory of the warm state cache (unset: "
       "`$TMPDIR/epochal-state-cache`)", "executors"),
    _s("PIPELINE_STATE_CACHE_MAX_BYTES", "int", None, "size bound of the warm state cache (unset: the "
       "cache's default)", "executors"),
    _s("PIPELINE_STATE_STORE_DIR", "path", None, "(`rocksdb`) where an executor keeps its RocksDB stores "
       "(unset: `<PIPELINE_STATE_CACHE_DIR>/keyed`)", "executors"),
    _s("PIPELINE_STATE_MERGE_MEMORY_BYTES", "int", str(32 << 20), "(`rocksdb`) a new base is merged from the "
       "parent chain in Arrow while its deltas and the round's delta fit this budget; above it the store is "
       "scanned", "executors"),
    _s("PIPELINE_STATE_STORE_CACHE_BYTES", "int", str(32 << 20), "(`rocksdb`) one LRU block cache per Python "
       "worker shared by all its stores, memtables charged to it", "executors"),
    _s("PIPELINE_STATE_STORE_WRITE_BUFFER_BYTES", "int", str(8 << 20), "(`rocksdb`) memtable size per store",
       "executors"),
    _s("PIPELINE_STATE_STORE_WRITE_BUFFERS", "int", "2", "(`rocksdb`) memtables per store", "executors"),
    _s("PIPELINE_STATE_STORE_MAX_OPEN_FILES", "int", "64", "(`rocksdb`) open SST files per store", "executors"),
    _s("PIPELINE_STATE_STORE_SWEEP_S", "float", "3600", "(`rocksdb`) how often a process sweeps the store root",
       "executors"),
    _s("PIPELINE_STATE_STORE_MAX_IDLE_S", "float", str(7 * 24 * 3600), "(`rocksdb`) a store directory without "
       "a write for this long is removed (`0`: never)", "executors"),
    _s("PIPELINE_S3_RETRY_SECONDS", "float", "90", "retry budget of one S3 request (transient faults, outages)"),
    _s("PIPELINE_S3_RETRY_BASE_MS", "float", "200", "first back-off of the S3 retries (ms)"),
    _s("PIPELINE_S3_RETRY_MAX_BACKOFF_SECONDS", "float", "5", "longest back-off of the S3 retries"),
    _s("PIPELINE_S3_BOTO_ATTEMPTS", "int", "1", "boto3's own attempts per call (the retries above do the work)"),
    _s("PIPELINE_S3_PART_MB", "int", "32", "multipart upload part size in MiB (at least 5)"),
    _s("PIPELINE_S3_LIST_PAGE_SIZE", "int", "1000", "keys per S3 LIST page (tests set it small)"),
    # -- Airflow ----------------------------------------------------------------------------------------------
    _s("EPOCHAL_CONFIG", "path", None, "YAML config file the Airflow tasks load (the `--config` of the CLI)",
       "airflow"),
    _s("EPOCHAL_AWS_CONN_ID", "str", "epochal_s3", "Airflow connection that supplies the S3 settings",
       "airflow"),
    _s("EPOCHAL_FUSED_EPOCH", "flag", "true", "`trigger >> epoch` (process, commit and validate in one task); "
       "false: `trigger >> process >> commit >> validate`", "airflow"),
    _s("EPOCHAL_SPARK_CONNECT", "flag", "true", "`scripts/airflow_standalone.sh`: the tasks use a long-lived Spark "
       "Connect server (0: a driver JVM per task)", "airflow"),
    _s("EPOCHAL_SHARED_CONNECT_SESSION", "flag", "true", "on Spark Connect, the epoch DAG's tasks of a job attach to "
       "one server-side session (its Python workers stay warm between epochs); false: a session per task",
       "airflow"),
    _s("EPOCHAL_START_DATE", "str", "2026-01-01T00:00:00Z", "start date of the epoch DAGs (ISO-8601 UTC)",
       "airflow"),
    _s("EPOCHAL_END_DATE", "str", None, "end date of the epoch DAGs (unset: none)", "airflow"),
    _s("EPOCHAL_CATCHUP", "flag", "false", "`catchup` of the epoch DAGs", "airflow"),
    _s("EPOCHAL_DAG_RETRIES", "int", "2", "task retries", "airflow"),
    _s("EPOCHAL_DAG_RETRY_DELAY_SECONDS", "float", "30", "delay between task retries", "airflow"),
    _s("EPOCHAL_POKE_SECONDS", "float", None, "poke interval of the trigger sensor (unset: a tenth of the epoch, "
       "2-15 s)", "airflow"),
    _s("EPOCHAL_TRIGGER_WAIT_SECONDS", "float", "60", "how long the trigger task polls in-process before it "
       "gives the worker slot back", "airflow"),
    _s("EPOCHAL_TRIGGER_TIMEOUT_SECONDS", "float", None, "timeout of the trigger task (unset: max(1 h, "
       "3 epochs + allowed lateness))", "airflow"),
    _s("EPOCHAL_APPROVE_RESTORE", "flag", "false", "a human approves a restore before it runs", "airflow"),
    _s("EPOCHAL_APPROVE_REWIND", "flag", "false", "a human approves a rewind before it runs", "airflow"),
    _s("EPOCHAL_APPROVAL_TIMEOUT_SECONDS", "float", None, "how long an approval may wait (unset: the approval "
       "task's default)", "airflow"),
    _s("EPOCHAL_AIRFLOW_PASSWORD", "str", None, "password of the local `airflow standalone` admin (scripts)",
       "airflow"),
    # -- tests, benchmarks and fault injection -----------------------------------------------------------------
    _s("EPOCHAL_TASK_PROFILE", "path", None, "profile the operator tasks (benchmarks): where profiles go",
       "internal"),
    _s("EPOCHAL_STATE_TRACE", "flag", None, "trace state reads and writes", "internal"),
    _s("EPOCHAL_SPARK_TASK_ERRORS", "flag", None, "`1`: Spark's task errors are shown (tests)", "internal"),
    _s("EPOCHAL_PHASE", "str", None, "crash tests: the phase a kill targets", "internal"),
    _s("EPOCHAL_PHASE_MARKERS", "path", None, "crash tests: write phase marker files there", "internal"),
    _s("EPOCHAL_KILL_AT", "str", None, "crash tests: kill the process at this fault point", "internal"),
    _s("EPOCHAL_KILL_SCOPE", "str", None, "crash tests: `group` kills the whole process group", "internal"),
    _s("EPOCHAL_FAIL_AT", "str", None, "fault injection: fail at this fault point", "internal"),
    _s("EPOCHAL_FAULT", "str", None, "fault injection: the fault to inject", "internal"),
    _s("EPOCHAL_ATTEMPT_FAULT", "str", None, "fault injection: fail a task attempt", "internal"),
    _s("EPOCHAL_AIRFLOW_FAIL_ONCE", "str", None, "Airflow tests: fail a task once", "internal"),
    # -- provided by AWS, Spark, Airflow or the OS -------------------------------------------------------------
    _s("AWS_ENDPOINT_URL", "str", None, "S3 endpoint (moto, MinIO); forwarded to the executors", "provided"),
    _s("AWS_ENDPOINT_URL_S3", "str", None, "S3 endpoint, S3 only (wins over `AWS_ENDPOINT_URL`)", "provided"),
    _s("AWS_ACCESS_KEY_ID", "str", None, "S3 credentials (else boto3's chain)", "provided"),
    _s("AWS_SECRET_ACCESS_KEY", "str", None, "S3 credentials (else boto3's chain)", "provided"),
    _s("AWS_SESSION_TOKEN", "str", None, "S3 credentials (else boto3's chain)", "provided"),
    _s("AWS_REGION", "str", None, "S3 region", "provided"),
    _s("AWS_DEFAULT_REGION", "str", None, "S3 region when `AWS_REGION` is unset (some readers: us-east-1)",
       "provided"),
    _s("AIRFLOW__API__BASE_URL", "str", None, "Airflow's own base URL: links to task instances", "provided"),
    _s("AIRFLOW_CTX_DAG_ID", "str", None, "set by Airflow in a task: names the run that took a checkpoint",
       "provided"),
    _s("AIRFLOW_CTX_DAG_RUN_ID", "str", None, "set by Airflow in a task", "provided"),
    _s("AIRFLOW_CTX_TASK_ID", "str", None, "set by Airflow in a task", "provided"),
    _s("AIRFLOW_CTX_TRY_NUMBER", "str", None, "set by Airflow in a task", "provided"),
    _s("PYSPARK_SUBMIT_ARGS", "str", None, "`--master` given to PySpark's launcher wins over the config",
       "provided"),
    _s("PYSPARK_GATEWAY_PORT", "str", None, "set under spark-submit: its JVM already has the master", "provided"),
    _s("SPARK_REMOTE", "str", None, "a Spark Connect URL given to PySpark", "provided"),
    _s("SPARK_HOME", "path", None, "the Spark distribution (test clusters)", "provided"),
    _s("PYSPARK_PYTHON", "path", None, "the executors' Python (unset: this interpreter)", "provided"),
    _s("PYSPARK_DRIVER_PYTHON", "path", None, "the driver's Python (unset: this interpreter)", "provided"),
    _s("TMPDIR", "path", None, "temporary directory (test servers' work directories)", "provided"),
    _s("PYTHONPATH", "str", None, "handed on to subprocesses", "provided"),
    _s("GX_ANALYTICS_ENABLED", "flag", None, "Great Expectations' usage statistics (Epochal sets `False` unless "
       "set)", "provided"),
)

#: every declared variable by name (the ``PIPELINE_*`` keys of PipelineConfig are declared by its fields)
SETTINGS: Mapping[str, Setting] = {s.name: s for s in _DECLARED}


def declared(name: str) -> Setting:
    """The declaration of ``name``; ``KeyError`` for a variable that is not declared here."""
    try:
        return SETTINGS[name]
    except KeyError:
        raise KeyError(f"environment variable {name} is not declared in pipeline/settings.py") from None


def environ() -> MutableMapping[str, str]:
    """The process environment, for code that hands a whole environment on (subprocesses, Spark's executors,
    functions that take an ``env`` mapping) or sets variables for a child."""
    return os.environ


def raw(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable as set (None: unset), from ``env`` or the process environment."""
    declared(name)
    return (os.environ if env is None else env).get(name)


def value(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable, or its declared default when it is unset or empty."""
    v = raw(name, env)
    return v if v not in (None, "") else SETTINGS[name].default


def get_str(name: str, env: Mapping[str, str] | None = None) -> str:
    """:func:`value` of a variable declared with a default."""
    v = value(name, env)
    if v is None:
        raise KeyError(f"environment variable {name} has no declared default: read it with value()")
    return v


def get_int(name: str, env: Mapping[str, str] | None = None) -> int:
    """:func:`value` of a variable declared with a default, as an int (``ValueError`` if it is not one)."""
    return int(get_str(name, env))


def get_float(name: str, env: Mapping[str, str] | None = None) -> float:
    """:func:`value` of a variable declared with a default, as a float (``ValueError`` if it is not one)."""
    return float(get_str(name, env))


def get_flag(name: str, env: Mapping[str, str] | None = None) -> bool:
    """On unless the value is ``0``, ``false``, ``no`` or ``off`` (unset: the declared default; none: off)."""
    v = value(name, env)
    return v is not None and v.strip().lower() not in ("", "0", "false", "no", "off")
