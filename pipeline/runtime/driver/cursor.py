"""The cursor: where a job stands between rounds (Flink: the restored source offsets and state handles).

A cursor is built from a completed checkpoint's ``_metadata`` (:func:`cursor_from_metadata`) when a job
restores, and carried in memory from round to round while it runs. It holds, per source partition, the
position reading resumes at; per operator, the state handles its tasks restore; the unaligned channel state
still to replay first; and the alignment driver continuing from it.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipeline.checkpoint.handles import ChannelStateHandle, FileHandle, Position, StateHandle
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.runtime.driver.restore_guard import check_restore_point

if TYPE_CHECKING:
    from pipeline.runtime.driver.context import RuntimeContext
    from pipeline.runtime.driver.results import RunReport

__all__ = ["Cursor", "cursor_from_metadata", "handles_by_name", "files_by_channel", "restore_cursor"]


@dataclass
class Cursor:
    """Where the job stands between rounds (restored from a checkpoint or carried in memory)."""

    checkpoint_id: int | None = None
    epoch: int | None = None
    positions: dict[str, dict[str, Position]] = field(default_factory=dict)  # source -> partition -> position
    handles: dict[str, dict[str, list[StateHandle]]] = field(default_factory=dict)  # uid -> state name -> handles
    # unaligned channel state still to replay first (in-flight data between operators): uid -> channel files
    inflight: dict[str, list[ChannelStateHandle]] = field(default_factory=dict)
    align: object | None = None  # the AlignmentDriver continuing from this cursor (None: start a fresh one)
    inventory: dict = field(default_factory=dict)  # read inventory of the checkpoint (pipeline.source.contract)
    materialize: bool = False  # the next checkpoint writes every state whole (a restore: NO_CLAIM, docs/state.md)
    # the low watermark L of the inputs at the snapshot (pipeline.runtime.driver.input_epochs); None: not recorded
    low_epoch: int | None = None
    # the lowest own epoch of the in-flight channel state to replay (None: none, or not recorded: low_epoch)
    inflight_low_epoch: int | None = None
    # bytes per row per source recorded by the checkpoint (pipeline.runtime.spark.round_bytes); {}: none yet
    bytes_per_row: dict[str, float] = field(default_factory=dict)


def handles_by_name(handles: Iterable[StateHandle]) -> dict[str, list[StateHandle]]:
    """State handles grouped by state name (each operator task reads its states by name)."""
    out: dict[str, list[StateHandle]] = {}
    for h in handles:
        out.setdefault(h.name, []).append(h)
    return out


def files_by_channel(channels: Iterable[ChannelStateHandle]) -> dict[str, list[FileHandle]]:
    """The files of in-flight channel state grouped by channel (the join replays ``left`` / ``right``)."""
    out: dict[str, list[FileHandle]] = {}
    for c in channels:
        if c.file is not None:
            out.setdefault(c.channel, []).append(c.file)
    return out


def cursor_from_metadata(md: CheckpointMetadata) -> Cursor:
    """The cursor a completed checkpoint restores to: its typed state handles as they are in ``_metadata``."""
    handles = {uid: handles_by_name(hs) for uid, hs in md.operators.items()}
    positions = {s: dict(parts) for s, parts in md.positions.items()}
    inflight: dict[str, list[ChannelStateHandle]] = {}
    for c in md.channel_state:
        if c.file is not None:  # in-flight data between operators: replayed first
            inflight.setdefault(c.operator_uid, []).append(c)
        elif (ch := c.source_channel) is not None and c.start is not None:
            # in-flight data still in the source log: reading resumes at the start of its range
            positions.setdefault(ch.source, {})[ch.key] = c.start
    rec = md.recovery
    low_in = rec.inflight_low_epoch if rec.inflight_low_epoch is not None else (rec.low_epoch if inflight else None)
    return Cursor(md.checkpoint_id, md.epoch, positions, handles, inflight, inventory=dict(rec.source_files),
                  low_epoch=rec.low_epoch, inflight_low_epoch=low_in, bytes_per_row=dict(rec.bytes_per_row))


def restore_cursor(ctx: RuntimeContext, report: RunReport | None = None) -> Cursor:
    """Latest valid completed checkpoint (with fallback), sink transactions re-committed."""
    completed, problems = ctx.coordinator.restore_latest(verify=True)
    for p in problems:
        ctx.echo(f"WARNING: {p}")
        if report is not None:
            report.messages.append(p)
    note = check_restore_point(ctx, completed.checkpoint_id if completed is not None else None)
    if note is not None and not problems:
        ctx.echo(f"WARNING: {note}")
        if report is not None:
            report.messages.append(note)
    # everything above only reads; a Spark session opened in the background (RuntimeContext.start_spark) must be
    # usable before the first write (the sink re-commit), so an unusable master is refused before it
    ctx.await_spark()
    if completed is None:
        return Cursor()
    ctx.recover_sinks(completed.metadata)
    ctx.sweep_dead_letters(completed.metadata)  # finishes a sweep a kill interrupted (runtime.operators.dead_letters)
    return cursor_from_metadata(completed.metadata)
