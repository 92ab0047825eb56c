"""A savepoint by copying (issue 29, item 6): the latest checkpoint's state files copied on the driver, a savepoint
``_metadata`` restore reads like any savepoint's, canonical (an incremental chain is materialised into one base) and
self-contained (it survives the deletion of its checkpoint and its shared files), a corrupt state file never copied,
and a failure leaves nothing behind; on local files, moto S3 and in memory. The real materialisation of a chain
(the state backend's changelog) is exercised by tests/integration/test_incremental_state.py."""
from __future__ import annotations

import dataclasses

import pytest

from pipeline.checkpoint.completed import CompletedCheckpoint
from pipeline.checkpoint.coordinator import CheckpointCoordinator
from pipeline.checkpoint.handles import ChannelStateHandle, FileHandle, Position, StateHandle
from pipeline.checkpoint.savepoint_copy import copy_blocker, copy_savepoint
from pipeline.exceptions import CorruptCheckpointError
from pipeline.fileio import join_uri, sha256_of
from pipeline.runtime.driver.savepoints import abort_pending

pytestmark = pytest.mark.unit

POS = {"orders": {"0": Position(3, 7), "1": Position(2, 0)}}


def _file(fio, uri: str, data: bytes, rows: int) -> FileHandle:
    fio.write_bytes(uri, data)
    return FileHandle(uri=uri, rows=rows, bytes=len(data), sha256=sha256_of(data))


def _checkpoint(fio, root: str) -> tuple[CheckpointCoordinator, CompletedCheckpoint]:
    """Checkpoint 1 of job ``j``: operator ``agg`` at parallelism 2, subtask 1 with an incremental chain whose base
    lies in the job's shared area (written by an earlier checkpoint)."""
    coord = CheckpointCoordinator(fio, join_uri(root, "ckpt"), "j")
    p = coord.trigger(epoch=5, barrier_time="2026-01-01T00:06:00.000Z", expected_tasks={"agg": 2}, parent_id=None,
                      max_parallelism=8, parallelism=2, positions=POS, barriers=POS, sink_tables=["out"])
    base = join_uri(root, "ckpt", "j", "shared", "agg", "base-1.parquet")
    h0 = StateHandle("agg", 0, 0, 3, "agg", _file(fio, join_uri(p.location, "s0.parquet"), b"state of subtask 0", 4))
    h1 = StateHandle("agg", 1, 4, 7, "agg", _file(fio, base, b"base of subtask 1", 5),
                     deltas=(_file(fio, join_uri(p.location, "d1.parquet"), b"delta of subtask 1", 2),),
                     state_rows=6, persisted_bytes=18)
    coord.acknowledge_task(p, "agg", 0, [h0])
    coord.acknowledge_task(p, "agg", 1, [h1])
    cp = coord.complete(p, positions=POS, sinks_full={"out": False},
                        extra={"low_epoch": 5, "records": {"orders": 9}, "source_files": {"orders": {}}})
    return coord, cp


def test_copy_writes_a_self_contained_savepoint_restore_reads(any_root):
    fio, root = any_root
    coord, cp = _checkpoint(fio, root)
    target = join_uri(root, "ckpt", "j", "savepoints", "before-v2")
    copied: list[int] = []
    chains: list[str] = []

    def materialize(h: StateHandle, uri: str) -> FileHandle:   # stands in for the state backend's (changelog)
        chains.append(h.file.uri)
        data = b"".join(fio.read_bytes(f.uri) for f in h.files())
        return _file(fio, uri, data, h.rows)

    sp, fig = copy_savepoint(coord, cp, src_fio=fio, location=target, sink_tables=["out"], sinks={"out": False},
                             extra={"low_epoch": 5}, on_copied=copied.append, materialize=materialize)
    md = sp.metadata
    assert (md.kind, md.checkpoint_id, md.parent_id, md.epoch, md.parallelism) == ("savepoint", 2, 1, 5, 2)
    assert md.positions == cp.metadata.positions and md.barriers == cp.metadata.positions
    files = md.state_files()
    assert fig.files == 2 and len(copied) == 2 and fig.bytes == sum(f.bytes for f in files)
    assert len(chains) == 1 and "/shared/" in chains[0]           # only the chain was materialised
    assert files and all(f.uri.startswith(target + "/") for f in files)   # references nothing outside itself
    assert all(not h.deltas for h in md.state_handles())          # canonical: bases only
    first = cp.metadata.state_handles()[0].file
    assert (files[0].rows, files[0].bytes, files[0].sha256) == (first.rows, first.bytes, first.sha256)  # copied
    assert [h.rows for h in md.state_handles()] == [h.rows for h in cp.metadata.state_handles()]
    assert set(md.sinks) == {"out"} and not md.sinks["out"].files
    # what a restore reads: the _metadata (format 1), then every file with its size and checksum
    loaded = CompletedCheckpoint.load(fio, target)
    assert loaded.metadata.to_json() == md.to_json() and loaded.is_savepoint
    # the checkpoint and its shared files deleted: the savepoint still verifies
    fio.delete_prefix(cp.location)
    fio.delete_prefix(join_uri(root, "ckpt", "j", "shared"))
    loaded.verify(fio)
    assert not coord.pending_checkpoints


def test_a_corrupt_state_file_is_never_copied_and_the_savepoint_leaves_nothing(any_root):
    fio, root = any_root
    coord, cp = _checkpoint(fio, root)
    victim = cp.metadata.state_files()[0]
    fio.write_bytes(victim.uri, b"X" * victim.bytes)   # same size, other bytes
    target = join_uri(root, "ckpt", "j", "savepoints", "broken")
    with pytest.raises(CorruptCheckpointError, match="not copied into a savepoint") as ei:
        try:
            copy_savepoint(coord, cp, src_fio=fio, location=target, sink_tables=["out"], sinks={"out": False},
                           materialize=lambda h, uri: _file(fio, uri, b"materialised", h.rows))
        except BaseException as e:
            abort_pending(coord, e)
            raise
    assert victim.uri in str(ei.value)
    assert fio.list(target) == []


def test_copy_blocker_names_channel_state_and_another_parallelism(any_root):
    fio, root = any_root
    _coord, cp = _checkpoint(fio, root)
    assert copy_blocker(cp.metadata, None) is None and copy_blocker(cp.metadata, 2) is None
    assert "parallelism 3" in (copy_blocker(cp.metadata, 3) or "")
    unaligned = dataclasses.replace(cp.metadata, channel_state=(
        ChannelStateHandle("agg", 0, "orders/0", source="orders", partition=0, start=Position(1, 0)),))
    assert "channel state" in (copy_blocker(unaligned, None) or "")
    with pytest.raises(ValueError, match="incremental state chains"):   # a chain is never copied as a chain
        copy_savepoint(_coord, cp, src_fio=fio, location=None, sink_tables=["out"], sinks={"out": False})
