"""PIPELINE_STATE_BACKEND=rocksdb with a real local Spark and a job of this test's own making (a dedup with a TTL
chained into a full outer join with a TTL, and a running aggregate; keys repeat on both sides, across epochs and
partitions; never-matched rows pile up and expire as outer rows): the committed output and the checkpointed state equal the heap backend's, across a failed
checkpoint (the stores are ahead of the restored checkpoint and must be rebuilt), and across a restore with
another parallelism (new key-group ranges built from the overlapping old chains; the old ranges' store directories
are collected). A window (sliding, final emission) and a ``process`` operator with a TTL equal the heap backend's
too, across a rescale."""
from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.config import load_config
from pipeline.exceptions import ConfigError, InjectedFailure
from pipeline.job import Job
from pipeline.runtime.driver.runner import JobRunner
from pipeline.state.keyed_store import StoreLocation, store_root

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from tagged_jobs import SIGHTINGS, checkpoint_state, local_runner, sightings_job, write_sightings  # noqa: E402

pytestmark = [pytest.mark.spark]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> str:
    return write_sightings(tmp_path_factory.mktemp("rdbsrc"))


def _runner(tmp: Path, source: str, name: str, job: Job | None = None, **kw) -> JobRunner:
    return local_runner(job or sightings_job(), tmp, source, name, **kw)


def _output(r: JobRunner, to: Path, table: str) -> list[tuple]:
    r.export(table, str(to))
    t = pq.read_table(to)
    return sorted(tuple(str(v) for v in row.values()) for row in t.select(sorted(t.column_names)).to_pylist())


def _store_dir(job_root: str, uid: str) -> str:
    return StoreLocation(job_root, uid, "x", 0, 0).path("/").split("/")[1]


def test_rocksdb_join_equals_heap_across_a_failed_checkpoint_and_a_rescale(tmp_path, source, monkeypatch):
    # the stores live where the executors' PIPELINE_STATE_STORE_DIR says; the Python workers of a Spark session
    # that earlier tests started keep the environment they started with, so the test does not change it (it
    # would reach the driver only) and looks for its job's stores under that root instead
    heap = _runner(tmp_path, source, "heap", state_backend="heap")  # the reference (rocksdb is the default)
    heap.run()
    heap_md = heap.coordinator.store.latest().metadata
    expected = checkpoint_state(heap_md)
    assert {k for k, v in expected.items() if v} == {"st_join/left", "st_join/right", "first_sighting/keys",
                                                      "per_tag/agg"}

    rdb = _runner(tmp_path, source, "rdb", state_backend="rocksdb", state_max_delta_ratio=5.0)
    rdb.run(1)
    # epoch 2's round writes the stores and its snapshot files, then its checkpoint fails: the stores are now
    # ahead of the latest completed checkpoint (epoch 1) and the next round must rebuild them from its chains
    monkeypatch.setenv("EPOCHAL_FAIL_AT", "after_state_before_metadata")
    with pytest.raises(InjectedFailure):
        rdb.run(1)
    monkeypatch.delenv("EPOCHAL_FAIL_AT")
    rdb = _runner(tmp_path, source, "rdb", state_backend="rocksdb", state_max_delta_ratio=5.0)
    rdb.run(1)  # epoch 2: the stores rebuilt from epoch 1's chains; a delta on them
    md = rdb.coordinator.store.latest().metadata
    assert any(h.deltas for h in md.state_handles() if h.file), "the rocksdb backend wrote no delta"
    # restore the latest checkpoint with parallelism 3 (new key-group ranges) and run to the end
    rdb.restore(str(md.checkpoint_id), parallelism=3, validate=False)
    rdb.run(parallelism=3)
    root = Path(store_root())
    ranges = {f"{uid}/{name}": {p.name for p in root.glob(f"{_store_dir(rdb.ctx.job_root, uid)}/{name}/kg-*")}
              for uid, name in (("st_join", "left"), ("st_join", "right"), ("first_sighting", "keys"),
                                ("per_tag", "agg"))}
    assert all(ranges.values()), ranges  # the state lived in the keyed stores
    assert ranges["st_join/left"] >= {"kg-00000-00005", "kg-00006-00010"}, ranges  # parallelism 3 after 2
    assert not ranges["st_join/left"] & {"kg-00000-00007", "kg-00008-00015"}, ranges  # 2's collected
    got_md = rdb.coordinator.store.latest().metadata
    assert got_md.epoch == heap_md.epoch
    assert checkpoint_state(got_md) == expected
    for table in ("sighting_tags", "tag_totals"):
        assert _output(rdb, tmp_path / f"o-rdb-{table}", table) == _output(heap, tmp_path / f"o-heap-{table}", table)


def test_rocksdb_window_and_process_equal_heap_across_a_rescale(tmp_path, source):
    import pyarrow.compute as pc

    running = pa.schema([("tag", pa.string()), ("n", pa.int64())])

    def count_per_tag(rows: pa.Table, state: pa.Table) -> tuple[pa.Table, pa.Table]:
        g = rows.group_by("tag").aggregate([("sid", "count")]).join(state, "tag", join_type="left outer")
        new = pa.table({"tag": g["tag"], "n": pc.add(g["sid_count"], pc.fill_null(g["n"], 0)).cast(pa.int64())},
                       schema=running)
        return new, new

    def job() -> Job:
        j = Job("sightings_windows", max_parallelism=16)
        s = j.source("sightings", SIGHTINGS, key="tag")
        s.window(uid="per_half_minute", key="tag", event_time="_ingest_ts", size_seconds=60, slide_seconds=30,
                 aggs={"n": ("count", None)}).sink("windows")
        s.process(uid="running", key="tag", fn=count_per_tag, state_schema=running, output_schema=running,
                  ttl_seconds=90).sink("running", mode="upsert", key=("tag",))
        return j

    heap = _runner(tmp_path, source, "wheap", job(), state_backend="heap")
    heap.run()
    expected = checkpoint_state(heap.coordinator.store.latest().metadata)
    assert expected.get("per_half_minute/win") and expected.get("running/proc"), expected.keys()
    rdb = _runner(tmp_path, source, "wrdb", job(), state_backend="rocksdb", state_max_delta_ratio=5.0)
    rdb.run(2)
    md = rdb.coordinator.store.latest().metadata
    rdb.restore(str(md.checkpoint_id), parallelism=3, validate=False)
    rdb.run(parallelism=3)
    assert checkpoint_state(rdb.coordinator.store.latest().metadata) == expected
    for table in ("windows", "running"):
        assert _output(rdb, tmp_path / f"o-rdb-{table}", table) == _output(heap, tmp_path / f"o-heap-{table}", table)
    root = Path(store_root())
    ranges = {p.name for p in root.glob(f"{_store_dir(rdb.ctx.job_root, 'running')}/proc/kg-*")}
    assert ranges == {"kg-00000-00005", "kg-00006-00010", "kg-00011-00015"}, ranges  # parallelism 2's are gone


def test_unknown_backend_is_refused_at_config_load():
    with pytest.raises(ConfigError, match="PIPELINE_STATE_BACKEND='memory'"):
        load_config(env={"PIPELINE_STATE_BACKEND": "memory"})
