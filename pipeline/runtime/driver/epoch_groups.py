"""Several epochs in one Spark round (epoch tagging): when a round may carry more than one epoch, and what each
epoch of such a round is.

DESIGN.md, "Alignment in batch emulation: epoch tagging": every record carries the epoch it belongs to, a
stateful operator processes its input epoch by epoch (everything of epoch ``e``, then snapshot ``e``, then the
rest), and a Spark job may process several epochs at once as long as it emits the state of every checkpoint it
completes. With one Spark job per epoch, a catch-up of ``k`` waiting epochs pays the per-job fixed cost ``k``
times; a *tagged* round pays it once and still completes one checkpoint per epoch, in order.

A round takes up to ``PIPELINE_MAX_EPOCHS_PER_ROUND`` waiting epochs when everything about them is decided
before any side effect (:func:`group_refusal` for the job and configuration, then
:meth:`pipeline.runtime.driver.round_executor.RoundExecutor.complete_epochs` plans every epoch exactly as its own
first round would be planned and keeps the longest prefix where):

* the checkpoints are aligned exactly-once (no unaligned channel state, no alignment timeout, no at-least-once
  read-ahead), and nothing is in flight from the previous checkpoint;
* every barrier of the group is known (logged, no partition lagging), so each epoch snapshots in its first round;
* each epoch's segments reach its barrier within ``PIPELINE_MAX_RECORDS_PER_EPOCH`` and the group's records per
  input stay within it too (a round reads at most that many records per input, DESIGN.md "Rounds");
* the low watermark of each epoch is the epoch itself (every record of epoch ``e`` has own epoch ``e``);
* the operators are joins, running aggregates, deduplications, event-time windows and ``process``, on either state
  backend (heap, or the rocksdb keyed stores: each epoch's body opens the subtask's store at the version the
  previous epoch's snapshot left, so the store stays warm and writes one delta or base per epoch; materialisation
  follows each epoch's parent chain exactly as in sequential rounds), in a classic Spark session or under Spark
  Connect, for a checkpoint (savepoints and restores run alone).

Spark Connect has no local properties: a tagged round's plan is built for that round, and each operator's task
function captures the values of every epoch of the round (:class:`pipeline.runtime.operators.round_params.EmbeddedParams`),
as a one-epoch Connect round captures its own; the source splits travel in the read functions the same way.

Windows: the watermark advances per epoch inside the round. The upstream tasks send one marker per epoch and
channel (tagged with its epoch), so epoch ``e``'s body sees exactly the observations its own round would see; the
watermark state the previous epoch's body derived is carried in memory to the next epoch's body of the same subtask
(:func:`pipeline.runtime.operators.task.carried_from_previous_epoch`: only subtask 0 writes it to a file). Each epoch's
firings, late records (dead letters) and window state are those of its own round.

Anything else runs today's one epoch per round, unchanged. What a tagged round writes is what the sequential
rounds would write: per epoch a pending manifest and a round plan (write-ahead, before the Spark job), its
state snapshot chained on the previous epoch's, its sink staging under ``txn-<id>``, its acks; the checkpoints are
finalised in epoch order (``_metadata``, sink commit), so a crash after checkpoint ``c_i``'s ``_metadata``
restores ``c_i`` and the later ones of the round are garbage.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.barriers.events import CheckpointingMode
from pipeline.job import (
    AggregateNode,
    DedupNode,
    IntervalJoinNode,
    JoinNode,
    OverAggregateNode,
    ProcessNode,
    RankNode,
    TemporalJoinNode,
    WindowNode,
)
from pipeline.runtime.driver.context import RuntimeContext
from pipeline.runtime.driver.cursor import Cursor

__all__ = ["TAGGED_OPERATORS", "group_refusal", "PlannedEpoch"]

#: operators whose tasks run several epochs in one round (pipeline.runtime.operators.task.epoch_tagged_task)
TAGGED_OPERATORS = (JoinNode, AggregateNode, DedupNode, ProcessNode, WindowNode, RankNode, IntervalJoinNode,
                    TemporalJoinNode, OverAggregateNode)


def group_refusal(ctx: RuntimeContext, cursor: Cursor) -> str | None:
    """Why a round starting at ``cursor`` must carry one epoch only (None: it may carry several)."""
    cfg = ctx.config
    if cfg.max_epochs_per_round < 2:
        return "PIPELINE_MAX_EPOCHS_PER_ROUND is 1"
    if cfg.checkpoint_mode != CheckpointingMode.EXACTLY_ONCE or cfg.unaligned or cfg.aligned_timeout_seconds:
        return "checkpoints are not aligned exactly-once"
    others = [op.uid for op in ctx.job.operators() if not isinstance(op, TAGGED_OPERATORS)]
    if others:
        return f"operators {others} run one epoch per round"
    if cursor.inflight:
        return "in-flight channel state to replay"
    if ctx.spark_session is None:
        return "no Spark session"
    return None


@dataclass
class PlannedEpoch:
    """One epoch of a tagged round, planned on the driver before any side effect (its round 0)."""

    epoch: int
    known: dict                 # barrier n per source partition
    positions_before: dict      # {source: {partition: Position}} where the epoch starts
    positions_after: dict       # ... and where it ends (its barriers)
    segments: dict              # {source: {partition: Segment}}
    snap: Any                   # the barrier handler's Snapshot (aligned, round 0)
    round_log: dict             # the handler's events and decisions of the round (round plan "alignment")
    own_epochs: Any             # InputEpochs of the epoch
    records: dict[str, int]
    backlog: dict[str, int]
    now: float                  # the round's time (round plan "now")
    driver: Any = None          # the alignment driver after the round's last epoch (continues from there)
