"""The write-ahead barrier log: barrier n of every source partition, chosen and written before processing.

Flink injects ``CheckpointBarrier(n)`` into the sources; here barrier n is, per source partition, the
position of the first row with ``_ingest_ts >=`` the end of epoch n. It is logged (``barriers/epoch-n.json``,
conditional PUT) before any round of checkpoint n reads data, so every replay of epoch n is deterministic
and two runners agree on it (the first writer wins; the other reads theirs).

A partition without such a row *lags* while the clock has not passed the epoch's end plus the allowed
lateness; after that it is *idle* and its barrier is its end (everything it has).
"""
from __future__ import annotations

import json
from collections.abc import Mapping

from pipeline.checkpoint.channel import Channel, nest, partition_key
from pipeline.checkpoint.handles import Position
from pipeline.exceptions import ConditionalWriteError, ObjectNotFoundError
from pipeline.layout import JobLayout
from pipeline.runtime.driver.context import RuntimeContext
from pipeline.runtime.driver.cursor import Cursor
from pipeline.source.positions import barrier_or_idle, barrier_position

__all__ = ["BarrierLog", "Barriers"]

#: ``{source: {partition: Position}}``; ``None`` for a lagging partition (unaligned-from-the-start only)
Barriers = Mapping[str, Mapping[str, Position | None]]


