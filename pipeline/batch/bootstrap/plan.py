"""What a bootstrap will write, decided before any side effect (:func:`plan_bootstrap`, step 1 of the protocol in
:mod:`pipeline.batch.bootstrap`): the job is new, every object is derivable exactly (:func:`refusal`), the target,
the parallelism and barrier ``n`` fit."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipeline.checkpoint.channel import partition_key
from pipeline.exceptions import BootstrapRefusedError, CheckpointError, ConfigError
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
from pipeline.layout import metadata_uri
from pipeline.runtime.driver.cursor import Cursor
from pipeline.runtime.driver.progress import last_data_epoch
from pipeline.runtime.driver.savepoints import check_target
from pipeline.source.positions import barrier_or_idle

__all__ = ["BootstrapPlan", "CATCH_UP", "plan_bootstrap", "refusal"]


@dataclass(frozen=True)
class BootstrapPlan:
    """What :func:`bootstrap` will write, decided before any side effect."""

    epoch: int
    barriers: dict                       # source -> partition (str) -> Position
    parallelism: int
    target: str | None                   # normalised savepoint target, None: <job>/savepoints/
    messages: tuple[str, ...] = field(default_factory=tuple)


#: what a user does instead of a refused bootstrap (one clause, appended to every refusal)
CATCH_UP = ("catch up with `epochal run` instead (PIPELINE_MAX_EPOCHS_PER_ROUND=8 runs several epochs per round, "
            "docs/batch.md \"Bootstrap\")")


def refusal(job) -> str | None:
    """Why ``job`` cannot be bootstrapped exactly (one line naming the operator, why, and what to do instead), or None.

    Only the operator kinds whose state the batch plan derives exactly are accepted: ``join`` (both sides,
    ``_matched`` flags), ``aggregate`` (exact decimal sums), ``deduplicate`` (held keys), ``top_n`` / ``keep_last`` (the first n rows per key) and ``window`` (records
    of unfired windows, watermark table), fed by a source, a join, a deduplicate or an ``emit="final"`` window (its
    fired windows' rows carry their firing epoch in the plan). Refused:

    * ``process``: its state is whatever the user function builds from one epoch's rows at a time; the plan cannot
      derive it without calling the function epoch by epoch, which is what ``run`` does;
    * any operator other than an aggregate reading an ``emit="update"`` window's output: a changelog with one row per
      window and epoch it changed in (the plan models the windows, not their intermediate updates);
    * what the plan itself does not model (a deduplicate of a window's or an aggregate's output, an operator other
      than an aggregate reading an aggregate's changelog): refused by :func:`_objects` with the plan's reason."""
    for op in job.operators():
        if isinstance(op, ProcessNode):
            return (f"job {job.name!r}: cannot bootstrap process {op.uid!r}: its state is built by a user function "
                    f"one epoch at a time, which the batch plan cannot derive without running the epochs; {CATCH_UP}")
        if not isinstance(op, (JoinNode, AggregateNode, DedupNode, WindowNode, RankNode, IntervalJoinNode,
                               TemporalJoinNode, OverAggregateNode)):
            return (f"job {job.name!r}: cannot bootstrap {type(op).__name__} {op.uid!r}: not modelled by the batch "
                    f"plan; {CATCH_UP}")
        for inp in op.inputs:
            up = job.nodes[job.chain_to(inp)[0]]
            if isinstance(up, WindowNode) and up.emit == "update" and not isinstance(op, AggregateNode):
                return (f"job {job.name!r}: cannot bootstrap {type(op).__name__.removesuffix('Node').lower()} "
                        f"{op.uid!r}: it reads the changelog of window {up.uid!r} (emit='update': a row per window "
                        f"and epoch it changed in, which the batch plan does not model; emit='final' bootstraps); "
                        f"{CATCH_UP}")
    return None


def _barriers(runner, epoch: int, summaries) -> tuple[dict | None, str | None]:
    """Barrier ``epoch`` as the runtime would cut it for a fresh job (logged one if any), or the lagging partition."""
    logged = runner.barrier_log.logged(epoch)
    if logged is not None:
        return logged, None
    ctx = runner.ctx
    end = ctx.epochs.end_us(epoch)
    now, lateness = ctx.clock.now_us(), ctx.config.allowed_lateness_seconds * 1_000_000
    out: dict = {}
    for src, parts in summaries.items():
        out[src] = {}
        for p, ss in sorted(parts.items()):
            pos, _idle = barrier_or_idle(ss, end, now_us=now, allowed_lateness_us=lateness, fileio=ctx.src_fio)
            if pos is None:
                return None, f"{src}/partition={p}"
            out[src][partition_key(p)] = pos
    return out, None


def plan_bootstrap(runner, *, epoch: int | None = None, target: str | None = None,
                   parallelism: int | None = None) -> tuple[BootstrapPlan, Any]:
    """Step 1: every check, without a side effect. Returns the plan and the source summaries."""
    job, config = runner.job, runner.config
    why = refusal(job)
    if why is not None:
        raise BootstrapRefusedError(why)
    if target is not None:
        target = check_target(target, config, job.name)
        if runner.ckpt_fio.exists(metadata_uri(target)):
            raise ConfigError(f"savepoint target {target} already holds a completed checkpoint or savepoint "
                              "(_metadata); choose another target")
    P = parallelism or config.parallelism
    if P < 1 or P > runner.max_parallelism:
        raise ConfigError(f"parallelism {P} must be between 1 and the job's max parallelism {runner.max_parallelism}")
    ids = runner.coordinator.store.ids()
    if ids:
        raise BootstrapRefusedError(
            f"job {job.name!r} already has completed checkpoints {ids[-3:]} under {runner.job_root}: bootstrap "
            "writes the first savepoint of a new job (use a new job name, or restore/run the existing one)")
    for s in job.sinks():
        head = runner.ctx.table(s.table).head()
        if head is not None:
            raise BootstrapRefusedError(
                f"job {job.name!r}: sink table {s.table!r} already holds committed output (checkpoint "
                f"{head.checkpoint_id}); bootstrap writes the first commit of a new job's sinks")
    summaries = runner.planner.summaries(Cursor())
    last = last_data_epoch(summaries, runner.epochs.epoch_of)
    if last is None:
        raise CheckpointError(f"job {job.name!r}: the sources under {config.source_uri} hold no readable row; "
                              "nothing to bootstrap")
    if epoch is not None:
        if epoch < 0:
            raise ConfigError(f"--epoch {epoch}: must be >= 0")
        first = runner.planner.first_epoch(summaries)
        if first is not None and epoch < first:
            raise ConfigError(f"--epoch {epoch}: before the first epoch with data ({first}) under "
                              f"{config.source_uri}: a new job's first checkpoint is that epoch's or a later one")
        barriers, lag = _barriers(runner, epoch, summaries)
        if barriers is None:
            raise CheckpointError(f"job {job.name!r}: barrier {epoch} is not complete yet: {lag} lags (no row at/"
                                  "after the epoch end and the allowed lateness has not passed)")
    else:  # the live epoch: the newest epoch whose barrier is complete
        barriers, lag, epoch = None, None, last
        while barriers is None and epoch >= last - 3:
            barriers, lag = _barriers(runner, epoch, summaries)
            if barriers is None:
                epoch -= 1
        if barriers is None:
            raise CheckpointError(f"job {job.name!r}: no complete barrier near the end of the sources "
                                  f"(epoch {last}): {lag} lags")
    return BootstrapPlan(epoch, barriers, P, target), summaries
