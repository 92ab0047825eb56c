"""The open-format commit protocol (Iceberg / Delta) without Spark, on file:// and on a moto S3 server in its
own process (delta-rs holds the GIL in some calls, which would stall an in-process moto server):
markers, idempotent recommit, rewind to the parent, restore of a later checkpoint, upsert, empty checkpoints,
schema evolution (added nullable column) and refusal. Read back by the formats' own readers."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.ack import AckResult
from pipeline.checkpoint.handles import FileHandle
from pipeline.config import load_config
from pipeline.exceptions import IncompatibleSinkSchemaError
from pipeline.fileio import file_io_for
from pipeline.sink.formats import open_sink_table
from pipeline.sink.table import CommitEntry
from pipeline.sink.table_format import TableFormat, resolve_format

pytestmark = [pytest.mark.unit, pytest.mark.table_formats]

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


@pytest.fixture(scope="module")
def moto_proc():
    from pipeline.testing.moto_server import moto_s3_process
    with moto_s3_process(buckets=["tables"]) as proc:
        yield proc


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.s3)])
def sink_root(request, tmp_path):
    if request.param == "file":
        return (tmp_path / "sink").as_uri(), {}
    request.getfixturevalue("moto_proc")
    return f"s3://tables/{tmp_path.name}", {"iceberg_catalog_uri": f"sqlite:///{tmp_path}/cat.db"}


def _stage(table, cid: int, rows: dict) -> FileHandle:
    t = pa.table(rows, schema=SCHEMA) if set(rows) <= set(SCHEMA.names) else pa.table(rows)
    uri = table.part_uri(cid, 0)
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink)
    data = sink.getvalue().to_pybytes()
    table.fileio.write_bytes(uri, data)
    return FileHandle(uri=uri, rows=t.num_rows, bytes=len(data), sha256="")


def _rows(table) -> list[tuple]:
    return sorted((r["k"], r["v"]) for r in table.open_read().to_pylist())


@pytest.mark.parametrize("fmt", [TableFormat.ICEBERG, TableFormat.DELTA])
@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_commit_protocol(sink_root, tmp_path, fmt, mode):
    root, extra = sink_root
    cfg = load_config(env={}, sink_uri=root, **extra)
    key = ("k",) if mode == "upsert" else ()
    t = open_sink_table(file_io_for(root), cfg, "job1", "out", mode=mode, key=key, fmt=fmt)
    t.prepare(SCHEMA)

    def commit(cid, parent, rows):
        files = (_stage(t, cid, rows),) if rows else ()
        return t.commit(CommitEntry(table="out", checkpoint_id=cid, parent_id=parent, files=files, mode=mode,
                                    key=key))

    assert commit(1, None, {"k": ["a", "b"], "v": [1, 2]}) is AckResult.SUCCESS
    assert commit(2, 1, {"k": ["b", "c"], "v": [20, 3]}) is AckResult.SUCCESS
    after2 = _rows(t)
    want2 = ([("a", 1), ("b", 2), ("b", 20), ("c", 3)] if mode == "append" else [("a", 1), ("b", 20), ("c", 3)])
    assert after2 == want2
    v = t.version_id()
    # recover-and-commit of checkpoint 2 again: the table has it -> DUPLICATE, no new snapshot/version
    same = CommitEntry(table="out", checkpoint_id=2, parent_id=1,
                       files=t.entry(2).files, mode=mode, key=key)
    assert t.commit(same) is AckResult.DUPLICATE and t.version_id() == v
    assert t.current_checkpoint() == 2
    # an empty checkpoint still commits its markers
    assert commit(3, 2, None) is AckResult.SUCCESS
    assert t.current_checkpoint() == 3 and _rows(t) == want2
    # rewind: checkpoint 4 re-processes after checkpoint 1 -> 2 and 3 are replaced, still in the history
    assert commit(4, 1, {"k": ["z"], "v": [9]}) is AckResult.SUCCESS
    want4 = [("a", 1), ("b", 2), ("z", 9)]
    assert _rows(t) == want4 and t.current_checkpoint() == 4
    assert t.find(2) is not None
    # restore of checkpoint 2 (e.g. `restore --from 2`): the table is made current at it again
    assert t.commit(same) is AckResult.DUPLICATE
    assert _rows(t) == want2 and t.current_checkpoint() == 2
    # rewind to the very beginning (parent None): the table starts empty again
    assert commit(5, None, {"k": ["q"], "v": [7]}) is AckResult.SUCCESS
    assert _rows(t) == [("q", 7)]
    # a fresh object (another process) sees the same
    t2 = open_sink_table(file_io_for(root), cfg, "job1", "out", mode=mode, key=key, fmt=fmt)
    assert t2.current_checkpoint() == 5 and _rows(t2) == [("q", 7)]


@pytest.mark.parametrize("fmt", [TableFormat.ICEBERG, TableFormat.DELTA])
def test_upsert_null_key_is_one_row(tmp_path, fmt):
    """An aggregate's NULL group (docs/operators.md "Null keys"): an upsert matches keys null-safely, so the null
    key's row is replaced in place - one row, the newest value - not inserted again (Delta's ``t.k = s.k``) nor
    refused (pyiceberg cannot take a null literal in its match filter); Epochal's own reader agrees."""
    cfg = load_config(env={}, sink_uri=(tmp_path / "sink").as_uri())
    t = open_sink_table(file_io_for(cfg.sink_uri), cfg, "job1", "totals", mode="upsert", key=("k",), fmt=fmt)
    t.prepare(SCHEMA)
    for cid, rows in ((1, {"k": ["a", None], "v": [1, 2]}), (2, {"k": [None, "b"], "v": [20, 3]}),
                      (3, {"k": [None], "v": [21]})):
        t.commit(CommitEntry(table="totals", checkpoint_id=cid, parent_id=cid - 1 if cid > 1 else None,
                             files=(_stage(t, cid, rows),), mode="upsert", key=("k",)))
    want = sorted([("a", 1), ("b", 3), (None, 21)], key=repr)
    assert sorted(((r["k"], r["v"]) for r in t.open_read().to_pylist()), key=repr) == want
    assert sorted(((r["k"], r["v"]) for r in t.read().to_pylist()), key=repr) == want


