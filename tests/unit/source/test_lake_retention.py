"""The retention contract of a lake source (pipeline/source/lake_retention.py), on real deltalake and pyiceberg
tables (no Spark): at every listing the age of the oldest version a restore point still needs is compared with the
table's own retention settings; half of it used, or all of it, gives a warning naming the source, table, version,
checkpoint and setting. The planner echoes it as a WARNING line."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from pyiceberg.catalog.sql import SqlCatalog

from pipeline import Job
from pipeline.checkpoint.handles import Position
from pipeline.source.lake import lake_source_files, list_lake_files
from pipeline.source.lake_commits import LakeTable
from pipeline.source.lake_retention import (
    delta_contract,
    format_age,
    iceberg_contract,
    parse_delta_interval,
)

pytestmark = pytest.mark.unit

TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("_ingest_ts", TS)])
DAY_US = 86_400 * 1_000_000


def _rows(*ids: int) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})


def _delta(path: Path, *batches: pa.Table, configuration: dict[str, str] | None = None) -> LakeTable:
    for i, b in enumerate(batches):
        write_deltalake(str(path), b, mode="append" if i else "error", configuration=None if i else configuration)
    return LakeTable.parse(f"delta:{path.as_uri()}", "t")


def _commit_us(path: Path, version: int) -> int:
    return int(next(h for h in DeltaTable(str(path)).history() if h["version"] == version)["timestamp"]) * 1000


def _warnings(table: LakeTable, now_us: int, position=None, inventory=None, checkpoint=7) -> list[str]:
    out: list[str] = []
    lake_source_files("readings", table, SCHEMA, "file:///unused", position, inventory, checkpoint,
                      now_us=now_us, warn=out.append)
    return out


def test_intervals_and_contracts_from_table_properties():
    assert parse_delta_interval("interval 30 days") == 30 * 86_400
    assert parse_delta_interval("interval 1 week") == 7 * 86_400
    assert parse_delta_interval("12 hours") == 12 * 3600
    assert parse_delta_interval("INTERVAL 90 minutes") == 5400
    assert parse_delta_interval("thirty days") is None and parse_delta_interval("interval 3 fortnights") is None
    default = delta_contract({}, files_rearranged=False)
    assert (default.setting, default.seconds) == ("delta.logRetentionDuration", 30 * 86_400)
    assert "default" in default.value
    # a compaction removed files not read yet: VACUUM's shorter retention bounds the source
    both = delta_contract({}, files_rearranged=True)
    assert (both.setting, both.seconds) == ("delta.deletedFileRetentionDuration", 7 * 86_400)
    short_log = delta_contract({"delta.logRetentionDuration": "interval 2 days"}, files_rearranged=True)
    assert (short_log.setting, short_log.seconds) == ("delta.logRetentionDuration", 2 * 86_400)
    assert delta_contract({"delta.enableExpiredLogCleanup": "false"}, files_rearranged=False).seconds is None
    bad = delta_contract({"delta.logRetentionDuration": "a month"}, files_rearranged=False)
    assert bad.seconds is None and "'a month' is not an interval" in bad.note
    assert iceberg_contract({}).seconds == 5 * 86_400
    assert iceberg_contract({"history.expire.max-snapshot-age-ms": "3600000"}).seconds == 3600
    assert format_age(3 * 86_400 + 4 * 3600 + 59) == "3d 4h" and format_age(42) == "42s"


def test_delta_warns_at_half_the_log_retention_and_past_it_naming_everything(tmp_path):
    path = tmp_path / "d"
    table = _delta(path, _rows(1), _rows(2), configuration={"delta.logRetentionDuration": "interval 2 days"})
    t0 = _commit_us(path, 0)
    assert _warnings(table, t0 + DAY_US // 2) == []                       # 25% used
    (w,) = _warnings(table, t0 + DAY_US * 3 // 2)                         # 75% used
    assert w.startswith("lake source readings: table delta:") and "version 0, committed 1d 12h ago" in w
    assert "checkpoint 7 still needs" in w and "delta.logRetentionDuration = interval 2 days" in w
    assert "75% of it is used: it may be removed in 12h 0m" in w
    (w,) = _warnings(table, t0 + 3 * DAY_US)
    assert "is older than that, so the table's next cleanup may remove it" in w
    # a restore point that has read version 0 needs version 0 on (lineage); one past version 1 only version 1 on
    files = list_lake_files("readings", table, SCHEMA, 0)[0]
    pos = Position(seq=files[1].seq + 1, row=0)
    inv = [[f.seq, f.size] for f in files]
    t1 = _commit_us(path, 1)
    (w,) = _warnings(table, t1 + 3 * DAY_US, pos, inv)
    assert "version 1, committed 3d 0h ago" in w


def test_delta_a_compaction_brings_in_vacuums_retention_and_a_later_property_change_is_seen(tmp_path):
    path = tmp_path / "d"
    table = _delta(path, _rows(1), _rows(2), configuration={"delta.deletedFileRetentionDuration": "interval 1 day"})
    t0 = _commit_us(path, 0)
    assert _warnings(table, t0 + DAY_US) == []                            # 1 of the log's 30 days
    DeltaTable(str(path)).optimize.compact()                             # version 2 removes files (dataChange=false)
    (w,) = _warnings(table, t0 + DAY_US)
    assert "delta.deletedFileRetentionDuration = interval 1 day" in w and "version 0" in w
    # the table's owner shortens log retention later (a metaData action in version 3): the next listing sees it
    DeltaTable(str(path)).alter.set_table_properties({"delta.logRetentionDuration": "interval 12 hours"})
    (w,) = _warnings(table, t0 + DAY_US)
    assert "delta.logRetentionDuration = interval 12 hours" in w
    # log cleanup off and no compaction: nothing bounds the versions
    other = _delta(tmp_path / "e", _rows(1), configuration={"delta.enableExpiredLogCleanup": "false"})
    assert _warnings(other, _commit_us(tmp_path / "e", 0) + 400 * DAY_US) == []


def test_iceberg_warns_by_its_snapshot_age_property(tmp_path):
    catalog = SqlCatalog("lake", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=(tmp_path / "wh").as_uri())
    catalog.create_namespace_if_not_exists("ns")
    tbl = catalog.create_table("ns.t", schema=_rows(0).schema,
                               properties={"history.expire.max-snapshot-age-ms": str(3_600_000)})
    tbl.append(_rows(1))
    table = LakeTable.parse(f"iceberg:{tbl.location()}", "t")
    ts = min(s.timestamp_ms for s in tbl.refresh().metadata.snapshots) * 1000
    assert _warnings(table, ts + 20 * 60 * 1_000_000) == []
    (w,) = _warnings(table, ts + 2 * 3600 * 1_000_000)
    assert "history.expire.max-snapshot-age-ms = 3600000" in w and "(snapshot " in w and "older than that" in w


def test_the_epoch_planner_echoes_the_warning(tmp_path):
    """Through the runtime's planner (no Spark): the configured clock two days after the table's commits, a log
    retention of two days: the listing of every epoch echoes one WARNING line."""
    from pipeline.config import load_config
    from pipeline.runtime.driver.cursor import Cursor
    from pipeline.runtime.driver.runner import JobRunner
    path = tmp_path / "src" / "t"
    _delta(path, _rows(1, 2), configuration={"delta.logRetentionDuration": "interval 2 days"})
    t0 = _commit_us(path, 0)
    later = pa.scalar(t0 + 2 * DAY_US + 60_000_000, TS).as_py().isoformat()
    job = Job("lake_retention")
    job.source("rows", SCHEMA, key="id", table="delta:t").select("id").sink("out")
    cfg = load_config(env={}, source_uri=(tmp_path / "src").as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri(), epoch_seconds=1, clock_now=later)
    lines: list[str] = []
    r = JobRunner(job, cfg, echo=lines.append)
    r.planner.summaries(Cursor())
    warned = [m for m in lines if m.startswith("WARNING: lake source rows:")]
    assert len(warned) == 1 and "the job still needs" in warned[0] and "older than that" in warned[0], lines


@pytest.mark.s3
def test_on_s3_iceberg_lists_reads_and_warns_and_delta_loads_its_configuration(s3_root, tmp_path):
    """Both formats on moto S3: an Iceberg table whose warehouse is S3 (pyiceberg with the sink's S3 properties) is
    listed commit by commit and read by the runtime's reader; a Delta table's retention setting, set at creation and
    not in the versions a restore point lists, is loaded from the table (delta-rs with the same storage options)."""
    from pipeline.sink.delta import delta_storage_options
    from pipeline.sink.iceberg import s3_properties
    from pipeline.source.planner import plan_segment
    from pipeline.source.reader import make_split_reader, read_split_table
    from pipeline.source.summary import summarize_source
    catalog = SqlCatalog("lake_s3", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"{s3_root}/wh", **s3_properties())
    catalog.create_namespace_if_not_exists("ns")
    tbl = catalog.create_table("ns.t", schema=_rows(0).schema,
                               properties={"history.expire.max-snapshot-age-ms": str(3_600_000)})
    tbl.append(_rows(1, 2))
    tbl.refresh().append(_rows(3))
    table = LakeTable.parse(f"iceberg:{tbl.location()}", "t")
    files = list_lake_files("s", table, SCHEMA, 0)
    assert [f.seq for f in files[0]] == [1024, 2048] and all(f.uri.startswith("s3://") for f in files[0])
    seg = plan_segment(summarize_source(files)[0], Position(seq=0, row=0), Position(seq=2049, row=0), 100)
    reader = make_split_reader(SCHEMA, ("id",), "fail", f"{s3_root}/dl", "j")
    assert sorted(read_split_table(reader, seg.splits)["id"].to_pylist()) == [1, 2, 3]
    ts = min(s.timestamp_ms for s in tbl.refresh().metadata.snapshots) * 1000
    (w,) = _warnings(table, ts + 2 * 3600 * 1_000_000)
    assert "history.expire.max-snapshot-age-ms = 3600000" in w
    uri = f"{s3_root}/d"
    opts = delta_storage_options(uri)
    write_deltalake(uri, _rows(1), storage_options=opts, configuration={"delta.logRetentionDuration": "interval 1 day"})
    write_deltalake(uri, _rows(2), mode="append", storage_options=opts)
    delta = LakeTable.parse(f"delta:{uri}", "t")
    first = list_lake_files("s", delta, SCHEMA, 0)[0]
    pos, inv = Position(seq=first[1].seq + 1, row=0), [[f.seq, f.size] for f in first]
    t1 = first[1].ingest_ts
    (w,) = _warnings(delta, t1 + 2 * DAY_US, pos, inv)                   # lists version 1 only: no metaData there
    assert "version 1" in w and "delta.logRetentionDuration = interval 1 day" in w


def test_the_oldest_retained_checkpoint_is_checked_too_and_never_fails_the_listing(tmp_path):
    """A restore may choose an older retained checkpoint: its oldest needed version is checked against the same
    contract, and a version already gone says that checkpoint can no longer be restored (a warning, not an error:
    the job's own restore point decides whether the next epoch runs)."""
    from pipeline.source.lake import check_retained_restore_point
    path = tmp_path / "d"
    table = _delta(path, _rows(1), _rows(2), _rows(3), configuration={"delta.logRetentionDuration": "interval 2 days"})
    t0 = _commit_us(path, 0)
    files = list_lake_files("readings", table, SCHEMA, 0)[0]
    out: list[str] = []

    def check(position, inventory, now_us):
        check_retained_restore_point("readings", table, SCHEMA, "file:///unused", position, inventory, 3,
                                     now_us=now_us, warn=out.append)
    check(Position(seq=files[0].seq + 1, row=0), [[files[0].seq, files[0].size]], t0 + DAY_US // 2)
    assert out == []
    check(Position(seq=files[0].seq + 1, row=0), [[files[0].seq, files[0].size]], t0 + 3 * DAY_US)
    (w,) = out
    assert "version 0" in w and "retained checkpoint 3 still needs" in w and "older than that" in w
    out.clear()
    (path / "_delta_log" / f"{0:020d}.json").unlink()                     # log cleanup removed version 0
    check(Position(seq=files[0].seq + 1, row=0), [[files[0].seq, files[0].size]], t0 + 3 * DAY_US)
    (w,) = out
    assert w.startswith("lake source readings: retained checkpoint 3 can no longer be restored: ") and \
        "version 0, which checkpoint 3 needs, is no longer in the table's log" in w
