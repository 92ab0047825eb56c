"""The row-level duplicate-commit check (:mod:`pipeline.quality.committed_rows`) without Spark: the same rows of an
epoch committed again in other files (another parallelism: other bytes) are found, with example rows; different
rows, commits of other epochs and commits of unknown epochs are not duplicates; nothing is read on a lineage
where every epoch is committed once."""
from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.parquet as pq


def _file(tmp_path, name: str, t: pa.Table):
    from pipeline.checkpoint.handles import FileHandle
    p = tmp_path / name
    pq.write_table(t, p)
    data = p.read_bytes()
    return FileHandle(uri=p.as_uri(), rows=t.num_rows, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def _entry(cid: int, parent, files, mode="upsert"):
    from pipeline.sink.table import CommitEntry
    return CommitEntry(table="t", checkpoint_id=cid, parent_id=parent, files=tuple(files), mode=mode,
                       key=("g",) if mode == "upsert" else ())


def _read(uri: str) -> pa.Table:
    from pipeline.fileio import LocalFileIO
    return pq.read_table(LocalFileIO.path_of(uri))


def test_the_same_rows_committed_again_in_other_files_are_found_with_examples(tmp_path):
    from pipeline.quality.committed_rows import committed_rows
    rows = pa.table({"g": ["a", "b", "c", "d"], "n": [1, 2, 3, 4], "v": [1.5, None, 2.25, 3.0]})
    e1 = _entry(1, None, [_file(tmp_path, "e1-0.parquet", rows.slice(0, 2)), _file(tmp_path, "e1-1.parquet", rows.slice(2))])
    e2 = _entry(2, 1, [_file(tmp_path, "e2-0.parquet", pa.table({"g": ["e"], "n": [5], "v": [0.5]}))])
    # the restore point (checkpoint 3, epoch 1 again) re-emits three of epoch 1's rows at another parallelism
    e3 = _entry(3, 2, [_file(tmp_path, f"e3-{i}.parquet", rows.slice(i, 1)) for i in range(3)])
    e4 = _entry(4, 3, [_file(tmp_path, "e4-0.parquet", pa.table({"g": ["a"], "n": [9], "v": [1.5]}))])
    res = committed_rows({"t": [e1, e2, e3, e4]}, {1: 1, 2: 2, 3: 1, 4: 4}, _read)
    by = {r["commit_id"]: r for r in res.records}
    assert by[3]["duplicate_rows"] == 3 and by[3]["earlier_commits"] == "1"
    assert by[1]["duplicate_rows"] == 0 and by[2]["duplicate_rows"] == 0 and by[4]["duplicate_rows"] == 0
    assert {(x["g"], x["n"], x["v"], x["commit_id"], x["also_in_commit"]) for x in res.examples} == {
        ("a", 1, 1.5, 3, 1), ("b", 2, None, 3, 1), ("c", 3, 2.25, 3, 1)}
    assert res.files_read == 5          # only the two commits of epoch 1


def test_other_rows_unknown_epochs_and_single_commits_are_no_duplicates(tmp_path):
    from pipeline.quality.committed_rows import committed_rows
    a = _entry(1, None, [_file(tmp_path, "a.parquet", pa.table({"g": ["a"], "n": [1]}))], mode="append")
    b = _entry(2, 1, [_file(tmp_path, "b.parquet", pa.table({"g": ["a"], "n": [2]}))], mode="append")   # epoch 1 again
    c = _entry(3, 2, [_file(tmp_path, "c.parquet", pa.table({"g": ["a"], "n": [1]}))], mode="append")   # epoch unknown
    res = committed_rows({"t": [a, b, c]}, {1: 1, 2: 1}, _read)
    assert [r["duplicate_rows"] for r in res.records] == [0, 0]
    assert res.unknown_epoch == ["t@3"] and not res.examples
    res = committed_rows({"t": [a, c]}, {1: 1, 3: 2}, _read)
    assert res.files_read == 0 and [r["duplicate_rows"] for r in res.records] == [0, 0]
