"""Lake tables as sources (pipeline/source/lake.py), without Spark: real Delta tables (deltalake) and Iceberg tables
(pyiceberg, embedded SQLite catalog) on file://, listed as a virtual file log; the skip and stop rules per kind of
commit; retention and lineage checks; summaries, barriers and the reader on lake files."""
from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table.snapshots import Operation
from pyiceberg.table.update.snapshot import _OverwriteFiles

from pipeline import Job
from pipeline.checkpoint.handles import Position
from pipeline.exceptions import ConfigError, LakeSourceError
from pipeline.source.lake import FILES_PER_COMMIT, lake_source_files, list_lake_files, listing_start_version
from pipeline.source.lake_commits import LakeTable, delta_commits
from pipeline.source.planner import plan_segment
from pipeline.source.positions import barrier_position
from pipeline.source.reader import make_split_reader, read_split_table
from pipeline.source.summary import summarize_source

pytestmark = pytest.mark.unit

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("_ingest_ts", TS)])


def _rows(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})


def _delta(tmp_path: Path, *batches: pa.Table) -> LakeTable:
    path = tmp_path / "d"
    for i, b in enumerate(batches):
        write_deltalake(str(path), b, mode="append" if i else "error")
    return LakeTable.parse(f"delta:{path.as_uri()}", "t")


def _seqs(files) -> list[int]:
    return [f.seq for f in files.get(0, ())]


def _commit_ts_us(path: Path, version: int) -> int:
    info = [h for h in DeltaTable(str(path)).history() if h["version"] == version][0]
    return int(info["timestamp"]) * 1000


# --- Delta ------------------------------------------------------------------------------------------------------
def test_delta_appends_are_files_in_commit_order_with_the_commit_time(tmp_path):
    table = _delta(tmp_path, _rows(1, 2), _rows(3))
    files = list_lake_files("s", table, SCHEMA, 0)
    assert _seqs(files) == [0, FILES_PER_COMMIT]
    f0, f1 = files[0]
    assert f0.ingest_ts == _commit_ts_us(tmp_path / "d", 0) and f1.ingest_ts == _commit_ts_us(tmp_path / "d", 1)
    assert f0.uri.startswith("file://") and f0.uri.endswith(".parquet") and f0.origin == f"table {table.spec} version 0"
    # a listing from version 1 on lists version 1 only
    assert _seqs(list_lake_files("s", table, SCHEMA, 1)) == [FILES_PER_COMMIT]
    # the version after the newest: nothing new, not an error
    assert list_lake_files("s", table, SCHEMA, 2) == {}


def test_delta_compaction_is_skipped_and_a_delete_stops_the_source(tmp_path):
    table = _delta(tmp_path, _rows(1, 2), _rows(3))
    dt = DeltaTable(str(tmp_path / "d"))
    dt.optimize.compact()                                      # version 2: dataChange=false
    write_deltalake(str(tmp_path / "d"), _rows(4), mode="append")   # version 3
    files = list_lake_files("s", table, SCHEMA, 0)
    assert _seqs(files) == [0, FILES_PER_COMMIT, 3 * FILES_PER_COMMIT]   # no duplicate rows from the compaction
    assert [c.operation for c in delta_commits(table, SCHEMA, 0).commits] == ["WRITE", "WRITE", "OPTIMIZE", "WRITE"]
    DeltaTable(str(tmp_path / "d")).delete("id = 1")           # version 4
    with pytest.raises(LakeSourceError, match=r"version 4 \(DELETE\) removes rows"):
        list_lake_files("s", table, SCHEMA, 0)
    with pytest.raises(LakeSourceError, match=r"version 4 \(DELETE\)"):
        list_lake_files("s", table, SCHEMA, 3)                 # from any version before it
    DeltaTable(str(tmp_path / "d")).restore(3)                 # version 5: the delete is abandoned
    assert _seqs(list_lake_files("s", table, SCHEMA, 0)) == [0, FILES_PER_COMMIT, 3 * FILES_PER_COMMIT]
    assert list_lake_files("s", table, SCHEMA, 5) == {}


