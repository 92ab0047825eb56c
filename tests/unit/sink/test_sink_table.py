"""CommittedTable: idempotent commits, lineage (rewind, racing runners, upsert), readers, garbage."""
from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.ack import AckResult
from pipeline.checkpoint.handles import FileHandle
from pipeline.exceptions import SinkError
from pipeline.fileio import LocalFileIO, sha256_of
from pipeline.sink.table import CommitEntry, CommittedTable

pytestmark = pytest.mark.unit


def stage(table: CommittedTable, cid: int, rows: dict, subtask: int = 0) -> FileHandle:
    uri = table.part_uri(cid, subtask)
    with table.fileio.open_output(uri) as out:
        pq.write_table(pa.table(rows), out)
    data = table.fileio.read_bytes(uri)
    return FileHandle(uri, len(next(iter(rows.values()))), len(data), sha256_of(data))


def entry(table, cid, parent, files=(), **kw):
    return CommitEntry(table=table.table, checkpoint_id=cid, parent_id=parent, files=tuple(files), **kw)


@pytest.fixture
def table(local_root):
    return CommittedTable(LocalFileIO(), local_root, "job", "paid_orders")


def ids(entries):
    return [e.checkpoint_id for e in entries]


def test_layout(table, local_root):
    assert table.table_uri == f"{local_root}/job/paid_orders"
    assert table.staging_uri(7) == f"{local_root}/job/paid_orders/data/txn-7"
    assert table.part_uri(7, 3).endswith("/data/txn-7/part-00003.parquet")
    assert table.commit_uri(7).endswith("/_commits/000000000007.json")


def test_commit_is_idempotent_and_conflicts_are_errors(table):
    e = entry(table, 1, None, [stage(table, 1, {"id": ["a"]})])
    assert table.commit(e) is AckResult.SUCCESS
    assert table.commit(e) is AckResult.DUPLICATE
    with pytest.raises(SinkError, match="checkpoint 1 is already committed with different content"):
        table.commit(entry(table, 1, None, []))
    assert table.entry(1) == e
    with pytest.raises(SinkError, match="given to table"):
        table.commit(CommitEntry(table="other", checkpoint_id=2, parent_id=1))


def test_lineage_linear_and_rewind_branch(table):
    for cid, parent in [(1, None), (2, 1), (3, 2), (4, 3), (5, 4)]:
        table.commit(entry(table, cid, parent))
    assert ids(table.lineage()) == [1, 2, 3, 4, 5]
    # backfill: re-run from checkpoint 2 -> new branch 6, 7 replaces 3..5
    table.commit(entry(table, 6, 2))
    table.commit(entry(table, 7, 6))
    assert table.head().checkpoint_id == 7
    assert ids(table.lineage()) == [1, 2, 6, 7]


def test_racing_runners_from_the_same_parent(table):
    table.commit(entry(table, 1, None))
    table.commit(entry(table, 2, 1))  # loser (fenced later) managed to commit its output
    table.commit(entry(table, 3, 1))  # winner, also from parent 1
    assert ids(table.lineage()) == [1, 3]
    assert ids(table.entries()) == [1, 2, 3]


def test_upsert_stops_at_first_full_entry(table):
    kw = {"mode": "upsert", "key": ("merchant_id",)}
    table.commit(entry(table, 1, None, full=True, **kw))
    table.commit(entry(table, 2, 1, **kw))
    table.commit(entry(table, 3, 2, full=True, **kw))
    table.commit(entry(table, 4, 3, **kw))
    assert ids(table.lineage()) == [3, 4]


def test_broken_lineage_is_an_error_not_silent_loss(table):
    table.commit(entry(table, 1, None))
    table.commit(entry(table, 3, 2))
    with pytest.raises(SinkError, match="broken lineage - commit 3 has parent checkpoint 2"):
        table.lineage()


def test_concurrent_commits_of_one_id(local_root):
    table = CommittedTable(LocalFileIO(), local_root, "job", "t")
    n = 6
    barrier = threading.Barrier(n, timeout=60)
    results = []

    def go(i):
        barrier.wait()
        e = entry(table, 5, 4 if i % 2 else 3)
        try:
            results.append(table.commit(e))
        except SinkError:
            results.append("conflict")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert results.count(AckResult.SUCCESS) == 1
    assert results.count(AckResult.DUPLICATE) == 2 and results.count("conflict") == 3


