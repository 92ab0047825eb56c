"""Batch evaluation: a job's dataflow as one Spark batch plan over the source prefix of a checkpoint.

* :func:`prefix_of` - the :class:`Prefix` (barriers of checkpoint n, the barrier log before it, epoch length);
* :func:`evaluate` - compile the job into lazy DataFrames (:class:`BatchResult`: sinks, states, unchecked);
* :func:`write_batch` - the CLI ``epochal batch``: one-shot output of a job over a prefix, as Parquet.

See ``docs/batch.md`` for the rules.
"""
from __future__ import annotations

from pipeline.batch.evaluation.join_keys import join_semantics
from pipeline.batch.evaluation.plan import evaluate
from pipeline.batch.evaluation.prefix import Prefix, barrier_log, lag_log, scan_settings
from pipeline.batch.evaluation.result import BatchResult
from pipeline.checkpoint.channel import partition_of
from pipeline.exceptions import CheckpointError
from pipeline.runtime.driver import progress

__all__ = ["Prefix", "BatchResult", "evaluate", "prefix_of", "consumed_positions", "lagging_partitions", "write_batch",
           "join_semantics"]


def prefix_of(runner, md) -> Prefix:
    """The prefix of checkpoint metadata ``md``: its barrier positions and the barrier log of earlier epochs."""
    barriers = {s: {partition_of(p): (int(pos.seq), int(pos.row)) for p, pos in parts.items()}
                for s, parts in md.barriers.items()}
    low = md.recovery.low_epoch
    # epochs a checkpoint completed while a partition lagged are not in the barrier log: where those checkpoints
    # stopped reading places their rows (docs/batch.md "Lagging partitions"); a logged epoch wins
    log = {**lag_log(runner.ckpt_fio, runner.job_root, int(md.epoch), int(md.checkpoint_id)),
           **barrier_log(runner.ckpt_fio, runner.job_root, int(md.epoch))}
    return Prefix(int(md.epoch), int(runner.config.epoch_seconds), barriers, log,
                  low_epoch=None if low is None else int(low), checkpoint_id=int(md.checkpoint_id),
                  consumed=consumed_positions(md))


def consumed_positions(md) -> dict[str, dict[int, tuple[int, int]]] | None:
    """Where the rows checkpoint ``md``'s state and committed output cover end, when that is not its barriers: an
    exactly-once checkpoint with pending channel state (unaligned, a backlog) holds exactly the rows before its
    restore positions (``positions``, the cut); the in-flight files and source ranges up to the barriers are
    consumed by later checkpoints. None: the barriers (aligned; the at-least-once tracker, whose positions are
    the barriers). A partition without barrier n (lagging, :func:`lagging_partitions`) ends at its restore position
    too: the rows the checkpoint consumed there are placed by the lag log (docs/batch.md "Lagging partitions")."""
    if not md.channel_state or str(md.checkpoint_mode) == "at_least_once":
        return None
    out: dict[str, dict[int, tuple[int, int]]] = {}
    for s, parts in md.barriers.items():
        for p, b in parts.items():
            pos = md.positions.get(s, {}).get(p, b)
            out.setdefault(s, {})[partition_of(p)] = min((int(pos.seq), int(pos.row)), (int(b.seq), int(b.row)))
    for s, parts in md.positions.items():   # a lagging partition (no barrier n): what it consumed ends at the cut
        for p, pos in parts.items():
            if p not in md.barriers.get(s, {}):
                out.setdefault(s, {})[partition_of(p)] = (int(pos.seq), int(pos.row))
    return out


def lagging_partitions(md) -> list[str]:
    """``<source>/partition=<p>`` of checkpoint ``md`` whose barrier was not known when it completed (an open
    channel-state range; unaligned checkpoints need not wait for a lagging partition). The runtime tags the rows it
    reads there with the checkpoint's epoch; the batch plan places them by the lag log (``prefix.lag_log``)."""
    out = {ch.name for c in md.channel_state if c.file is None and (ch := c.source_channel) is not None and c.end is None}
    out |= {f"{s}/partition={p}" for s, parts in md.positions.items() for p in parts
            if p not in md.barriers.get(s, {})}
    return sorted(out)


def write_batch(runner, checkpoint: str | None, to_dir: str) -> dict:
    """Evaluate the job over checkpoint ``checkpoint``'s prefix (default: the latest completed one) and write
    every modelled sink table and operator state as Parquet under ``to_dir`` (``sink/<table>/``,
    ``state/<uid>/<name>/``). Returns ``{"checkpoint", "epoch", "objects": {obj: rows}, "unchecked"}``."""
    import os
    import shutil

    cp = runner.snapshot(checkpoint)
    if cp is None:
        raise CheckpointError(f"job {runner.job.name!r} has no completed checkpoint (nothing to evaluate)")
    progress.step("compiling the batch plan (Spark starts here)")
    res = evaluate(runner, runner.job, prefix_of(runner, cp.metadata))
    out = {}
    objects = sorted(res.objects().items())
    with scan_settings(runner.spark, runner.config.parallelism):
        progress.step("evaluating and writing objects", total=len(objects), unit="objects")
        for obj, df in objects:
            path = os.path.join(os.path.abspath(to_dir), obj)
            shutil.rmtree(path, ignore_errors=True)
            t = df.toArrow()  # type: ignore[attr-defined]
            os.makedirs(path, exist_ok=True)
            import pyarrow.parquet as pq
            pq.write_table(t, os.path.join(path, "part-00000.parquet"))
            out[obj] = t.num_rows
            progress.advance(1)
    return {"checkpoint": cp.checkpoint_id, "epoch": cp.metadata.epoch, "to": os.path.abspath(to_dir),
            "objects": out, "unchecked": dict(res.unchecked), "messages": list(res.messages)}
