"""The fused epoch DAG (``trigger >> epoch``: process + commit + validate in one task), with ``dag.test()``, a real
local Spark and a job of the tests' own making (:mod:`pipeline.testing.shipping`, not the demo) on ``file://``.

1. three intervals: one checkpoint per epoch, in order; the ``epoch`` task emits one event per sink Asset naming
   its checkpoint; the committed tables equal the pandas oracle;
2. the ``epoch`` task fails after it completed its checkpoint (Airflow retry): the retry processes nothing again
   (the trigger's XCom names the head it saw) and still commits and validates; exactly once.
"""
from __future__ import annotations

import json
from datetime import timedelta

import pandas as pd
import pytest
from af_helpers import REPO, load_dag_module
from test_epoch_dags import run_dag

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]

JOB = "pipeline.testing.shipping:build_job"


@pytest.fixture(scope="module")
def fused(airflow_home, tmp_path_factory):
    from pipeline.testing.shipping import EPOCH_S, T0, write_sources
    root = tmp_path_factory.mktemp("fused")
    write_sources(root / "src", epochs=4)
    mp = pytest.MonkeyPatch()
    for k, v in {"PIPELINE_SOURCE_URI": (root / "src").as_uri(), "PIPELINE_CHECKPOINT_URI": (root / "ckpt").as_uri(),
                 "PIPELINE_SINK_URI": (root / "sink").as_uri(), "PIPELINE_EPOCH_SECONDS": str(EPOCH_S),
                 "PIPELINE_PARALLELISM": "2", "PIPELINE_RETAINED_CHECKPOINTS": "10",
                 "EPOCHAL_POKE_SECONDS": "1", "EPOCHAL_DAG_RETRY_DELAY_SECONDS": "0"}.items():
        mp.setenv(k, v)
    for k in ("EPOCHAL_AWS_CONN_ID", "EPOCHAL_FUSED_EPOCH", "PIPELINE_SPARK_MASTER"):
        mp.delenv(k, raising=False)
    # dag.test() runs DAGs of a bundle: a thin DAG file of the test's own, in a DAG folder of its own
    dags = root / "dags"
    dags.mkdir()
    (dags / "fused_shipping.py").write_text(
        "from airflow.sdk import DAG\n\nfrom pipeline.orchestration import build_epoch_dag\n\n"
        f"dag: DAG = build_epoch_dag({JOB!r}, start_date={T0.isoformat()!r}, fused=True)\n")
    local = "airflow.dag_processing.bundles.local.LocalDagBundle"
    mp.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps([
        {"name": "dags-folder", "classpath": local, "kwargs": {"path": str(REPO / "dags")}},
        {"name": "epochal-test-fused", "classpath": local, "kwargs": {"path": str(dags)}}]))
    dag = load_dag_module(dags / "fused_shipping.py").dag
    yield dag, root
    import logging

    from pipeline.runtime.spark.session import stop_spark
    stop_spark()
    logging.getLogger("py4j").setLevel(logging.WARNING)
    mp.undo()


def _end_of(k: int):
    from pipeline.testing.shipping import EPOCH_S, T0
    return T0.to_pydatetime() + timedelta(seconds=EPOCH_S * (k + 1))


def _store(root):
    from pipeline.checkpoint.store import CompletedCheckpointStore
    from pipeline.fileio import file_io_for, join_uri
    uri = (root / "ckpt").as_uri()
    return CompletedCheckpointStore(file_io_for(uri), join_uri(uri, "shipping"), job="shipping")


def _assert_matches_oracle(root, upto_epoch: int) -> None:
    from pipeline.fileio import file_io_for
    from pipeline.sink.table import CommittedTable
    from pipeline.testing.shipping import oracle
    exp_j, exp_t = oracle(root / "src", upto_epoch)
    sink = (root / "sink").as_uri()
    fio = file_io_for(sink)
    got_j = CommittedTable(fio, sink, "shipping", "delivered").read().to_pandas()[["ship_id", "carrier", "weight"]]
    got_t = CommittedTable(fio, sink, "shipping", "carrier_totals").read().to_pandas()[["carrier", "n", "kg"]]
    pd.testing.assert_frame_equal(got_j.sort_values("ship_id").reset_index(drop=True), exp_j, check_dtype=False)
    pd.testing.assert_frame_equal(got_t.sort_values("carrier").reset_index(drop=True), exp_t, check_dtype=False)


def test_fused_dag_one_checkpoint_per_interval_and_assets(fused):
    from pipeline.testing.shipping import EPOCH_S, T0
    dag, root = fused
    assert sorted(dag.task_ids) == ["epoch", "trigger"]
    assert {a.name for a in dag.get_task("epoch").outlets} == {"epochal/shipping/delivered",
                                                               "epochal/shipping/carrier_totals"}
    first = int(T0.timestamp()) // EPOCH_S
    for k in range(3):
        dr, tis = run_dag(dag, _end_of(k))
        assert {t: s for t, (s, _, _) in tis.items()} == {"trigger": "success", "epoch": "success"}, tis
        out = tis["epoch"][2]["return_value"]
        assert out["process"]["epoch"] == first + k and out["process"]["epochs"] == [first + k]
        assert out["commit"]["checkpoint_id"] == out["process"]["checkpoint_id"]
        assert {t["result"] for t in out["commit"]["tables"].values()} == {"committed by this task's process step"}
        assert out["validate"]["success"] is True and out["validate"]["checkpoint_id"] == out["process"]["checkpoint_id"]
        assert out["process"]["rounds_s"] > 0
        # the run says whether the job keeps up: these epochs ended long ago (T0 in the past), so it is far behind
        lag = out["keepup"]
        assert lag["epoch"] == first + k and lag["behind"] is True and lag["epochs_waiting"] >= 1, lag
        assert lag["lag_s"] >= EPOCH_S and lag["excess_s"] == pytest.approx(lag["lag_s"] - EPOCH_S, abs=0.02), lag
    cps = _store(root).list()
    assert [c.epoch for c in cps] == [first, first + 1, first + 2]
    _assert_matches_oracle(root, first + 2)
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select
    with create_session() as session:
        events = session.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                                 .where(AssetModel.name == "epochal/shipping/delivered")).all()
        ids = sorted(int(dict(e.extra or {})["checkpoint_id"]) for e in events)
    assert ids == [c.checkpoint_id for c in cps]


def test_fused_epoch_retry_after_checkpoint_is_idempotent(fused, monkeypatch):
    from pipeline.testing.shipping import EPOCH_S, T0
    dag, root = fused
    first = int(T0.timestamp()) // EPOCH_S
    before = _store(root).ids()
    monkeypatch.setenv("EPOCHAL_AIRFLOW_FAIL_ONCE", "process:after_process")
    dr, tis = run_dag(dag, _end_of(3))
    state, tries, xcoms = tis["epoch"]
    assert state == "success" and tries == 2, tis["epoch"]
    out = xcoms["return_value"]
    assert out["process"]["skipped"] is True and out["validate"]["success"] is True
    # the retry did not complete the checkpoint itself: it re-commits (idempotent: already committed)
    assert {t["result"] for t in out["commit"]["tables"].values()} == {"already committed"}
    new = [i for i in _store(root).ids() if i not in before]
    assert len(new) == 1 and _store(root).get(new[0]).epoch == first + 3, new
    _assert_matches_oracle(root, first + 3)
