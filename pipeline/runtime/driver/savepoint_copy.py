"""``savepoint`` without a Spark round: the latest checkpoint's state copied on the driver.

:func:`savepoint_by_copy` is the runner's first try (``JobRunner.savepoint``): it reads the latest valid completed
checkpoint (with the fallback every restore has), re-commits its sinks as every restore does, and writes the
savepoint with :func:`pipeline.checkpoint.savepoint_copy.copy_savepoint`. It returns None, having written nothing,
when copying cannot work (no checkpoint yet; channel state; another parallelism): the runner then takes the
savepoint with an idle aligned round, as before.
"""
from __future__ import annotations

from pipeline.checkpoint.recovery_fields import RecoveryFields
from pipeline.checkpoint.savepoint_copy import copy_blocker, copy_savepoint
from pipeline.runtime.driver import progress
from pipeline.runtime.driver.savepoints import abort_pending
from pipeline.state.backend import load_chain, write_table
from pipeline.state.chain import StateChain

__all__ = ["savepoint_by_copy", "savepoint_extra", "COPIED_KEY"]

#: ``_metadata.extra`` key of a savepoint written by copying: ``{"of_checkpoint": id}``
COPIED_KEY = "savepoint_copy"


def savepoint_extra(md) -> dict:
    """``_metadata.extra`` of a savepoint of checkpoint ``md``, as an idle aligned round over no rows records it: no
    records in its one round, nothing dropped or dead-lettered, aligned; ``md``'s low watermark, read inventory and
    bytes per row; and which checkpoint it copies."""
    rec = md.recovery
    records = {s: 0 for s in (rec.records or {})}
    fields = RecoveryFields(
        records=records, round_records=(records,), dropped={},
        alignment={"configured": "aligned", "mode_used": "aligned", "switched_to_unaligned": False,
                   "first_barrier_round": 0, "snapshot_round": 0, "between_rounds": False,
                   "alignment_ms": 0.0, "start_delay_ms": 0.0, "inflight_files": 0, "inflight_rows": 0,
                   "inflight_bytes": 0, "inflight_ranges": [], "lagging": [], "post_barrier_records": {}},
        low_epoch=rec.low_epoch_or(md.epoch), source_files=rec.source_files, bytes_per_row=rec.bytes_per_row)
    return {**fields.to_extra(), COPIED_KEY: {"of_checkpoint": md.checkpoint_id}}


def _materializer(src_fio, dst_fio, checkpoint: str):
    """Materialise an incremental chain into one canonical base file (a savepoint holds bases only)."""
    def materialize(h, uri: str):
        chain = StateChain.of(h)
        assert chain is not None   # only handles with a file are materialised
        return write_table(dst_fio, uri, load_chain(src_fio, chain, checkpoint, warm=False))
    return materialize


def savepoint_by_copy(runner, target: str | None, parallelism: int | None) -> str | None:
    """The savepoint's location, or None when copying cannot work (nothing written then; see the module doc)."""
    ctx = runner.ctx
    latest, problems = ctx.coordinator.restore_latest(verify=True, checksums=False)
    blocker = ("there is no completed checkpoint" if latest is None
               else copy_blocker(latest.metadata, parallelism))
    if latest is None or blocker is not None:
        if latest is not None:
            ctx.echo(f"savepoint: {blocker}: the state is re-snapshotted by an aligned round")
        return None
    for p in problems:
        ctx.echo(f"WARNING: {p}")
    md = latest.metadata
    ctx.recover_sinks(md)          # as every restore of the latest checkpoint does (idempotent)
    ctx.sweep_dead_letters(md)
    n = sum(1 for h in md.state_handles() if h.file is not None)
    progress.step(f"copying the {n} state snapshot(s) of checkpoint {md.checkpoint_id}", total=n, unit="snapshots")
    try:
        completed, fig = copy_savepoint(ctx.coordinator, latest, src_fio=ctx.ckpt_fio, location=target,
                                        sink_tables=runner.job.sink_tables(),
                                        sinks={s.table: False for s in runner.job.sinks()},
                                        backlog={s: 0 for s in (md.stats.backlog if md.stats else {})},
                                        extra=savepoint_extra(md),
                                        materialize=_materializer(ctx.ckpt_fio, ctx.coordinator.fileio, md.name),
                                        sink_counting=ctx.sink_requests_counting(),
                                        on_copied=progress.advance)
        progress.step("committing the savepoint's sink transactions")
        ctx.recover_sinks(completed.metadata, restoring=False)
    except BaseException as e:
        abort_pending(ctx.coordinator, e)
        raise
    runner.finalizer.last_location = completed.location
    ctx.echo(f"savepoint {completed.checkpoint_id} of checkpoint {md.checkpoint_id} written to {completed.location} "
             f"({fig.files} state file(s), {fig.bytes} bytes written in {fig.seconds:.1f} s)")
    return completed.location
