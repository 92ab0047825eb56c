"""JVM options for a short-lived process that evaluates the batch plan (``epochal bootstrap``, ``epochal batch``,
``epochal validate``).

Such a process starts a Spark JVM, runs one large plan over the whole history and exits. In a fresh JVM most of
its CPU was not the plan's work but the JVM warming up (docs/batch.md, session 11 profile of the 2M-order
bootstrap, per JVM thread): the C2 JIT compiler's threads took ~21 CPU s, the executor tasks ~18, G1's threads ~6.
Two HotSpot options cut that without changing any result (they decide when code is compiled and how memory is
collected, not what it computes):

* C2 compiles a method only after ~100k invocations (``Tier4*Threshold``, 10-20x the defaults): the C1-compiled
  code runs meanwhile, and the C2 work goes to the few truly hot loops (JIT CPU 21 -> 10 s, the tasks' CPU
  unchanged); ``-XX:TieredStopAtLevel=1`` (no C2 at all) was measured too and made the tasks slower (33 vs 18 CPU s);
* the serial collector (one process, a heap of a few hundred MB live): no concurrent G1 threads.

:func:`use_batch_jvm_options` sets them in ``SPARK_SUBMIT_OPTS`` for the JVM this process is about to start. It does
nothing when the variable is already set (an explicit choice wins), when a Spark JVM already runs for this process
(a session, or ``spark-submit`` started it: its options cannot change) or when ``EPOCHAL_BATCH_JVM_OPTS`` is set to empty (the JVM defaults). The epoch runtime
(``epochal run``) keeps G1 and takes only the JIT options (:mod:`pipeline.runtime.spark.jvm_options`): its process
is long-lived (Airflow workers, ``run --follow``).
"""
from __future__ import annotations

from collections.abc import MutableMapping

from pipeline.runtime.spark.jvm_options import JIT_OPTS, use_jvm_options

__all__ = ["BATCH_JVM_OPTS", "JVM_OPTS_ENV", "use_batch_jvm_options"]

JVM_OPTS_ENV = "EPOCHAL_BATCH_JVM_OPTS"
BATCH_JVM_OPTS = f"-XX:+UseSerialGC {JIT_OPTS}"


def use_batch_jvm_options(env: MutableMapping[str, str] | None = None) -> str | None:
    """Set ``SPARK_SUBMIT_OPTS`` to the batch process's JVM options (``EPOCHAL_BATCH_JVM_OPTS``, default
    :data:`BATCH_JVM_OPTS`) unless it is set already or a Spark JVM already runs here. Returns the options the JVM
    will start with (None: left as they are)."""
    return use_jvm_options(env, setting=JVM_OPTS_ENV, default=BATCH_JVM_OPTS)
