"""Epoch planning and rewind: which epoch the job completes next, and where a re-run starts from.

* :meth:`EpochPlanner.summaries` lists every source partition (file-level summaries since the cursor);
* :meth:`EpochPlanner.next_run_target` / :meth:`EpochPlanner.next_interval_target` choose the next epoch
  for ``epochal run`` (catch up on unread data) and for an Airflow data interval (every epoch up to it);
* :meth:`EpochPlanner.rewind_cursor` finds the checkpoint a re-run of epoch n restores (the newest usable
  one before n, or the start of the sources), like restoring an earlier Flink checkpoint.
"""
from __future__ import annotations

from pipeline.checkpoint.channel import Channel, partition_of
from pipeline.checkpoint.handles import Position
from pipeline.checkpoint.restores import RestoreEvent, RestoreLog, utc_now
from pipeline.exceptions import CheckpointError, EpochalError
from pipeline.fileio.s3 import list_page_size
from pipeline.runtime.driver.context import RuntimeContext
from pipeline.runtime.driver.cursor import Cursor, cursor_from_metadata
from pipeline.runtime.driver.results import RunReport
from pipeline.source.contract import check_source_contract, inventory_behind, listing_start, unplaceable_files_error
from pipeline.source.lake import LAKE_PARTITION, check_retained_restore_point, lake_source_files
from pipeline.source.layout import list_source_files
from pipeline.source.planner import count_rows
from pipeline.source.positions import end_position
from pipeline.source.summary import summarize_source

__all__ = ["EpochPlanner"]


