"""TwoPhaseCommitSink with the coordinator: stage, pre-commit, commit on completion, recover, abort."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.ack import AckResult
from pipeline.checkpoint.coordinator import CheckpointCoordinator
from pipeline.checkpoint.handles import FileHandle
from pipeline.exceptions import SinkError, TransactionStateError
from pipeline.fileio import LocalFileIO, join_uri, sha256_of
from pipeline.sink.table import CommittedTable
from pipeline.sink.transaction import TransactionState
from pipeline.sink.two_phase import TwoPhaseCommitSink

pytestmark = pytest.mark.unit


def write_part(fio, uri, ids) -> FileHandle:
    with fio.open_output(uri) as out:
        pq.write_table(pa.table({"id": ids}), out)
    data = fio.read_bytes(uri)
    return FileHandle(uri, len(ids), len(data), sha256_of(data))


@pytest.fixture
def setup(local_root):
    fio = LocalFileIO()
    sink = TwoPhaseCommitSink(CommittedTable(fio, join_uri(local_root, "sink"), "job", "out"))
    coord = CheckpointCoordinator(fio, join_uri(local_root, "chk"), "job")
    return fio, sink, coord


def epoch(fio, sink, coord, parent, ids, commit=True):
    """One round: trigger, a task stages output + acks, complete, then (optionally) commit the sink."""
    p = coord.trigger(epoch=1, barrier_time="t", expected_tasks={"map": 1}, parent_id=parent, max_parallelism=1,
                      parallelism=1, sink_tables=["out"])
    txn = sink.begin_transaction(p.checkpoint_id, parent_id=parent)
    part = write_part(fio, sink.table.part_uri(p.checkpoint_id, 0), ids)
    coord.acknowledge_task(p, "map", 0, sink_files={"out": [part]})
    sink.pre_commit(txn, [part], verify=True)
    completed = coord.complete(p)
    if commit:
        assert sink.notify_checkpoint_complete(completed.checkpoint_id) == {completed.checkpoint_id: AckResult.SUCCESS}
        assert txn.state is TransactionState.COMMITTED
    return completed, txn


def test_commit_makes_output_visible(setup):
    fio, sink, coord = setup
    c1, t1 = epoch(fio, sink, coord, None, ["a", "b"])
    c2, _ = epoch(fio, sink, coord, c1.checkpoint_id, ["c"])
    assert sink.table.read().column("id").to_pylist() == ["a", "b", "c"]
    with pytest.raises(TransactionStateError, match="out/txn-1.*COMMITTED"):
        sink.abort(t1)
    with pytest.raises(TransactionStateError, match="already begun"):
        sink.begin_transaction(1)


def test_uncommitted_output_is_invisible_and_aborted_output_deleted(setup):
    fio, sink, _coord = setup
    txn = sink.begin_transaction(1)
    part = write_part(fio, sink.table.part_uri(1, 0), ["x"])
    sink.pre_commit(txn, [part])
    assert sink.table.read().num_rows == 0
    assert sink.abort(txn) == 1
    assert txn.state is TransactionState.ABORTED and not fio.exists(part.uri)
    with pytest.raises(TransactionStateError, match="cannot commit in state ABORTED"):
        sink.commit(txn)


def test_crash_between_metadata_and_commit_is_recovered_once(setup):
    fio, sink, coord = setup
    c1, _ = epoch(fio, sink, coord, None, ["a"])
    c2, _ = epoch(fio, sink, coord, c1.checkpoint_id, ["b"], commit=False)  # crash before the sink commit
    assert sink.table.read().column("id").to_pylist() == ["a"]
    # restart: a new process restores the latest checkpoint and re-commits its sink section
    restored, problems = CheckpointCoordinator(fio, coord.job_root.rsplit("/", 1)[0], "job").restore_latest()
    assert restored.checkpoint_id == c2.checkpoint_id and problems == []
    fresh = TwoPhaseCommitSink(CommittedTable(fio, sink.table.table_uri.rsplit("/", 2)[0], "job", "out"))
    assert fresh.recover_and_commit(restored.metadata) is AckResult.SUCCESS
    assert fresh.recover_and_commit(restored.metadata) is AckResult.DUPLICATE
    assert fresh.recover_and_commit(c1.metadata) is AckResult.DUPLICATE
    assert fresh.table.read().column("id").to_pylist() == ["a", "b"]


def test_recover_refuses_missing_staged_files(setup):
    fio, sink, coord = setup
    c1, _ = epoch(fio, sink, coord, None, ["a"], commit=False)
    victim = c1.metadata.sinks["out"].files[0].uri
    fio.delete(victim)
    with pytest.raises(SinkError, match=f"recovering checkpoint 1 of job 'job'.*{victim}.*missing"):
        sink.recover_and_commit(c1.metadata)
    assert sink.table.entry(1) is None


def test_recover_ignores_tables_not_in_the_checkpoint(setup):
    fio, sink, coord = setup
    c1, _ = epoch(fio, sink, coord, None, ["a"])
    other = TwoPhaseCommitSink(CommittedTable(fio, "file:///unused", "job", "not_in_metadata"))
    assert other.recover_and_commit(c1.metadata) is None


def test_notify_commits_all_older_pre_committed_in_order(setup):
    fio, sink, _coord = setup
    t1 = sink.begin_transaction(1, parent_id=None)
    sink.pre_commit(t1, [write_part(fio, sink.table.part_uri(1, 0), ["a"])])
    t2 = sink.begin_transaction(2, parent_id=1)
    sink.pre_commit(t2, [write_part(fio, sink.table.part_uri(2, 0), ["b"])])
    t3 = sink.begin_transaction(3, parent_id=2)  # still open: not committed
    assert sink.notify_checkpoint_complete(2) == {1: AckResult.SUCCESS, 2: AckResult.SUCCESS}
    assert t3.state is TransactionState.OPEN
    assert sink.table.read().column("id").to_pylist() == ["a", "b"]


def test_cleanup_spares_open_transactions(setup):
    fio, sink, coord = setup
    epoch(fio, sink, coord, None, ["a"])
    dead = sink.begin_transaction(7)
    write_part(fio, sink.table.part_uri(7, 0), ["x"])
    sink.abort(dead)
    write_part(fio, sink.table.part_uri(8, 0), ["crashed run"])
    running = sink.begin_transaction(9)
    write_part(fio, sink.table.part_uri(9, 0), ["in progress"])
    assert sink.cleanup() == 1
    assert fio.list_dirs(sink.table.data_uri) == ["txn-1", "txn-9"]
    assert running.state is TransactionState.OPEN


def test_upsert_sink_needs_a_key(local_root):
    with pytest.raises(ValueError, match="needs a key"):
        TwoPhaseCommitSink(CommittedTable(LocalFileIO(), local_root, "job", "rev"), mode="upsert")


@pytest.mark.parametrize("restore", [False, True], ids=["commit", "restore"])
def test_files_of_attempts_spark_did_not_keep_are_removed_on_commit(setup, restore):
    """Issue 34, item 5: a losing speculative attempt (or a failed attempt before its retry) wrote
    ``part-00000.t<its id>.parquet`` beside the kept attempt's file in ``txn-<n>/``. No handle references it; it
    used to stay in the committed directory for good. The commit (and the re-commit of a restore) removes it, and
    nothing else: not the kept files, not a file without an attempt id, not another subtask's file."""
    fio, sink, coord = setup
    p = coord.trigger(epoch=1, barrier_time="t", expected_tasks={"map": 2}, parent_id=None, max_parallelism=2,
                      parallelism=2, sink_tables=["out"])
    n = p.checkpoint_id
    txn = sink.begin_transaction(n)
    d = sink.table.staging_uri(n)
    loser = write_part(fio, f"{d}/part-00000.t7.parquet", ["a", "b"])     # the straggler, same bytes
    kept = [write_part(fio, f"{d}/part-00000.t12.parquet", ["a", "b"]),  # the speculative copy Spark kept
            write_part(fio, f"{d}/part-00001.t8.parquet", ["c"])]
    failed = write_part(fio, f"{d}/part-00001.t3.parquet", ["c"])        # a failed first attempt of subtask 1
    other = write_part(fio, f"{d}/part-00002.parquet", ["z"])             # no attempt id: not an attempt's file
    for i, f in enumerate(kept):
        coord.acknowledge_task(p, "map", i, sink_files={"out": [f]})
    sink.pre_commit(txn, kept, verify=True)
    completed = coord.complete(p)
    if restore:  # killed before the sink commit: the restore commits it
        fresh = TwoPhaseCommitSink(CommittedTable(fio, sink.table.table_uri.rsplit("/", 2)[0], "job", "out"))
        assert fresh.recover_and_commit(completed.metadata) is AckResult.SUCCESS
    else:
        assert sink.notify_checkpoint_complete(n) == {n: AckResult.SUCCESS}
    left = sorted(f.uri for f in fio.list(d))
    assert left == sorted([*(f.uri for f in kept), other.uri]), left
    assert not fio.exists(loser.uri) and not fio.exists(failed.uri)
    assert sorted(sink.table.read().column("id").to_pylist()) == ["a", "b", "c"]
