"""The storage contracts Epochal relies on, run over every FileIO (local, S3 on moto, in-memory).

What matters on S3 is its conditional PUT (``If-None-Match: *``): ``_metadata`` is written once, a
checkpoint id is claimed once (fencing), barrier n is logged once (the first writer wins, the others read
theirs), and a sink commit entry is written once. Each contract is checked here on all three backends.
"""
from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.ack import AckResult
from pipeline.checkpoint.completed import CompletedCheckpoint
from pipeline.checkpoint.coordinator import CheckpointCoordinator
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.ids import CheckpointIdCounter
from pipeline.checkpoint.report import TaskReport
from pipeline.checkpoint.store import CheckpointDirStatus, CompletedCheckpointStore
from pipeline.exceptions import CheckpointFencedError, ConditionalWriteError, SinkError
from pipeline.fileio import join_uri, sha256_of
from pipeline.layout import JobLayout, metadata_uri
from pipeline.sink.table import CommitEntry, CommittedTable

pytestmark = pytest.mark.unit


def _coordinator(fio, root, name="runner-A"):
    c = CheckpointCoordinator(fio, root, "job", runner_id=name, checkpoint_timeout_s=300)
    c.restore_latest()
    return c


def _trigger_and_ack(fio, coord, parent_id=None):
    p = coord.trigger(epoch=1, barrier_time="2024-01-01T00:00:00Z", expected_tasks={"agg": 1},
                      parent_id=parent_id, max_parallelism=4, parallelism=1)
    uri = join_uri(p.location, "rounds", "0", "state", "agg", "kg-0.parquet")
    data = f"state of {p.checkpoint_id}".encode()
    fio.write_bytes(uri, data)
    coord.receive_acknowledge_reports(p, [TaskReport.of_state(StateHandle(
        "agg", 0, 0, 3, "agg", FileHandle(uri, 1, len(data), sha256_of(data))))])
    return p


def _complete_one(fio, coord, parent_id=None) -> CompletedCheckpoint:
    return coord.complete(_trigger_and_ack(fio, coord, parent_id))


def test_checkpoint_store_lists_what_was_completed_and_metadata_is_write_once(any_root):
    fio, root = any_root
    coord = _coordinator(fio, root)
    first = _complete_one(fio, coord)
    second = _complete_one(fio, coord, parent_id=first.checkpoint_id)
    store = CompletedCheckpointStore(fio, JobLayout.of(root, "job").root)
    assert store.ids() == [1, 2]
    assert store.latest().checkpoint_id == 2 and store.get(1).metadata == first.metadata
    assert [i.status for i in store.inspect()] == [CheckpointDirStatus.COMPLETED] * 2
    with pytest.raises(ConditionalWriteError):  # the commit point is never overwritten
        fio.write_bytes(metadata_uri(second.location), b"{}", if_none_match=True)
    assert CompletedCheckpoint.load(fio, second.location).metadata == second.metadata


def test_id_counter_never_hands_out_an_id_twice_under_races(any_root):
    fio, root = any_root
    job_root = JobLayout.of(root, "job").root
    got: list[int] = []
    lock = threading.Lock()

    def claim(i: int) -> None:
        cid = CheckpointIdCounter(fio, job_root, runner_id=f"r{i}").next()
        with lock:
            got.append(cid)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 6 and min(got) >= 1  # every claim got its own id (gaps are allowed, reuse is not)
    assert CheckpointIdCounter(fio, job_root).latest_claimed() == max(got)
    assert CheckpointIdCounter(fio, job_root).next() > max(got)  # ids keep increasing after the race


def test_fencing_the_older_claim_cannot_commit(any_root):
    fio, root = any_root
    a, b = _coordinator(fio, root, "runner-A"), _coordinator(fio, root, "runner-B")
    pa_ = _trigger_and_ack(fio, a)
    _complete_one(fio, b)  # B claims and completes a newer id
    with pytest.raises(CheckpointFencedError):
        a.complete(pa_)
    assert not fio.exists(metadata_uri(pa_.location))


def test_barrier_log_first_writer_wins(any_root):
    fio, root = any_root
    uri = JobLayout.of(root, "job").barrier(3)
    results: list[str] = []

    def log(doc: bytes) -> None:
        try:
            fio.write_bytes(uri, doc, if_none_match=True)
            results.append("won")
        except ConditionalWriteError:
            results.append("lost")

    threads = [threading.Thread(target=log, args=(f'{{"writer": {i}}}'.encode(),)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["lost"] * 4 + ["won"]
    winner = fio.read_bytes(uri)
    assert winner.startswith(b'{"writer": ')
    assert fio.read_bytes(uri) == winner  # every later reader sees the same barrier


def test_sink_commit_log_is_idempotent_and_refuses_conflicts(any_root):
    fio, root = any_root
    table = CommittedTable(fio, root, "job", "out")
    uri = table.part_uri(1, 0)
    with fio.open_output(uri) as out:
        pq.write_table(pa.table({"id": ["a", "b"]}), out)
    data = fio.read_bytes(uri)
    e = CommitEntry(table="out", checkpoint_id=1, parent_id=None,
                    files=(FileHandle(uri, 2, len(data), sha256_of(data)),))
    assert table.commit(e) is AckResult.SUCCESS
    assert table.commit(e) is AckResult.DUPLICATE
    with pytest.raises(SinkError, match="already committed with different content"):
        table.commit(CommitEntry(table="out", checkpoint_id=1, parent_id=None))
    assert table.entry(1) == e
