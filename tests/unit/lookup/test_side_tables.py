"""Pinning and reading side-table versions (pipeline.lookup): Delta versions, Iceberg snapshots, Parquet file
identities; the per-epoch record written once; the job API's and the runner's refusals before any side effect."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from pipeline import Job
from pipeline.config import load_config
from pipeline.exceptions import ConfigError, SourceError
from pipeline.fileio import file_io_for
from pipeline.job import LookupJoinNode
from pipeline.lookup import tables
from pipeline.lookup.pins import pin_epoch, read_pins
from pipeline.lookup.tables import pin_current, read_pinned
from pipeline.operators.lookup import SideTable
from pipeline.runtime.driver.runner import JobRunner
from pipeline.runtime.operators.round_params import EPOCH_TAG
from pipeline.runtime.spark.lookup_plan import lookup_task, side_columns

pytestmark = pytest.mark.unit

TS = pa.timestamp("us", tz="UTC")


def _t(v: int) -> pa.Table:
    return pa.table({"key": pa.array([1, 2], pa.int64()), "value": [f"v{v}-1", f"v{v}-2"]})


def test_delta_pin_reads_its_version_after_the_table_changed(tmp_path):
    write_deltalake(str(tmp_path / "d"), _t(0))
    table = SideTable.parse(f"delta:{(tmp_path / 'd').as_uri()}", "t")
    pin = pin_current(table)
    assert pin["version"] == 0
    write_deltalake(str(tmp_path / "d"), _t(1), mode="overwrite")
    assert pin_current(table)["version"] == 1
    assert read_pinned(pin)["value"].to_pylist() == ["v0-1", "v0-2"]
    assert read_pinned(pin_current(table))["value"].to_pylist() == ["v1-1", "v1-2"]


def test_parquet_pin_records_file_identities_and_refuses_a_changed_file(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    pq.write_table(_t(0), d / "a.parquet")
    pq.write_table(_t(5), d / "_hidden.parquet")
    pin = pin_current(SideTable.parse(f"parquet:{d}", "t"))
    assert [Path(f[0]).name for f in pin["files"]] == ["a.parquet"] and pin["files"][0][1] > 0
    assert read_pinned(pin).num_rows == 2
    pq.write_table(_t(1), d / "a.parquet")   # changed under the pin
    assert read_pinned(pin)["value"].to_pylist() == ["v0-1", "v0-2"]   # this worker read (and checked) it already
    tables._CACHE.clear()                                                # another worker, or a replay
    with pytest.raises(SourceError, match=r"parquet:.*a\.parquet changed after it was pinned"):
        read_pinned(pin)
    assert pin_current(SideTable.parse(f"parquet:{d}", "t"))["version"] != pin["version"]


def test_iceberg_pin_reads_its_snapshot(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=tmp_path.as_uri())
    cat.create_namespace("ns")
    tbl = cat.create_table("ns.side", schema=_t(0).schema, location=(tmp_path / "ice").as_uri())
    tbl.append(_t(0))
    table = SideTable.parse(f"iceberg:{(tmp_path / 'ice').as_uri()}", "t")
    pin = pin_current(table)
    tbl.overwrite(_t(1))
    later = pin_current(table)
    assert later["version"] != pin["version"]
    assert read_pinned(pin)["value"].to_pylist() == ["v0-1", "v0-2"]
    assert sorted(read_pinned(later)["value"].to_pylist()) == ["v1-1", "v1-2"]


def test_missing_tables_are_named(tmp_path):
    for spec in (f"delta:{tmp_path}/nope", f"parquet:{tmp_path}/nope", f"iceberg:{tmp_path}/nope"):
        with pytest.raises(ConfigError, match=f"side table '{spec}' is missing or unreadable"):
            pin_current(SideTable.parse(spec, "t"))


def test_an_epoch_pin_is_written_once(tmp_path):
    write_deltalake(str(tmp_path / "d"), _t(0))
    table = SideTable.parse(f"delta:{tmp_path / 'd'}", "t")
    fio, root = file_io_for(tmp_path.as_uri()), (tmp_path / "job").as_uri()
    assert pin_epoch(fio, root, "j", 7, table)["version"] == 0
    write_deltalake(str(tmp_path / "d"), _t(1), mode="overwrite")
    assert pin_epoch(fio, root, "j", 7, table)["version"] == 0     # a replay of epoch 7: the recorded version
    assert pin_epoch(fio, root, "j", 8, table)["version"] == 1     # epoch 8, first processed now
    assert {e: p["version"] for e, p in read_pins(fio, root, "j").items()} == {7: 0, 8: 1}
    assert list(read_pins(fio, root, "j", upto_epoch=7)) == [7]


def _job(table: str) -> Job:
    job = Job("lk")
    s = job.source("s", pa.schema([("id", pa.string()), ("key", pa.int64()), ("_ingest_ts", TS)]), key="id")
    s.lookup_join(uid="side", table=table, on="key").sink("out")
    return job


def test_job_api_refusals():
    job = Job("lk")
    s = job.source("s", pa.schema([("id", pa.string()), ("key", pa.int64()), ("_ingest_ts", TS)]), key="id")
    s.lookup_join(uid="side", table="delta:/x", on="key")
    for kw, msg in ((dict(uid="side", table="delta:/x", on="key"), "used twice"),
                    (dict(uid="b", table="csv:/x", on="key"), "parquet:<uri>"),
                    (dict(uid="c", table="delta:/x", on="key", how="right"), "how="),
                    (dict(uid="d", table="delta:/x", on=("key",)), "on="),
                    (dict(uid="e", table="delta:/x", on="key", columns=["key"]), "columns=")):
        with pytest.raises(ConfigError, match=msg):
            s.lookup_join(**kw)


def test_runner_refuses_a_missing_table_before_any_side_effect(tmp_path):
    cfg = load_config(env={}, source_uri=(tmp_path / "src").as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri())
    with pytest.raises(ConfigError, match=r"lookup join 'side' \(table='delta:side/items'\): .*src/side/items' is missing"):
        JobRunner(_job("delta:side/items"), cfg)
    assert not (tmp_path / "ckpt").exists()
    write_deltalake(str(tmp_path / "src" / "side" / "items"), _t(0))
    JobRunner(_job("delta:side/items"), cfg)   # relative to the source root: found
    with pytest.raises(ConfigError, match="aligned exactly-once"):
        JobRunner(_job("delta:side/items"), cfg.with_(checkpoint_mode="at_least_once"))


def test_the_task_joins_each_epoch_of_a_tagged_round_with_its_own_version(tmp_path):
    """A round of two epochs pinned to different Delta versions: each row joins its own epoch's version (the task
    function of the Spark step, fed as Spark Connect would: the round's value embedded)."""
    write_deltalake(str(tmp_path / "d"), _t(0))
    table = SideTable.parse(f"delta:{tmp_path / 'd'}", "t")
    v0 = pin_current(table)
    write_deltalake(str(tmp_path / "d"), _t(1), mode="overwrite")
    v1 = pin_current(table)
    node = LookupJoinNode("side", 0, table, "k", "key", "left", ())
    rows = pa.table({"k": pa.array([1, 2, 1, None, 2], pa.int64()), EPOCH_TAG: pa.array([5, 5, 6, 6, 6], pa.int64())})
    side = side_columns(node, read_pinned(v0).schema, rows.column_names)
    task = lookup_task(node, side, True, {"epochs": {"5": v0, "6": v1}})
    out = pa.Table.from_batches(list(task(iter(rows.to_batches()))))
    assert sorted(zip(out["k"].to_pylist(), out[EPOCH_TAG].to_pylist(), out["value"].to_pylist()), key=repr) == sorted(
        [(1, 5, "v0-1"), (2, 5, "v0-2"), (1, 6, "v1-1"), (None, 6, None), (2, 6, "v1-2")], key=repr)
    untagged = lookup_task(node, side, False, {"epochs": {"5": v0, "6": v1}})
    with pytest.raises(RuntimeError, match="rows without an epoch"):
        list(untagged(iter(rows.drop_columns([EPOCH_TAG]).to_batches())))