def test_delta_restore_is_followed_unless_the_job_read_an_abandoned_version(tmp_path):
    """A rewind of the writing job (Epochal's Delta sink writes a RESTORE to the restored checkpoint's version): a
    reader that has not read the abandoned versions skips them; one that has fails naming version and checkpoint."""
    table = _delta(tmp_path, _rows(1), _rows(2), _rows(3))      # versions 0, 1, 2
    first = list_lake_files("s", table, SCHEMA, 0)[0]
    DeltaTable(str(tmp_path / "d")).restore(1)                 # version 3: version 2 abandoned
    write_deltalake(str(tmp_path / "d"), _rows(30), mode="append")   # version 4: the writer's re-run
    assert _seqs(list_lake_files("s", table, SCHEMA, 0)) == [0, FILES_PER_COMMIT, 4 * FILES_PER_COMMIT]
    # read up to version 1: follows
    inv = [[f.seq, f.size] for f in first[:2]]
    files, _ = lake_source_files("s", table, SCHEMA, "file:///unused", Position(seq=FILES_PER_COMMIT + 1, row=0),
                                 inv, 6)
    assert _seqs(files) == [FILES_PER_COMMIT, 4 * FILES_PER_COMMIT]
    # read version 2 (abandoned): fails, never a silent other history
    inv = [[f.seq, f.size] for f in first]
    with pytest.raises(LakeSourceError, match=r"version 2: data file 0 of that version, which checkpoint 7 has read, "
                                              r"is gone in the table's current history"):
        lake_source_files("s", table, SCHEMA, "file:///unused", Position(seq=2 * FILES_PER_COMMIT + 1, row=0), inv, 7)
    # a restore to a version an earlier restore abandoned cannot be followed
    DeltaTable(str(tmp_path / "d")).restore(2)                 # version 5
    with pytest.raises(LakeSourceError, match=r"version 5 \(RESTORE\) restores version 2, which an earlier RESTORE"):
        list_lake_files("s", table, SCHEMA, 0)


def test_delta_schema_changes_added_columns_are_fine_others_stop_naming_the_version(tmp_path):
    table = _delta(tmp_path, _rows(1))
    extra = _rows(2).append_column("note", pa.array(["n"], pa.string()))
    write_deltalake(str(tmp_path / "d"), extra, mode="append", schema_mode="merge")   # version 1: a new column
    assert _seqs(list_lake_files("s", table, SCHEMA, 0)) == [0, FILES_PER_COMMIT]
    # the declared schema wants a column the table does not have
    wants = SCHEMA.append(pa.field("missing", pa.string()))
    with pytest.raises(LakeSourceError, match=r"version 0 \(WRITE\): declared column 'missing' is not in the table"):
        list_lake_files("s", table, wants, 0)
    # a declared type the table's type does not cast to
    as_date = pa.schema([("id", pa.date32()), ("_ingest_ts", TS)])
    with pytest.raises(LakeSourceError, match=r"column 'id' is int64 in the table and cannot be read as the declared"):
        list_lake_files("s", table, as_date, 0)
    # a later version that drops a declared column (an overwrite with a new schema) stops there
    write_deltalake(str(tmp_path / "d"), pa.table({"id": pa.array([9], pa.int64())}), mode="overwrite",
                    schema_mode="overwrite")
    with pytest.raises(LakeSourceError, match=r"version 2 \(WRITE\)"):
        list_lake_files("s", table, SCHEMA, 1)


def test_delta_retention_a_removed_version_fails_naming_table_version_and_checkpoint(tmp_path):
    table = _delta(tmp_path, _rows(1), _rows(2), _rows(3))
    log = tmp_path / "d" / "_delta_log"
    (log / f"{0:020d}.json").unlink()            # what log retention does once a checkpoint covers it
    pos = Position(seq=FILES_PER_COMMIT, row=0)  # checkpoint 7 read version 0 (file seq 0) only
    inv = [[0, 10]]
    assert listing_start_version(pos, inv) == 0
    with pytest.raises(LakeSourceError, match=r"version 0, which checkpoint 7 needs, is no longer in the table's log "
                                              r"\(the oldest version there is 1"):
        lake_source_files("s", table, SCHEMA, "file:///unused", pos, inv, 7)
    # a job that has read version 1 lists from there: unaffected
    files, start = lake_source_files("s", table, SCHEMA, "file:///unused", Position(seq=FILES_PER_COMMIT + 1, row=0),
                                     [[FILES_PER_COMMIT, list_lake_files("s", table, SCHEMA, 1)[0][0].size]], 8)
    assert _seqs(files) == [FILES_PER_COMMIT, 2 * FILES_PER_COMMIT] and start == {0: FILES_PER_COMMIT}


