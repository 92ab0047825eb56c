"""Sinks that delete (pipeline.sink.deletes): a deleting upsert sink's staged tombstones delete their keys in
every format - Epochal's own commit log (read: newest row per key, tombstones dropped), Delta (MERGE ... WHEN
MATCHED DELETE) and Iceberg (delete + append) - exactly once when a commit is recovered again after a kill, a
deleted key can come back, and the null key is one key. Real deltalake / pyiceberg on file://, no Spark."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.ack import AckResult
from pipeline.checkpoint.handles import FileHandle
from pipeline.config import load_config
from pipeline.fileio import file_io_for
from pipeline.runtime.operators.sink_writer import from_changelog
from pipeline.sink.deletes import DELETED, live_rows, with_tombstones
from pipeline.sink.formats import open_sink_table
from pipeline.sink.table import CommitEntry
from pipeline.sink.table_format import TableFormat

pytestmark = [pytest.mark.unit, pytest.mark.table_formats]

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


def _stage(table, cid: int, live: dict, deleted: list) -> FileHandle:
    t = with_tombstones(pa.table(live, schema=SCHEMA), pa.table({"k": pa.array(deleted, pa.string())}), SCHEMA,
                        ["k"])
    uri = table.part_uri(cid, 0)
    buf = pa.BufferOutputStream()
    pq.write_table(t, buf)
    data = buf.getvalue().to_pybytes()
    table.fileio.write_bytes(uri, data)
    return FileHandle(uri=uri, rows=t.num_rows, bytes=len(data), sha256="")


def _open(tmp_path, fmt):
    root = (tmp_path / "sink").as_uri()
    cfg = load_config(env={}, sink_uri=root)
    t = open_sink_table(file_io_for(root), cfg, "job1", "out", mode="upsert", key=("k",), fmt=fmt)
    if fmt is not TableFormat.EPOCHAL:
        t.prepare(SCHEMA)
    return t


def _rows(table, fmt) -> list[tuple]:
    got = table.read() if fmt is TableFormat.EPOCHAL else table.open_read()
    assert DELETED not in got.column_names
    return sorted(((r["k"], r["v"]) for r in got.to_pylist()), key=lambda r: (r[0] is not None, r))


@pytest.mark.parametrize("fmt", [TableFormat.EPOCHAL, TableFormat.DELTA, TableFormat.ICEBERG])
def test_tombstones_delete_keys_exactly_once(tmp_path, fmt):
    t = _open(tmp_path, fmt)

    def entry(cid, parent, live, deleted):
        return CommitEntry(table="out", checkpoint_id=cid, parent_id=parent, files=(_stage(t, cid, live, deleted),),
                           mode="upsert", key=("k",))

    assert t.commit(entry(1, None, {"k": ["a", "b", "c", None], "v": [1, 2, 3, 4]}, [])) is AckResult.SUCCESS
    e2 = entry(2, 1, {"k": ["c"], "v": [30]}, ["b", None, "zz"])   # "zz": a key the table never had
    assert t.commit(e2) is AckResult.SUCCESS
    assert _rows(t, fmt) == [("a", 1), ("c", 30)]
    # recovered again after a kill (recoverAndCommit): nothing applied twice
    assert t.commit(e2) is AckResult.DUPLICATE
    assert _rows(t, fmt) == [("a", 1), ("c", 30)]
    # a deleted key comes back; a checkpoint of tombstones only
    assert t.commit(entry(3, 2, {"k": ["b"], "v": [200]}, [])) is AckResult.SUCCESS
    assert t.commit(entry(4, 3, {"k": [], "v": []}, ["a", "c"])) is AckResult.SUCCESS
    assert _rows(t, fmt) == [("b", 200)]
    if fmt is not TableFormat.EPOCHAL:   # Epochal's own lineage index agrees with the open table
        assert sorted((r["k"], r["v"]) for r in t.read().to_pylist()) == [("b", 200)]
        assert DELETED not in t.table_schema().names


def test_writer_round_of_a_changelog():
    """A sink writer's round of a changelog: per key the last added row, a tombstone when the key's rows were only
    retracted (its update was filtered out, or its group emptied), nothing for a key retracted and added again."""
    rows = pa.table({"k": ["a", "a", "b", "c", "c", None], "v": [1, 2, 5, 7, 8, 9],
                     "_sign": pa.array([-1, 1, -1, 1, -1, -1], pa.int32())})
    out = from_changelog(rows, SCHEMA, ["k"], ())
    got = {r["k"]: (r["v"], r[DELETED]) for r in out.to_pylist()}
    assert got == {"a": (2, False), "b": (None, True), "c": (7, False), None: (None, True)}
    assert live_rows(out).to_pylist() == [{"k": "a", "v": 2}, {"k": "c", "v": 7}]
