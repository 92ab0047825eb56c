"""A round's Spark job planned once, run anew every round (Flink: the ExecutionGraph deployed once, fed per round).

A round's plan is round-independent: its tasks take the round's values (splits, parent state handles, staging
prefixes) from local properties (:mod:`pipeline.runtime.operators.round_params`). Executing the same DataFrame
twice would reuse the first run's shuffle output, so each round used to run a new Dataset over the analysed
plan, and Spark optimised and planned it again (about 0.15 s of every round on the driver, with the executors idle).

:class:`PhysicalPlan` plans the job once (optimiser and physical planning, the first time it runs) and runs a
**copy** of that physical plan every round: ``SparkPlan.clone()`` rebuilds every node, so every exchange gets a new
shuffle (nothing of an earlier round is reused) and every operator its own metrics. The copy's rows are
collected through a DataFrame over its RDD, whose own plan is one scan. Classic sessions only (Spark Connect has no
JVM on the client: its rounds are planned by the server).
"""
from __future__ import annotations

from typing import Any

__all__ = ["PhysicalPlan"]


class PhysicalPlan:
    """The physical plan of ``df``, planned on the first :meth:`dataframe` and copied for every later one."""

    def __init__(self, spark, df) -> None:
        self._spark = spark
        self._df = df
        self._planned: tuple[Any, Any] | None = None   # (the JVM SparkPlan, the JVM schema)

    @property
    def planned(self) -> bool:
        """Whether the job has been planned (by the first :meth:`dataframe`)."""
        return self._planned is not None

    def dataframe(self):
        """A DataFrame whose execution runs a fresh copy of the planned job (new shuffles, new metrics)."""
        from pyspark.sql import DataFrame  # pyspark: imported where Spark already runs
        if self._planned is None:
            jdf = self._df._jdf
            self._planned = (jdf.queryExecution().executedPlan(), jdf.schema())
        plan, schema = self._planned
        rdd = plan.clone().execute()   # RDDs only: the tasks run when the DataFrame is collected
        return DataFrame(self._spark._jsparkSession.internalCreateDataFrame(rdd, schema, False), self._spark)