def test_delta_lineage_a_recreated_table_is_detected(tmp_path):
    table = _delta(tmp_path, _rows(1), _rows(2))
    files = list_lake_files("s", table, SCHEMA, 0)
    inv = [[f.seq, f.size] for f in files[0]]
    pos = Position(seq=FILES_PER_COMMIT + 1, row=0)   # both versions read
    assert listing_start_version(pos, inv) == 1
    lake_source_files("s", table, SCHEMA, "file:///unused", pos, inv, 3)   # same table: fine
    import shutil
    shutil.rmtree(tmp_path / "d")
    _delta(tmp_path, _rows(10, 11, 12), _rows(13, 14, 15, 16))          # same location, other content
    with pytest.raises(LakeSourceError, match=r"version 1: data file 0 of that version, which checkpoint 3 has read, "
                                              r"has \d+ bytes, not the \d+ read"):
        lake_source_files("s", table, SCHEMA, "file:///unused", pos, inv, 3)
    shutil.rmtree(tmp_path / "d")
    _delta(tmp_path, _rows(10))                                          # fewer versions than were read
    with pytest.raises(LakeSourceError, match=r"newest version is 0 but checkpoint 3 has read up to version 0|"
                                              r"version 1: data file 0 .* is gone"):
        lake_source_files("s", table, SCHEMA, "file:///unused", pos, inv, 3)


def test_listing_start_version_from_positions_and_inventory():
    K = FILES_PER_COMMIT
    assert listing_start_version(None, None) == 0
    assert listing_start_version(Position(seq=3 * K + 2, row=5), None) == 3        # inside a file of version 3
    assert listing_start_version(Position(seq=3 * K + 2, row=0), [[3 * K + 1, 5]]) == 3
    # a barrier at the first row of version 5: the last file read is in version 2 (versions 3, 4 had no files)
    assert listing_start_version(Position(seq=5 * K, row=0), [[2 * K, 5], [2 * K + 1, 6]]) == 2


def test_summaries_barriers_and_reader_use_the_commit_time(tmp_path):
    table = _delta(tmp_path, _rows(1, 2, 3), _rows(4, 5))
    files = list_lake_files("s", table, SCHEMA, 0)
    t0, t1 = (f.ingest_ts for f in files[0])
    assert t0 is not None and t1 is not None
    sums = summarize_source(files)[0]
    assert [(s.rows, s.min_ts, s.max_ts) for s in sums] == [(3, t0, t0), (2, t1, t1)]
    assert barrier_position(sums, t0 + 1) == (Position(seq=FILES_PER_COMMIT, row=0) if t1 > t0 else None)
    seg = plan_segment(sums, Position(seq=0, row=1), Position(seq=FILES_PER_COMMIT + 1, row=0), 100)
    assert [(s.seq, s.row_start, s.row_end, s.ingest_ts) for s in seg.splits] == [
        (0, 1, 3, t0), (FILES_PER_COMMIT, 0, 2, t1)]
    reader = make_split_reader(SCHEMA, ("id",), "fail", (tmp_path / "dl").as_uri(), "j")
    out = read_split_table(reader, seg.splits)
    assert out["id"].to_pylist() == [2, 3, 4, 5]
    assert out["_ingest_ts"].cast(pa.int64()).to_pylist() == [t0, t0, t1, t1]
    assert out["_seq"].to_pylist() == [0, 0, FILES_PER_COMMIT, FILES_PER_COMMIT]
    assert out["_row"].to_pylist() == [1, 2, 0, 1]


def test_a_table_column_named_ingest_ts_is_replaced_by_the_commit_time_unless_asked_for(tmp_path):
    own = pa.array([1_000_000, 2_000_000], pa.int64()).cast(TS)
    table = _delta(tmp_path, _rows(1, 2).append_column("_ingest_ts", own))
    reader = make_split_reader(SCHEMA, ("id",), "fail", (tmp_path / "dl").as_uri(), "j")
    for mode, want in (("commit", None), ("column", [1_000_000, 2_000_000])):
        files = list_lake_files("s", table, SCHEMA, 0, ingest_time=mode)  # type: ignore[arg-type]
        seg = plan_segment(summarize_source(files)[0], Position(seq=0, row=0), Position(seq=1, row=0), 100)
        got = read_split_table(reader, seg.splits)["_ingest_ts"].cast(pa.int64()).to_pylist()
        assert got == (want or [files[0][0].ingest_ts] * 2)