@pytest.mark.parametrize("fmt", [TableFormat.ICEBERG, TableFormat.DELTA])
def test_schema_evolution(tmp_path, fmt):
    cfg = load_config(env={}, sink_uri=(tmp_path / "sink").as_uri())
    t = open_sink_table(file_io_for(cfg.sink_uri), cfg, "job1", "out", fmt=fmt)
    t.prepare(SCHEMA)
    wider = SCHEMA.append(pa.field("note", pa.string(), nullable=True))
    t.prepare(wider)  # added nullable column: compatible, added to the table
    assert t.table_schema().names == ["k", "v", "note"]
    with pytest.raises(IncompatibleSinkSchemaError, match=r"out.*'v' changes type"):
        t.prepare(pa.schema([("k", pa.string()), ("v", pa.string()), ("note", pa.string())]))
    with pytest.raises(IncompatibleSinkSchemaError, match="'note'.*missing"):
        t.prepare(SCHEMA)


def test_format_resolution():
    assert resolve_format("a", None, "") is TableFormat.EPOCHAL
    assert resolve_format("a", "delta", "") is TableFormat.DELTA
    assert resolve_format("a", "delta", "iceberg") is TableFormat.ICEBERG
    assert resolve_format("a", "delta", "b=iceberg") is TableFormat.DELTA
    assert resolve_format("b", None, "b=iceberg, a=delta") is TableFormat.ICEBERG
    from pipeline.exceptions import ConfigError
    with pytest.raises(ConfigError, match="PIPELINE_SINK_FORMAT"):
        load_config(env={"PIPELINE_SINK_FORMAT": "hudi"})
