"""The watermark channel of each row reaching a window, in the batch evaluation (docs/windows.md "Channels",
:mod:`pipeline.windows.channels`): the row's source partition ``<source>/<partition>`` when it carries one (read
from a source, through stateless steps and forwarding operators, which keep the source position columns), else
the ``op:<uid>`` channel of the operator that built it."""
from __future__ import annotations

from pipeline.batch.evaluation.context import PlanContext
from pipeline.windows.channels import fixed_channels

__all__ = ["channel_column"]


def channel_column(plan: PlanContext, nid: int, df):
    """A Spark column: the channel of each row of ``df`` (node ``nid``'s frame), as the runtime tags it; or a string
    saying why it cannot be told (rows of several operators that do not forward channels meet in one stream: the
    runtime tells them apart by the input they arrive on, the batch frame does not keep it)."""
    from pyspark.sql import functions as F  # lazy: pyspark only where a Spark plan is built
    fixed = sorted(fixed_channels(plan.job, nid))
    if len(fixed) > 1:
        return (f"the rows of {', '.join(fixed)} meet in one stream before the window: their watermark channels "
                "are not kept apart by the batch evaluation")
    built = F.lit(fixed[0]) if fixed else F.lit(None).cast("string")
    if "_source" not in df.columns:
        return built
    own = F.concat(F.col("_source"), F.lit("/"), F.col("_partition").cast("string"))
    return F.when(F.col("_source").isNotNull(), own).otherwise(built) if fixed else own