def test_a_vacuumed_data_file_is_named_with_its_table_and_version(tmp_path):
    table = _delta(tmp_path, _rows(1))
    files = list_lake_files("s", table, SCHEMA, 0)
    Path(files[0][0].uri[len("file://"):]).unlink()
    from pipeline.exceptions import SourceError
    with pytest.raises(SourceError, match=r"data file of a lake table disappeared: .* version 0"):
        summarize_source(files)


# --- Iceberg ----------------------------------------------------------------------------------------------------
@pytest.fixture
def catalog(tmp_path):
    return SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=(tmp_path / "wh").as_uri())


def _iceberg(catalog, *batches: pa.Table):
    catalog.create_namespace_if_not_exists("ns")
    tbl = catalog.create_table("ns.t", schema=_rows(0).schema)
    for b in batches:
        tbl.append(b)
    return tbl, LakeTable.parse(f"iceberg:{tbl.location()}", "t")


def _replace(tbl, compacted: pa.Table, monkeypatch) -> None:
    """A ``replace`` snapshot, as rewrite_data_files (Spark, Flink) writes it: every data file out, one file with the
    same rows in. pyiceberg has no compaction and refuses to summarise a replace (its totals are an overwrite's, kept
    under the operation ``replace``)."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files
    from pyiceberg.table.snapshots import Summary
    from pyiceberg.table.update import snapshot as snapshot_module
    plain = snapshot_module.update_snapshot_summaries

    def as_replace(summary, previous_summary=None):
        out = plain(Summary(Operation.OVERWRITE, **summary.additional_properties), previous_summary)
        return Summary(Operation.REPLACE, **out.additional_properties)
    with monkeypatch.context() as m, tbl.transaction() as tx:
        m.setattr(snapshot_module, "update_snapshot_summaries", as_replace)
        op = _OverwriteFiles(Operation.REPLACE, tx, tbl.io, uuid.uuid4())
        for task in tbl.scan().plan_files():
            op.delete_data_file(task.file)
        for df in _dataframe_to_data_files(tx.table_metadata, compacted, tbl.io, uuid.uuid4()):
            op.append_data_file(df)
        op.commit()


def test_iceberg_appends_replace_skipped_delete_stops(catalog, monkeypatch):
    tbl, table = _iceberg(catalog, _rows(1, 2), _rows(3))
    files = list_lake_files("s", table, SCHEMA, 0)
    snaps = sorted(tbl.refresh().metadata.snapshots, key=lambda s: s.sequence_number)
    assert _seqs(files) == [1 * FILES_PER_COMMIT, 2 * FILES_PER_COMMIT]
    assert [f.ingest_ts for f in files[0]] == [s.timestamp_ms * 1000 for s in snaps]
    _replace(tbl.refresh(), _rows(1, 2, 3), monkeypatch)                      # sequence number 3: skipped
    tbl.refresh().append(_rows(4))                                 # 4
    assert _seqs(list_lake_files("s", table, SCHEMA, 0)) == [FILES_PER_COMMIT, 2 * FILES_PER_COMMIT,
                                                             4 * FILES_PER_COMMIT]
    reader = make_split_reader(SCHEMA, ("id",), "fail", "file:///tmp/unused-dl", "j")
    sums = summarize_source(list_lake_files("s", table, SCHEMA, 0))[0]
    seg = plan_segment(sums, Position(seq=0, row=0), Position(seq=4 * FILES_PER_COMMIT + 1, row=0), 100)
    assert sorted(read_split_table(reader, seg.splits)["id"].to_pylist()) == [1, 2, 3, 4]
    tbl.refresh().delete("id = 1")
    with pytest.raises(LakeSourceError, match=r"version 5 \(snapshot \d+, (delete|overwrite)\) removes or rewrites"):
        list_lake_files("s", table, SCHEMA, 0)


def test_iceberg_expired_snapshot_and_rollback_fail_naming_the_checkpoint(catalog):
    tbl, table = _iceberg(catalog, _rows(1), _rows(2), _rows(3))
    files = list_lake_files("s", table, SCHEMA, 0)[0]
    inv = [[files[0].seq, files[0].size]]
    pos = Position(seq=files[0].seq + 1, row=0)                    # checkpoint 4 read the first snapshot only
    first = min(tbl.metadata.snapshots, key=lambda s: s.sequence_number).snapshot_id
    tbl.maintenance.expire_snapshots().by_id(first).commit()
    with pytest.raises(LakeSourceError, match=r"its history before version 2 \(snapshot \d+\) has expired .* but "
                                              r"checkpoint 4 needs version 1 on"):
        lake_source_files("s", table, SCHEMA, "file:///unused", pos, inv, 4)
    with pytest.raises(LakeSourceError, match=r"history before version 2 .* has expired .* the job needs version 0"):
        list_lake_files("s", table, SCHEMA, 0)                     # a new job: rows of snapshot 1 are in the table
    # rollback: the writing job rewound to the second snapshot and appended again
    tbl2, table2 = _iceberg_named(catalog, "u", _rows(1), _rows(2), _rows(3))
    fs = list_lake_files("s", table2, SCHEMA, 0)[0]
    inv2 = [[f.seq, f.size] for f in fs]
    pos2 = Position(seq=fs[-1].seq + 1, row=0)                     # all three read
    second = sorted(tbl2.metadata.snapshots, key=lambda s: s.sequence_number)[1].snapshot_id
    tbl2.manage_snapshots().set_current_snapshot(second).commit()
    tbl2.refresh().append(_rows(9))
    with pytest.raises(LakeSourceError, match=r"version 3: data file 0 of that version, which checkpoint 5 has read, "
                                              r"is gone in the table's current history"):
        lake_source_files("s", table2, SCHEMA, "file:///unused", pos2, inv2, 5)


def _iceberg_named(catalog, name: str, *batches: pa.Table):
    catalog.create_namespace_if_not_exists("ns")
    tbl = catalog.create_table(f"ns.{name}", schema=_rows(0).schema)
    for b in batches:
        tbl.append(b)
    return tbl.refresh(), LakeTable.parse(f"iceberg:{tbl.location()}", "t")


def test_iceberg_by_catalog_name(catalog, tmp_path, monkeypatch):
    _iceberg(catalog, _rows(1))
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", f"sqlite:///{tmp_path}/cat.db")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "sql")
    import pyiceberg.catalog
    from pyiceberg.utils.config import Config
    monkeypatch.setattr(pyiceberg.catalog, "_ENV_CONFIG", Config())   # pyiceberg reads its environment on import
    table = LakeTable.parse("iceberg:lake.ns.t", "t")
    assert table.in_catalog and table.resolved("file:///x") == table
    assert _seqs(list_lake_files("s", table, SCHEMA, 0)) == [FILES_PER_COMMIT]
    with pytest.raises(LakeSourceError, match=r"table iceberg:lake.ns.nope is missing or unreadable"):
        list_lake_files("s", LakeTable.parse("iceberg:lake.ns.nope", "t"), SCHEMA, 0)


# --- the job API ------------------------------------------------------------------------------------------------
def test_job_source_table_argument_is_checked_at_definition():
    job = Job("j")
    s = job.source("a", SCHEMA, key="id", table="delta:file:///tmp/x")
    node = job.sources()[0]
    assert s is not None and node.table == LakeTable("delta", "file:///tmp/x") and node.ingest_time == "commit"
    assert LakeTable.parse("delta:relative/t", "w").resolved("s3://b/root/") == LakeTable("delta", "s3://b/root/relative/t")
    assert LakeTable.parse("delta:/abs/t", "w").resolved("s3://b") == LakeTable("delta", "file:///abs/t")
    for bad, msg in (("parquet:x", "use 'delta:<uri>'"), ("delta:", "use 'delta:<uri>'"),
                     ("iceberg:ns.t", "'<catalog>.<namespace>.<table>'")):
        with pytest.raises(ConfigError, match=msg):
            Job("j").source("a", SCHEMA, table=bad)
    with pytest.raises(ConfigError, match="ingest_time applies to a lake source"):
        Job("j").source("a", SCHEMA, ingest_time="column")
    with pytest.raises(ConfigError, match="format applies to a file log"):
        Job("j").source("a", SCHEMA, table="delta:/x", format="jsonl")
    with pytest.raises(LakeSourceError, match=r"table delta:file:///nonexistent/t: no Delta table there"):
        list_lake_files("a", LakeTable.parse("delta:/nonexistent/t", "w").resolved("file:///"), SCHEMA, 0)


@pytest.mark.s3
def test_delta_on_s3_listing_summaries_and_reader(s3_root):
    from pipeline.sink.delta import delta_storage_options
    uri = f"{s3_root}/d"
    opts = delta_storage_options(uri)
    write_deltalake(uri, _rows(1, 2), storage_options=opts)
    write_deltalake(uri, _rows(3), mode="append", storage_options=opts)
    DeltaTable(uri, storage_options=opts).optimize.compact()
    write_deltalake(uri, _rows(4), mode="append", storage_options=opts)
    table = LakeTable.parse(f"delta:{uri}", "t")
    files = list_lake_files("s", table, SCHEMA, 0)
    assert _seqs(files) == [0, FILES_PER_COMMIT, 3 * FILES_PER_COMMIT] and files[0][0].uri.startswith("s3://")
    sums = summarize_source(files)[0]
    seg = plan_segment(sums, Position(seq=0, row=0), Position(seq=3 * FILES_PER_COMMIT + 1, row=0), 100)
    reader = make_split_reader(SCHEMA, ("id",), "fail", f"{s3_root}/dl", "j")
    assert sorted(read_split_table(reader, seg.splits)["id"].to_pylist()) == [1, 2, 3, 4]


def test_the_epoch_planner_lists_a_lake_source_and_keeps_its_read_inventory(tmp_path):
    """The runtime's planner (no Spark): a relative ``delta:`` table under the source root is listed as partition 0,
    summarised with the commit times, and its listing start recorded for the next checkpoint's inventory."""
    from pipeline.config import load_config
    from pipeline.runtime.driver.cursor import Cursor
    from pipeline.runtime.driver.runner import JobRunner
    write_deltalake(str(tmp_path / "src" / "t"), _rows(1, 2))
    write_deltalake(str(tmp_path / "src" / "t"), _rows(3), mode="append")
    job = Job("lake_planner")
    job.source("rows", SCHEMA, key="id", table="delta:t").select("id").sink("out")
    cfg = load_config(env={}, source_uri=(tmp_path / "src").as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri(), epoch_seconds=1)
    r = JobRunner(job, cfg, echo=lambda m: None)
    sums = r.planner.summaries(Cursor())
    assert [(s.seq, s.rows) for s in sums["rows"][0]] == [(0, 2), (FILES_PER_COMMIT, 1)]
    assert r.ctx.source_inventory_behind == {"rows": {"0": []}}
    assert r.planner.unread(Cursor(), sums) == 3
    assert r.planner.first_epoch(sums) == sums["rows"][0][0].min_ts // 1_000_000


