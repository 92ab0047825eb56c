"""Batch rule of a source: its prefix as a DataFrame (:func:`source_frame`), with the rows an unaligned snapshot
parked at a join flagged :data:`~pipeline.batch.evaluation.result.PARKED` (read by every operator reading the
source directly, dropped from a join's inputs by :func:`unparked`)."""
from __future__ import annotations

from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.result import PARKED
from pipeline.batch.evaluation.source_read import source_dataframe
from pipeline.checkpoint.channel import partition_of
from pipeline.job import SourceNode


def unparked(df):
    """A join's input without the rows the validated unaligned checkpoint parked at the join (its in-flight channel
    state, consumed by the next checkpoint: :func:`source_frame`)."""
    if df is None or PARKED not in df.columns:
        return df
    return df.filter(~df[PARKED]).drop(PARKED)




def read_positions(plan: PlanContext) -> dict[str, dict[int, tuple[int, int]]] | None:
    """Where the validated checkpoint had read each partition to (``positions``, with an in-flight range's start
    instead: what a restore resumes reading at), when that is not the prefix's end: an unaligned snapshot parks
    the rows its backlogged channels read in the snapshot round, which the join has not consumed (they are its
    channel state) but an operator reading the source directly has."""
    if plan._read_memo is not None:   # one LIST of the store per plan, whatever the number of sources
        return plan._read_memo[0]
    cid = plan.prefix.checkpoint_id
    md = None if cid is None else next((cp.metadata for cp in plan.runner.coordinator.store.list()
                                        if cp.checkpoint_id == cid), None)
    plan._read_memo = (None,)
    if md is None or not md.channel_state:
        return None
    out = {s: {partition_of(p): (int(pos.seq), int(pos.row)) for p, pos in parts.items()}
           for s, parts in md.positions.items()}
    for c in md.channel_state:
        if c.file is None and (ch := c.source_channel) is not None and c.start is not None:
            out.setdefault(ch.source, {})[ch.partition] = (int(c.start.seq), int(c.start.row))
    read = {s: {p: min(pos, plan.prefix.barriers.get(s, {}).get(p, pos)) for p, pos in parts.items()}
            for s, parts in out.items()}
    plan._read_memo = (read,)
    return read



def source_frame(plan: PlanContext, node: SourceNode):
    """A source's prefix. When the validated unaligned checkpoint parked rows of this source (read in its snapshot
    round on a backlogged channel: ``[positions, range start)``), they are read too and flagged :data:`PARKED`:
    every operator reading the source directly consumed them (they are in its state and output), only the join
    did not (they are its in-flight channel state, consumed by the next checkpoint), so :func:`_unparked` drops
    them from a join's inputs. Otherwise the prefix as it is (``Prefix.stops``)."""
    read = (read_positions(plan, ) or {}).get(node.name, {})
    cut = plan.prefix.stops(node.name)
    parked = {p: c for p, c in cut.items() if read.get(p, c) > c}
    if not parked:
        return source_dataframe(plan.spark, plan.runner, plan.job, node, plan.prefix)
    import dataclasses

    from pyspark.sql import functions as F
    stops = {s: dict(plan.prefix.stops(s)) for s in plan.prefix.barriers}
    stops[node.name] = {p: read.get(p, c) for p, c in cut.items()}
    df = source_dataframe(plan.spark, plan.runner, plan.job, node, dataclasses.replace(plan.prefix, consumed=stops))
    flag = F.lit(False)
    for p, (seq, row) in parked.items():
        flag = flag | ((F.col("_partition") == F.lit(p))
                       & ((F.col("_seq") > F.lit(seq)) | ((F.col("_seq") == F.lit(seq)) & (F.col("_row") >= F.lit(row)))))
    return df.withColumn(PARKED, flag)
