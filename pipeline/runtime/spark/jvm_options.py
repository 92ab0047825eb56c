"""JVM options of the Spark JVM an Epochal process starts (a local master, or the driver of a cluster job).

Most of a fresh Spark JVM's CPU on a 2-core machine is not the plan's work but HotSpot warming up: in the 2M-order
benchmark at one epoch per round, the C2 JIT compiler's threads took 12.3 of the JVM's 23.5 CPU s
(docs/performance.md). Raising C2's thresholds (``Tier4*Threshold``, 10-20x HotSpot's defaults) lets the
C1-compiled code run meanwhile and gives C2's work to the truly hot loops only; nothing it computes changes. A
long-lived process (``run --follow``, an Airflow worker) still gets its hot loops C2-compiled, only later.

The short-lived batch processes (``validate``, ``batch``, ``bootstrap``) add the serial collector to it
(:mod:`pipeline.batch.jvm`); the epoch runtime keeps G1, whose pauses stay short in a process that lives for days.

:func:`use_jvm_options` puts the options in ``SPARK_SUBMIT_OPTS`` for the JVM this process is about to start. It does
nothing when the variable is already set (an explicit choice wins), when a Spark JVM already runs for this process
(a session, or ``spark-submit`` started it: its options cannot change), or when the setting is set to empty (the
JVM's defaults). The JVM also maps its classes from a class-data-sharing archive
(:mod:`pipeline.runtime.spark.class_archive`).
"""
from __future__ import annotations

from collections.abc import MutableMapping

from pipeline import settings
from pipeline.runtime.spark.class_archive import archive_options

__all__ = ["JIT_OPTS", "RUNTIME_JVM_OPTS_ENV", "use_jvm_options"]

#: C2 compiles a method only after ~100k invocations / 400k loop back-edges
JIT_OPTS = "-XX:Tier4InvocationThreshold=100000 -XX:Tier4CompileThreshold=120000 -XX:Tier4BackEdgeThreshold=400000"
RUNTIME_JVM_OPTS_ENV = "EPOCHAL_JVM_OPTS"


def use_jvm_options(env: MutableMapping[str, str] | None = None, *, setting: str = RUNTIME_JVM_OPTS_ENV,
                    default: str = JIT_OPTS) -> str | None:
    """Set ``SPARK_SUBMIT_OPTS`` to the value of ``setting`` (unset: ``default``) unless it is set already or a Spark
    JVM already runs here. Returns the options the JVM will start with (None: left as they are)."""
    env = settings.environ() if env is None else env
    if "SPARK_SUBMIT_OPTS" in env or "PYSPARK_GATEWAY_PORT" in env:   # set by the user / launched by spark-submit
        return None
    try:
        from pyspark import SparkContext
        if SparkContext._active_spark_context is not None:  # noqa: SLF001 - the JVM is already started
            return None
    except ImportError:  # pragma: no cover - pyspark is a dependency
        pass
    opts = env.get(setting, default).strip()
    if not opts:
        return None
    opts = f"{opts} {archive_options(opts, env)}".strip()  # classes mapped from an archive (class_archive.py)
    env["SPARK_SUBMIT_OPTS"] = opts
    return opts