def test_splits_carry_the_commit_time_and_the_batch_evaluation_reads_lake_files_with_the_runtime_reader(tmp_path):
    """A split's commit time survives its dict and Arrow forms (the round's task parameters, the reader's input), and
    ``validate``'s native Spark Parquet read leaves lake files to the runtime's reader (which adds ``_ingest_ts``)."""
    from pipeline.batch.evaluation.source_read import native_files
    from pipeline.source.planner import Split, splits_table
    from pipeline.source.reader import _splits_of
    sp = Split("s", 0, FILES_PER_COMMIT, "file:///x.parquet", "parquet", 0, 5, 1_767_225_600_000_000)
    assert Split.from_dict(sp.as_dict()) == sp
    assert list(_splits_of(splits_table([sp]).to_batches()[0])) == [sp]
    own = pa.array([1_000_000, 2_000_000], pa.int64()).cast(TS)   # a column Spark would read instead of commit time
    table = _delta(tmp_path, _rows(1, 2).append_column("_ingest_ts", own))
    f = list_lake_files("s", table, SCHEMA, 0)[0][0]
    plain = (f.source, f.partition, f.seq, f.uri, f.format, f.size, None, None)
    assert native_files_of(plain)   # the same file as a plain source file: read natively
    job = Job("j")
    job.source("s", SCHEMA, key="id", table=table.spec)
    node = job.sources()[0]
    lake = (f.source, f.partition, f.seq, f.uri, f.format, f.size, None, f.ingest_ts)
    assert native_files(node, [lake]) == ([], [lake])


def native_files_of(t: tuple) -> bool:
    from pipeline.batch.evaluation.source_read import native_files
    job = Job("j")
    job.source("s", SCHEMA, key="id")
    return bool(native_files(job.sources()[0], [t])[0])