class EpochPlanner:
    """Chooses epochs to complete and rewinds (see module docstring)."""

    def __init__(self, ctx: RuntimeContext) -> None:
        self.ctx = ctx

    def listing_start(self, cursor: Cursor, source: str) -> dict[int, int] | None:
        """Where the source's partitions are listed from (partition -> seq), or None for a full listing.

        Full: a fresh job, every ``source_full_listing_every``-th checkpoint (the audit of every file against
        the read inventory), a checkpoint without an inventory, or while a full listing costs no more requests
        than one per partition (fewer known files than a LIST page per partition). Otherwise incremental:
        from the ``source_listing_window`` newest files behind each position (see
        :func:`pipeline.source.contract.listing_start`)."""
        cfg = self.ctx.config
        cid, every = cursor.checkpoint_id, cfg.source_full_listing_every
        if cid is None or (every > 0 and cid % every == 0):
            return None
        positions = cursor.positions.get(source, {})
        start = listing_start(cursor.inventory or {}, positions, source, cfg.source_listing_window)
        known = sum(len(v) for v in (cursor.inventory or {}).get(source, {}).values())
        if start is None or known <= list_page_size() * (1 + len(positions)):
            return None
        return start

    def summaries(self, cursor: Cursor):
        ctx = self.ctx
        out, listing, behind = {}, {}, {}
        unexpected = getattr(ctx, "unexpected_dead_letters", None)
        if unexpected is None:
            unexpected = ctx.unexpected_dead_letters = {}
        for src in ctx.job.sources():
            start: dict[int, int] | None
            if src.table is not None:  # a lake table: its commits from the last version read on (lineage checked)
                files, start = lake_source_files(
                    src.name, src.table, src.schema, ctx.config.source_uri,
                    cursor.positions.get(src.name, {}).get(str(LAKE_PARTITION)),
                    (cursor.inventory or {}).get(src.name, {}).get(str(LAKE_PARTITION)), cursor.checkpoint_id,
                    ingest_time=src.ingest_time, now_us=ctx.clock.now_us(), warn=lambda m: ctx.echo(f"WARNING: {m}"))
                self._check_oldest_retained(cursor, src)
            else:
                start = self.listing_start(cursor, src.name)
                files = list_source_files(ctx.src_fio, ctx.config.source_uri, src.name, policy=ctx.config.bad_records,  # type: ignore[arg-type]
                                          dead_letter_root=ctx.dead_letter_root, job=ctx.job.name,
                                          new_dead_letters=unexpected, start_at=start)
            since = {partition_of(p): pos for p, pos in cursor.positions.get(src.name, {}).items()}
            out[src.name] = summarize_source(files, since=since, fileio=ctx.src_fio)
            listing[src.name] = files
            if start is not None:
                behind[src.name] = inventory_behind(cursor.inventory or {}, src.name, start)
        ctx.source_listing = listing  # the read inventory of the next checkpoint is taken from it ...
        ctx.source_inventory_behind = behind  # ... and from the inventory behind an incremental listing
        ctx.contract_dead_letters = check_source_contract(ctx, cursor, listing)
        return out

    def _check_oldest_retained(self, cursor: Cursor, src) -> None:
        """The lake source's retention contract for the oldest retained checkpoint too (a restore may choose it);
        warnings only (pipeline/source/lake_retention.py)."""
        ctx = self.ctx
        try:
            retained = ctx.coordinator.store.list()
        except EpochalError:   # the listing of the job's own restore point decides; this check only warns
            return
        if not retained or retained[0].checkpoint_id == cursor.checkpoint_id:
            return
        old = cursor_from_metadata(retained[0].metadata)
        check_retained_restore_point(
            src.name, src.table, src.schema, ctx.config.source_uri,
            old.positions.get(src.name, {}).get(str(LAKE_PARTITION)),
            (old.inventory or {}).get(src.name, {}).get(str(LAKE_PARTITION)), retained[0].checkpoint_id,
            ingest_time=src.ingest_time, now_us=ctx.clock.now_us(), warn=lambda m: ctx.echo(f"WARNING: {m}"))

    def first_epoch(self, summaries) -> int | None:
        ts = [s.min_ts for parts in summaries.values() for ss in parts.values() for s in ss
              if s.min_ts is not None and not s.corrupt and s.rows]
        return self.ctx.epochs.epoch_of(min(ts)) if ts else None

    def unread(self, cursor: Cursor, summaries) -> int:
        n = 0
        for src, parts in summaries.items():
            for p, ss in parts.items():
                if not ss:
                    continue
                start = Channel.of(src, p).lookup(cursor.positions, Position(seq=0, row=0))
                n += count_rows(ss, start, end_position(ss))
                n += sum(1 for s in ss if s.corrupt and s.seq >= start.seq)
        return n + sum(c.file.rows for cs in cursor.inflight.values() for c in cs if c.file is not None)

    def next_unread_epoch(self, cursor: Cursor, summaries) -> int | None:
        """Epoch of the earliest unread row (file-level lower bound)."""
        best = None
        for src, parts in summaries.items():
            for p, ss in parts.items():
                start = Channel.of(src, p).lookup(cursor.positions, Position(seq=0, row=0))
                for s in sorted(ss, key=lambda s: s.seq):
                    if s.seq < start.seq or s.corrupt or not s.rows or s.min_ts is None:
                        continue
                    if s.seq == start.seq and start.row >= s.rows:
                        continue
                    best = s.min_ts if best is None else min(best, s.min_ts)
                    break
        return None if best is None else self.ctx.epochs.epoch_of(best)

    def next_run_target(self, cursor: Cursor, summaries) -> int:
        """``epochal run``: the epoch after the cursor's, or the epoch of the earliest unread row if later."""
        nxt = self.next_unread_epoch(cursor, summaries)
        first = self.first_epoch(summaries) if cursor.epoch is None else cursor.epoch + 1
        if first is None and nxt is None:  # a fresh job whose unread files are all unreadable
            raise unplaceable_files_error(self.ctx.job.name, summaries)
        target = max(x for x in (first, nxt) if x is not None)
        if cursor.epoch is not None and nxt is not None and nxt <= cursor.epoch:
            target = cursor.epoch + 1  # unread rows at/before the last epoch (backlog/late files)
        return target

    def first_interval_target(self, epoch: int, summaries) -> int:
        """Fresh job asked for ``epoch`` (an Airflow data interval): its first epoch with data, if earlier."""
        first = self.first_epoch(summaries)
        return epoch if first is None or first >= epoch else first

    def rewind_cursor(self, epoch: int, report: RunReport) -> Cursor:
        """The newest usable checkpoint whose epoch is < ``epoch`` (for re-running ``epoch``)."""
        ctx = self.ctx
        store = ctx.coordinator.store
        candidates = sorted((c for c in store.list() if c.epoch < epoch),
                            key=lambda c: c.checkpoint_id, reverse=True)
        for c in candidates:
            problems = c.problems(ctx.ckpt_fio)
            if problems:
                msg = f"rewind: skipping {c.describe()}: {problems[0]}"
                ctx.echo(f"WARNING: {msg}")
                report.messages.append(msg)
                continue
            ctx.echo(f"rewind: re-processing from {c.describe()} (epoch {c.epoch}) to re-run epoch {epoch}")
            report.messages.append(f"rewound to checkpoint {c.checkpoint_id} (epoch {c.epoch})")
            ctx.coordinator.mark_known(store.ids())
            RestoreLog(ctx.ckpt_fio, ctx.job_root).record(RestoreEvent(
                kind="rewind", at=utc_now(), from_kind="checkpoint", from_id=c.checkpoint_id, from_epoch=c.epoch,
                from_location=c.location, rerun_epoch=epoch,
                abandoned=tuple(i for i in store.ids() if i > c.checkpoint_id)))
            return cursor_from_metadata(c.metadata)
        first_ids = store.ids()
        earliest = min((c.epoch for c in store.list()), default=None)
        summaries = self.summaries(Cursor())
        first = self.first_epoch(summaries)
        if first is not None and epoch <= first:
            ctx.echo(f"rewind: epoch {epoch} is the job's first epoch: re-processing from the start")
            report.messages.append("rewound to the start of the sources")
            ctx.coordinator.mark_known(first_ids)
            RestoreLog(ctx.ckpt_fio, ctx.job_root).record(RestoreEvent(
                kind="rewind", at=utc_now(), from_kind="start", from_id=None, from_epoch=None, from_location=None,
                rerun_epoch=epoch, abandoned=tuple(first_ids)))
            return Cursor()
        raise CheckpointError(
            f"job {ctx.job.name!r}: cannot re-run epoch {epoch}: no retained checkpoint before it (retained "
            f"checkpoints {first_ids}, earliest epoch {earliest}); restore a savepoint taken before epoch "
            f"{epoch} or raise PIPELINE_RETAINED_CHECKPOINTS")
