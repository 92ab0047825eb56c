"""The watermark channel of each row reaching a window, in the batch evaluation (docs/windows.md "Channels",
:mod:`pipeline.windows.channels`): the channel set a join gave the row (column ``_wm_channel``: both rows'
channels, :func:`union_channels_sql`), else the row's source partition ``<source>/<partition>`` when it carries one
(read from a source, through stateless steps and forwarding operators, which keep the source position columns),
else the ``op:<uid>`` channel of the operator that built it; and the fold of the channels' highest event times into
the watermark epoch by epoch (:func:`watermark_fold`; a set counts for each of its channels: :func:`split_maxima`),
as the runtime folds them."""
from __future__ import annotations

from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.result import WM_CHANNELS
from pipeline.operators.channel_sets import SEPARATOR, split_channels
from pipeline.windows.channels import fixed_channels

__all__ = ["channel_column", "watermark_fold", "watermark_steps", "union_channels_sql", "split_maxima"]


def union_channels_sql(left, right):
    """A Spark column: per row, the union of two channel sets spelled as the runtime spells it
    (:func:`pipeline.operators.channel_sets.union_channels`: sorted, distinct, joined by the separator; a null
    side adds nothing)."""
    from pyspark.sql import functions as F  # lazy: pyspark only where a Spark plan is built
    parts = F.split(F.concat_ws(SEPARATOR, left, right), "\\" + SEPARATOR)
    return F.array_join(F.array_sort(F.array_distinct(F.filter(parts, lambda c: c != F.lit("")))), SEPARATOR)


def split_maxima(maxima: list[tuple[int, str, int]]) -> list[tuple[int, str, int]]:
    """``(epoch, channel set, highest event time)`` rows as ``(epoch, channel, highest event time)``: a row of a
    channel set counts for each of its channels (the runtime's :func:`pipeline.windows.watermark.observe_channels`)."""
    out: dict[tuple[int, str], int] = {}
    for e, s, t in maxima:
        for c in split_channels(s):
            out[(e, c)] = max(out.get((e, c), t), t)
    return sorted((e, c, t) for (e, c), t in out.items())


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
    if "_source" in df.columns:
        own = F.concat(F.col("_source"), F.lit("/"), F.col("_partition").cast("string"))
        built = F.when(F.col("_source").isNotNull(), own).otherwise(built) if fixed else own
    if WM_CHANNELS in df.columns:   # rows a join built: the channel sets it gave them
        return F.coalesce(F.col(WM_CHANNELS), built)
    return built


def watermark_fold(maxima: list[tuple[int, str, int]], ooo_us: int):
    """The runtime's watermark fold over ``(epoch, channel, highest event time in it)``: per epoch with rows, the
    watermark before and after it (``W = max(W, min over the epoch's active channels of their running highest time
    - ooo_us)``), the channels' highest times and the final watermark: ``(w_prev, w_after, seen, w)``."""
    maxima = split_maxima(maxima)
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


NEVER_US = -(2 ** 62)   # below every watermark: the lower end of the first step


def watermark_steps(plan: PlanContext, w_after: dict[int, int | None]):
    """W's steps up to the checkpoint's epoch as a broadcastable interval table: ``(__lo, __hi]`` -> epoch ``__f``,
    the first epoch whose watermark reached a time in the interval."""
    steps, prev = [], None
    for m in sorted(w_after):
        x = w_after[m]
        if m > plan.prefix.epoch or x is None or (prev is not None and x <= prev):
            continue
        steps.append((NEVER_US if prev is None else prev, x, m))
        prev = x
    return plan.spark.createDataFrame(steps, "__lo long, __hi long, __f long")
