"""A savepoint by copying: the latest completed checkpoint's state files copied on the driver, no Spark round.

Checkpoint n already holds the state after epoch n, written by the tasks that own its key groups. A savepoint of
it needs that same state, self-contained: every file under the savepoint's own directory, none shared with a
checkpoint (retention and the incremental chains of later checkpoints must never touch it). So the savepoint is
written like every checkpoint, through the :class:`~pipeline.checkpoint.coordinator.CheckpointCoordinator`
(write-ahead ``_pending.json``, fencing, ``_metadata`` last with a conditional PUT, an abort deletes only what it
wrote), but its acknowledgements are copies instead of a Spark round:

1. trigger savepoint ``m`` (a new checkpoint id) with checkpoint n as its parent, n's epoch, barrier time and
   restore positions (its barriers are its positions: the savepoint reads nothing);
2. write every state snapshot of n into ``<savepoint>/state/<uid>/<name>/``, in parallel on the driver. A
   snapshot that is one file is copied byte for byte; the copy checks the bytes it read against the SHA-256
   recorded in n's ``_metadata`` (a corrupt checkpoint is never copied into a savepoint). An incremental chain (a
   base and deltas, in the job's ``shared/`` area) is materialised into one base file (``materialize``: read,
   checksums verified, deltas applied, written in canonical order), because a savepoint is canonical: bases only,
   as the round wrote them. Every request goes through the storage layer's retries (:mod:`pipeline.storage_retry`);
3. acknowledge every subtask with its copied handles, write ``_metadata`` (format 1, kind ``savepoint``: exactly
   what restore reads from a savepoint written by a round) and commit the sinks' empty transaction of ``m``, as
   the round would have (sink lineage unbroken).

The copy costs one GET and one PUT per snapshot file (plus one GET per delta of a chain) and no JVM. It needs
an **aligned** checkpoint at the requested parallelism: a checkpoint with channel state (unaligned in-flight data)
or a savepoint asked for at another parallelism is written by the old path, an idle aligned round
(:func:`copy_blocker` says why; docs/how-to/savepoint-upgrade.md "What it costs").
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from pipeline.barriers.events import CheckpointType
from pipeline.checkpoint.completed import CompletedCheckpoint
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.exceptions import CorruptCheckpointError
from pipeline.fileio import FileIO, join_uri, sha256_of
from pipeline.fileio.request_counter import RequestCounting, StorageRequests

__all__ = ["copy_blocker", "copy_savepoint", "CopyFigures", "COPY_WORKERS"]

#: parallel copies (threads; each one GET + one PUT at a time)
COPY_WORKERS = 8


@dataclass(frozen=True)
class CopyFigures:
    """What the copy did: files and bytes copied, seconds spent copying."""

    files: int
    bytes: int
    seconds: float


def copy_blocker(md: CheckpointMetadata, parallelism: int | None) -> str | None:
    """Why checkpoint ``md`` cannot be copied into a savepoint (None: it can)."""
    if md.channel_state:
        return (f"checkpoint {md.checkpoint_id} holds channel state ({len(md.channel_state)} in-flight channel(s) "
                "of an unaligned checkpoint); a savepoint is aligned")
    if parallelism is not None and parallelism != md.parallelism:
        return (f"the savepoint is asked for at parallelism {parallelism}, checkpoint {md.checkpoint_id} has "
                f"{md.parallelism}")
    return None


def _target_uri(location: str, h: StateHandle) -> str:
    return join_uri(location, "state", h.operator_uid, h.name,
                    f"{h.subtask:05d}-kg-{h.kg_start:05d}-{h.kg_end:05d}.parquet")


def _copy_one(src_fio: FileIO, dst_fio: FileIO, f: FileHandle, dst: str, where: str) -> FileHandle:
    data = src_fio.read_bytes(f.uri)          # S3: retried by the storage layer
    if len(data) != f.bytes or sha256_of(data) != f.sha256:
        raise CorruptCheckpointError(f"{where}: state file {f.uri} has {len(data)} bytes / sha256 "
                                     f"{sha256_of(data)[:16]}..., its _metadata records {f.bytes} / "
                                     f"{f.sha256[:16]}...; not copied into a savepoint")
    dst_fio.write_bytes(dst, data)
    return FileHandle(uri=dst, rows=f.rows, bytes=f.bytes, sha256=f.sha256)


#: writes the whole state an incremental chain represents (base + deltas applied) as one base file at ``uri``
Materialize = Callable[[StateHandle, str], FileHandle]


def copy_savepoint(coordinator, source: CompletedCheckpoint, *, src_fio: FileIO, location: str | None,
                   sink_tables: Sequence[str], sinks: Mapping[str, bool], backlog: Mapping[str, int] | None = None,
                   extra: Mapping[str, Any] | None = None, sink_counting: Mapping[str, str] | None = None,
                   materialize: Materialize | None = None, workers: int = COPY_WORKERS,
                   on_copied: Callable[[int], None] | None = None) -> tuple[CompletedCheckpoint, CopyFigures]:
    """Savepoint of ``source`` by copying its state (see the module docstring). ``sinks``: per sink table, whether
    its savepoint transaction is a full image (always False: nothing is staged). ``materialize``: how an incremental
    chain becomes one base file (a savepoint is canonical: bases only); required when ``source`` has chains.
    Raises what the coordinator raises (the caller aborts the pending savepoint: only its own files are deleted).
    ``on_copied``: called with 1 after each state snapshot written (progress).

    Over 8 parameters: the source checkpoint, the target and the sections of `_metadata` the copy keeps; all
    keywords."""
    md = source.metadata
    blocker = copy_blocker(md, None)
    if blocker is not None:
        raise ValueError(blocker)
    if materialize is None and any(h.deltas for h in md.state_handles()):
        raise ValueError(f"checkpoint {md.checkpoint_id} has incremental state chains: pass materialize")
    pending = coordinator.trigger(
        epoch=md.epoch, barrier_time=md.barrier_time,
        expected_tasks={uid: md.parallelism for uid in md.operators}, parent_id=md.checkpoint_id,
        max_parallelism=md.max_parallelism, parallelism=md.parallelism, checkpoint_mode=md.checkpoint_mode,
        alignment="aligned", positions=md.positions, barriers=md.positions, sink_tables=list(sink_tables),
        kind=CheckpointType.SAVEPOINT, location=location,
        plan={"copied_from": {"checkpoint_id": md.checkpoint_id, "location": source.location}})
    loc = pending.location
    dst_fio = coordinator.fileio
    t0 = time.perf_counter()
    handles = [h for h in md.state_handles() if h.file is not None]
    where = f"savepoint {pending.checkpoint_id} of {source.describe()}"

    def write(h: StateHandle) -> FileHandle:
        assert h.file is not None
        dst = _target_uri(loc, h)
        if h.deltas:
            assert materialize is not None
            fh = materialize(h, dst)
        else:
            fh = _copy_one(src_fio, dst_fio, h.file, dst, where)
        if on_copied is not None:
            on_copied(1)
        return fh

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(handles) or 1))) as pool:
        written = dict(zip((id(h) for h in handles), pool.map(write, handles)))
    for uid in sorted(md.operators):
        for sub in range(md.parallelism):
            hs = []
            for h in md.operators[uid]:
                if h.subtask != sub:
                    continue
                fh = written.get(id(h))
                hs.append(replace(h, file=fh, deltas=(), persisted_bytes=None,
                                  state_rows=None if fh is None or fh.rows == h.rows else h.rows))
            coordinator.acknowledge_task(pending, uid, sub, hs)
    seconds = time.perf_counter() - t0
    completed = coordinator.complete(pending, positions=md.positions, channel_state=[], sinks_full=dict(sinks),
                                     backlog=dict(backlog or {}), dead_letters={}, rounds=1, extra=dict(extra or {}),
                                     # no executor ran: none of its requests
                                     executor_s3_requests=StorageRequests(), executor_s3_requests_counting=RequestCounting.EXACT,
                                     sink_s3_requests_counting=dict(sink_counting or {}))
    return completed, CopyFigures(len(written), sum(f.bytes for f in written.values()), seconds)
