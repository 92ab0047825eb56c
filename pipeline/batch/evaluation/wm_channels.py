"""The watermark channel of each row reaching a window, in the batch evaluation (docs/windows.md "Channels",
:mod:`pipeline.windows.channels`): the row's source partition ``<source>/<partition>`` when it carries one (read
from a source, through stateless steps and forwarding operators, which keep the source position columns), else
the ``op:<uid>`` channel of the operator that built it; and the fold of the channels' highest event times into the
watermark epoch by epoch (:func:`watermark_fold`), as the runtime folds them."""
from __future__ import annotations

from pipeline.batch.evaluation.context import PlanContext
from pipeline.windows.channels import fixed_channels

__all__ = ["channel_column", "watermark_fold"]


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


def watermark_fold(maxima: list[tuple[int, str, int]], ooo_us: int):
    """The runtime's watermark fold over ``(epoch, channel, highest event time in it)``: per epoch with rows, the
    watermark before and after it (``W = max(W, min over the epoch's active channels of their running highest time
    - ooo_us)``), the channels' highest times and the final watermark: ``(w_prev, w_after, seen, w)``."""
    seen: dict[str, int] = {}
    w_prev: dict[int, int | None] = {}
    w_after: dict[int, int | None] = {}
    w: int | None = None
    for m in sorted({e for e, _, _ in maxima}):
        w_prev[m] = w
        active = [(c, x) for e, c, x in maxima if e == m]
        for c, x in active:
            seen[c] = max(seen.get(c, x), x)
        cand = min(seen[c] for c, _ in active) - ooo_us
        w = cand if w is None else max(w, cand)
        w_after[m] = w
    return w_prev, w_after, seen, w