class BarrierLog:
    """Reads and writes the write-ahead barrier log of one job (see module docstring)."""

    def __init__(self, ctx: RuntimeContext) -> None:
        self.ctx = ctx

    def uri(self, epoch: int) -> str:
        return JobLayout(self.ctx.job_root).barrier(epoch)

    def is_logged(self, epoch: int) -> bool:
        return self.ctx.ckpt_fio.exists(self.uri(epoch))

    def logged(self, epoch: int) -> dict[str, dict[str, Position]] | None:
        """Barrier ``epoch`` from the write-ahead barrier log, None if it is not logged (yet)."""
        try:
            doc = json.loads(self.ctx.ckpt_fio.read_bytes(self.uri(epoch)))
        except ObjectNotFoundError:
            return None
        return {s: {p: Position.from_dict(v) for p, v in parts.items()} for s, parts in doc["barriers"].items()}

    def barriers_for(self, epoch: int, summaries, cursor: Cursor) -> dict[str, dict[str, Position]] | None:
        """Barrier n positions per source partition from the write-ahead barrier log (written first if
        new). None while a partition lags (no row >= end of epoch and the clock has not passed the end
        plus the allowed lateness)."""
        ctx = self.ctx
        uri = self.uri(epoch)
        logged = self.logged(epoch)
        if logged is not None:
            return logged
        end = ctx.epochs.end_us(epoch)
        now, lateness = ctx.clock.now_us(), ctx.config.allowed_lateness_seconds * 1_000_000
        out: dict[str, dict[str, Position]] = {}
        idle: dict[str, list[str]] = {}
        for src, parts in summaries.items():
            out[src] = {}
            for p, ss in sorted(parts.items()):
                pos, is_idle = barrier_or_idle(ss, end, now_us=now, allowed_lateness_us=lateness, fileio=ctx.src_fio)
                if pos is None:  # lagging
                    return None
                ch = Channel.of(src, p)
                if is_idle:
                    start = ch.lookup(cursor.positions)
                    if start is not None and (start.seq, start.row) > (pos.seq, pos.row):
                        pos = start  # everything of this partition was consumed already
                    idle.setdefault(src, []).append(ch.key)
                out[src][ch.key] = pos
        doc = {"job": ctx.job.name, "epoch": epoch, "barrier_time": ctx.epochs.iso(end),
               "barriers": {s: {p: pos.to_dict() for p, pos in parts.items()} for s, parts in out.items()},
               "idle_partitions": idle, "written_at": ctx.epochs.iso(ctx.clock.now_us())}
        try:
            ctx.ckpt_fio.write_bytes(uri, (json.dumps(doc, indent=1) + "\n").encode(), if_none_match=True)
        except ConditionalWriteError:  # another runner logged it first: use theirs (deterministic)
            return self.barriers_for(epoch, summaries, cursor)
        return out

    def log_round(self, epoch: int, checkpoint_id: int, rnd: int, starts: Mapping[Channel, Position]) -> None:
        """Write-ahead: round ``rnd`` >= 1 of checkpoint ``checkpoint_id`` - or round 0 of an unaligned checkpoint
        that processes a new epoch - starts reading at ``starts`` (stored as ``{source: {partition: Position}}``,
        :func:`pipeline.checkpoint.channel.nest`). Kept beside the barrier log, never deleted by retention: the batch
        evaluation needs it for operators whose result depends on round boundaries (``deduplicate``'s "first row
        of its key" is decided per round, docs/batch.md). A re-run of the round writes the same document."""
        ctx = self.ctx
        doc = {"job": ctx.job.name, "epoch": epoch, "checkpoint_id": checkpoint_id, "round": rnd,
               "starts": _stored(starts)}
        try:
            ctx.ckpt_fio.write_bytes(JobLayout(ctx.job_root).round_start(epoch, checkpoint_id, rnd),
                                     (json.dumps(doc, indent=1) + "\n").encode(), if_none_match=True)
        except ConditionalWriteError:  # a retry of this round in the same checkpoint: the plan is the same
            pass

    def log_lagged(self, epoch: int, checkpoint_id: int, barriers: Barriers,
                   reads: Mapping[Channel, Position]) -> None:
        """Write-ahead, for a checkpoint that snapshots while a partition lags (epoch ``epoch`` is then not in the
        barrier log): where it stops reading each channel (``reads``, after its last round) and the barriers it
        knew. A lagging channel's rows past its last logged barrier get the epoch of the checkpoint that reads them
        (:meth:`pipeline.runtime.driver.input_epochs.InputEpochs.epoch_of`), and the rows of an unlogged epoch read by a
        later checkpoint get that checkpoint's epoch: this record is how the batch evaluation places them
        (``pipeline.batch.evaluation.prefix.lag_log``). Kept beside the barrier log, never deleted by retention."""
        ctx = self.ctx
        doc = {"job": ctx.job.name, "epoch": epoch, "checkpoint_id": checkpoint_id,
               "barriers": {s: {p: pos.to_dict() for p, pos in sorted(parts.items()) if pos is not None}
                            for s, parts in sorted(barriers.items())},
               "lagging": sorted(f"{s}/partition={p}" for s, parts in barriers.items()
                                 for p, pos in parts.items() if pos is None),
               "read": _stored(reads)}
        try:
            ctx.ckpt_fio.write_bytes(JobLayout(ctx.job_root).lagged_read(epoch, checkpoint_id),
                                     (json.dumps(doc, indent=1) + "\n").encode(), if_none_match=True)
        except ConditionalWriteError:  # a retry of the snapshot round in the same checkpoint: the same plan
            pass

    def barriers_or_partial(self, epoch: int, summaries, cursor: Cursor) -> Barriers | None:
        """Barrier n positions (:meth:`barriers_for`); while a partition lags, None - except with checkpoints
        that are unaligned from the first barrier: they need not wait, so the barriers known so far (from the
        data, deterministic) are returned with ``None`` for the lagging partitions, if at least one is known."""
        ctx = self.ctx
        barriers = self.barriers_for(epoch, summaries, cursor)
        if barriers is not None or not (ctx.config.unaligned and not ctx.config.aligned_timeout_seconds):
            return barriers
        end = ctx.epochs.end_us(epoch)
        partial = {src: {partition_key(p): barrier_position(ss, end, fileio=ctx.src_fio) for p, ss in sorted(parts.items())}
                   for src, parts in summaries.items()}
        lagging = [f"{s}/partition={p}" for s, parts in partial.items() for p, b in parts.items() if b is None]
        if len(lagging) == sum(len(parts) for parts in partial.values()):
            return None
        ctx.echo(f"epoch {epoch}: {', '.join(lagging)} lag(s); the unaligned checkpoint does not wait for them")
        return partial  # type: ignore[return-value]


def _stored(by_channel: Mapping[Channel, Position]) -> dict[str, dict[str, dict]]:
    """Channel-keyed positions as the barrier log stores them: ``{source: {partition: position}}``, sorted."""
    return {s: {p: pos.to_dict() for p, pos in parts.items()} for s, parts in nest(by_channel).items()}
