"""CompletedCheckpointStore's metadata cache: a ``_metadata`` is read once per store, the listing is not cached.

Other processes are played by a second store / coordinator on the same storage (local, S3 on moto, memory).
"""
from __future__ import annotations

import pytest

from pipeline.checkpoint.coordinator import CheckpointCoordinator
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import TaskReport
from pipeline.checkpoint.store import CheckpointDirStatus, CompletedCheckpointStore
from pipeline.exceptions import CheckpointFencedError, ObjectNotFoundError
from pipeline.fileio import S3FileIO, join_uri, sha256_of
from pipeline.fileio.request_counter import request_counts
from tests.unit.checkpoint.test_checkpoint_store import write_checkpoint

pytestmark = pytest.mark.unit


class CountingFileIO:
    """The FileIO under test, counting ``_metadata`` reads and directory listings."""

    def __init__(self, inner) -> None:
        self.inner, self.metadata_reads, self.listings = inner, 0, 0

    def read_bytes(self, uri: str, *a, **k):
        if uri.endswith("/_metadata"):
            self.metadata_reads += 1
        return self.inner.read_bytes(uri, *a, **k)

    def list_dirs(self, uri: str, *a, **k):
        self.listings += 1
        return self.inner.list_dirs(uri, *a, **k)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _stores(any_root, retain=3):
    fio, root = any_root
    job_root = join_uri(root, "job")
    counting = CountingFileIO(fio)
    return fio, job_root, counting, CompletedCheckpointStore(counting, job_root, retain=retain)


def test_each_metadata_is_read_once_and_storage_is_listed_every_time(any_root):
    fio, job_root, counting, store = _stores(any_root)
    for cid in (1, 2, 3):
        write_checkpoint(fio, job_root, cid)
    for _ in range(5):
        assert store.ids() == [1, 2, 3] and store.latest().checkpoint_id == 3
        assert [i.status for i in store.inspect()] == [CheckpointDirStatus.COMPLETED] * 3
    assert counting.metadata_reads == 3  # without the cache: 3 per call, 45
    assert counting.listings == 15  # every call lists checkpoints/ in storage
    assert store.get(2).checkpoint_id == 2 and counting.metadata_reads == 3
    uncached = CompletedCheckpointStore(counting, job_root, cache=False)
    uncached.ids(), uncached.ids()
    assert counting.metadata_reads == 3 + 6


def test_checkpoints_of_other_processes_are_seen_and_deleted_ones_are_not_served(any_root):
    fio, job_root, counting, store = _stores(any_root)
    other = CompletedCheckpointStore(fio, job_root, retain=1)  # another process, retaining one checkpoint
    for cid in (1, 2):
        write_checkpoint(fio, job_root, cid)
    assert store.ids() == [1, 2]
    cp3 = write_checkpoint(fio, job_root, 3)  # completed by the other process
    assert store.ids() == [1, 2, 3] and store.latest().checkpoint_id == 3
    assert other.add(cp3) == [1, 2]  # its retention deletes 1 and 2 (directories gone)
    assert store.ids() == [3]
    with pytest.raises(ObjectNotFoundError, match="no checkpoint 1 under"):
        store.get(1)
    # the other process deletes _metadata of 3 while a file of its directory stays (retention keeps files a
    # newer checkpoint references): the listing still shows the directory, but a restore never picks it
    fio.delete(cp3.metadata_uri)
    assert fio.list(cp3.location), "the directory must still be listed for this case"
    cp, problems = store.latest_valid()
    assert cp is None and problems == []  # read from storage: nothing to restore, not checkpoint 3
    with pytest.raises(ObjectNotFoundError, match="checkpoint 3 of job 'job' is not completed"):
        store.get(3, fresh=True)
    assert store.ids() == []  # the fresh read above dropped it from the cache


def test_restore_reads_metadata_from_storage_and_falls_back(any_root):
    fio, job_root, counting, store = _stores(any_root)
    for cid in (1, 2):
        write_checkpoint(fio, job_root, cid)
    assert store.ids() == [1, 2]
    fio.delete(join_uri(store.location_of(2), "_metadata"))
    fio.write_bytes(join_uri(store.location_of(2), "_metadata"), b"garbage")  # replaced behind the cache's back
    reads = counting.metadata_reads
    cp, problems = store.latest_valid()
    assert cp.checkpoint_id == 1 and len(problems) == 1 and "checkpoint 2" in problems[0]
    assert counting.metadata_reads == reads + 2  # newest first, from storage
    assert {i.checkpoint_id: i.status for i in store.inspect()}[2] is CheckpointDirStatus.CORRUPT


def test_own_retention_drops_discarded_checkpoints(any_root):
    fio, job_root, counting, store = _stores(any_root, retain=2)
    for cid in (1, 2, 3):
        write_checkpoint(fio, job_root, cid)
    assert store.ids() == [1, 2, 3]
    assert store.add(store.get(3)) == [1]
    assert store.ids() == [2, 3] and 1 not in store._cached


def _ack_and_complete(fio, coord, pending):
    uri = join_uri(pending.location, "rounds", "0", "agg-0.parquet")
    data = f"state by {coord.runner_id}".encode()
    fio.write_bytes(uri, data)
    coord.receive_acknowledge_reports(pending, [TaskReport.of_state(StateHandle(
        "agg", 0, 0, 3, "agg", FileHandle(uri, 1, len(data), sha256_of(data))))])
    return coord.complete(pending)


def test_fencing_with_a_warm_cache_still_sees_a_concurrent_completion(any_root):
    """Runner B's store has every checkpoint cached; A completes one while B runs: B is fenced."""
    fio, root = any_root
    a = CheckpointCoordinator(fio, root, "job", runner_id="runner-A", checkpoint_timeout_s=300)
    b = CheckpointCoordinator(fio, root, "job", runner_id="runner-B", checkpoint_timeout_s=300)

    def trigger(coord, parent_id=None):
        return coord.trigger(epoch=1, barrier_time="2024-01-01T00:00:00Z", expected_tasks={"agg": 1},
                             parent_id=parent_id, max_parallelism=4, parallelism=1)

    first = _ack_and_complete(fio, a, trigger(a))
    b.restore_latest(), a.restore_latest()
    pb = trigger(b, first.checkpoint_id)  # claims id 2
    for _ in range(3):
        assert b.store.ids() == [first.checkpoint_id]  # warm: nothing re-read
    # A completes a checkpoint B has not seen (written directly, as a runner that missed B's claim would)
    write_checkpoint(fio, a.job_root, 3)
    with pytest.raises(CheckpointFencedError, match="checkpoint 3 was completed by another runner"):
        _ack_and_complete(fio, b, pb)
    assert not fio.exists(join_uri(pb.location, "_metadata"))


def test_s3_requests_drop_with_the_cache(s3_root):
    fio = S3FileIO()
    job_root = join_uri(s3_root, "job")
    for cid in (1, 2, 3):
        write_checkpoint(fio, job_root, cid)

    def gets(cache: bool):
        store = CompletedCheckpointStore(fio, job_root, cache=cache)
        before = request_counts()
        for _ in range(7):  # about as often as one Airflow epoch lists checkpoints/
            store.ids()
        spent = request_counts() - before
        return spent.get, spent.list

    assert gets(cache=False) == (21, 7)
    assert gets(cache=True) == (3, 7)