def test_read_append_follows_lineage(table):
    f1 = stage(table, 1, {"id": ["a", "b"]})
    f2 = stage(table, 2, {"id": ["c"]})
    f3 = stage(table, 3, {"id": ["c-rewound", "d"]})
    table.commit(entry(table, 1, None, [f1]))
    table.commit(entry(table, 2, 1, [f2]))
    table.commit(entry(table, 3, 1, [f3]))
    assert table.committed_files() == [f1, f3]
    assert table.read().column("id").to_pylist() == ["a", "b", "c-rewound", "d"]


def test_read_upsert_newest_row_per_key(table):
    kw = {"mode": "upsert", "key": ("merchant_id",)}
    table.commit(entry(table, 1, None, [stage(table, 1, {"merchant_id": ["m1", "m2"], "revenue": [1.0, 2.0]})],
                       full=True, **kw))
    table.commit(entry(table, 2, 1, [stage(table, 2, {"merchant_id": ["m2", "m3"], "revenue": [5.0, 3.0]})], **kw))
    got = sorted(zip(*table.read().to_pydict().values()))
    assert got == [("m1", 1.0), ("m2", 5.0), ("m3", 3.0)]


def test_garbage_is_uncommitted_staging_only(table):
    committed = stage(table, 1, {"id": ["a"]})
    table.commit(entry(table, 1, None, [committed]))
    for cid in (2, 3, 4, 5):
        stage(table, cid, {"id": ["x"]})
    garbage = table.garbage(protect={3}, protect_from_id=5)
    assert [g.rsplit("/", 1)[-1] for g in garbage] == ["txn-2", "txn-4"]
    assert table.cleanup(protect={3}, protect_from_id=5) == 2
    assert table.fileio.list_dirs(table.data_uri) == ["txn-1", "txn-3", "txn-5"]
    assert table.read().num_rows == 1


def test_recent_garbage_looks_only_after_the_restored_checkpoint(table):
    for cid in (1, 2):
        table.commit(entry(table, cid, cid - 1 or None, [stage(table, cid, {"id": [f"r{cid}"]})]))
    for cid in (3, 5, 6):  # 3: an old abort the restore of 4 no longer looks at; 5: aborted; 6: newest claim
        stage(table, cid, {"id": ["x"]})
    table.commit(entry(table, 4, 2, [stage(table, 4, {"id": ["r4"]})]))
    # restored from 4, newest claim 6: only id 5 is looked at (6 may still be running)
    assert [g.rsplit("/", 1)[-1] for g in table.recent_garbage(4, protect_from_id=6)] == ["txn-5"]
    assert table.recent_garbage(4, protect={5}, protect_from_id=6) == []
    assert table.recent_garbage(6, protect_from_id=6) == []  # steady state: nothing to look at
    # restored from 2 (a rewind): 3 and 5 (4 is committed)
    assert [g.rsplit("/", 1)[-1] for g in table.recent_garbage(2, protect_from_id=6)] == ["txn-3", "txn-5"]
    assert table.cleanup(protect_from_id=6, after=4, full=False) == 1
    assert table.fileio.list_dirs(table.data_uri) == ["txn-1", "txn-2", "txn-3", "txn-4", "txn-6"]
    # nothing restored, or a window longer than RECENT_GARBAGE_MAX_IDS: the full sweep
    assert [g.rsplit("/", 1)[-1] for g in table.recent_garbage(None, protect_from_id=6)] == ["txn-3"]
    assert [g.rsplit("/", 1)[-1] for g in table.recent_garbage(4, protect_from_id=1000)] == ["txn-3", "txn-6"]


def test_committed_ids_and_head_list_from_an_id(table):
    for cid in (1, 2, 9, 10, 11):
        table.commit(entry(table, cid, None, []))
    assert table.committed_ids() == [1, 2, 9, 10, 11]
    assert table.committed_ids(after=9) == [10, 11]
    assert table.committed_ids(after=11) == []
    assert table.head().checkpoint_id == 11
    assert table.head(after=11) is None and table.head(after=2).checkpoint_id == 11
