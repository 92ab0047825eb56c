"""Issue 34, item 8: savepoint and restore params are checked before the guard sensor waits for running epochs,
and the wait logs what it waits for.

The sensor ``wait_for_epoch_runs`` of the real savepoint/restore DAGs (loaded from ``dags/``) is called with its
Airflow context; the task-instance handle is a double that answers Airflow's counts (an epoch run's ``process``
task is active, so the job is busy) and records whether it was asked. A bad param must fail the sensor at once
with ``AirflowFailException`` (no retry), without asking whether the job is busy; before the fix the sensor
waited for the epoch first and only the ``savepoint``/``restore`` task checked the params, up to an hour later.
"""
from __future__ import annotations

import logging

import pytest
from af_helpers import REPO, load_dag_module

pytestmark = [pytest.mark.airflow]


EPOCH_DAG = "epochal_orders_payments"


class BusyJob:
    """The ``ti`` handle's count queries: one active ``process`` task of the epoch DAG while ``busy``."""

    def __init__(self, busy: bool = True) -> None:
        self.busy = busy
        self.asked = 0

    def get_dr_count(self, dag_id, states=None, **_):
        self.asked += 1
        return 1 if self.busy and dag_id == EPOCH_DAG and "running" in (states or []) else 0

    def get_ti_count(self, dag_id, task_ids=None, states=None, **_):
        self.asked += 1
        if self.busy and dag_id == EPOCH_DAG and "process" in (task_ids or []):
            return 1
        return 0


@pytest.fixture
def dags(airflow_home, tmp_path, monkeypatch):
    ck = tmp_path / "ckpt"
    for k, v in {"PIPELINE_SOURCE_URI": (tmp_path / "src").as_uri(), "PIPELINE_CHECKPOINT_URI": ck.as_uri(),
                 "PIPELINE_SINK_URI": (tmp_path / "sink").as_uri(), "EPOCHAL_POKE_SECONDS": "0",
                 "EPOCHAL_TRIGGER_WAIT_SECONDS": "0"}.items():
        monkeypatch.setenv(k, v)
    sp = ck / "orders_payments" / "savepoints"
    sp.mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (sp / "escape").symlink_to(tmp_path / "outside", target_is_directory=True)
    return {name: load_dag_module(REPO / "dags" / f"orders_payments_{name}.py").dag
            for name in ("savepoint", "restore")}


def _sensor(dag):
    return dag.get_task("wait_for_epoch_runs").python_callable


@pytest.mark.parametrize("which,params,message", [
    ("savepoint", {"target": "/data/sp"}, "file:///data/sp"),
    ("savepoint", {"target": "file:///elsewhere/sp"}, "outside the allowed savepoint prefixes"),
    ("savepoint", {"target": "@CK@/orders_payments/savepoints/escape/sp1"}, "symlinks"),
    ("restore", {"from": "0"}, "checkpoint ids start at 1"),
    ("restore", {"from": "s3a://bucket/sp"}, "s3://"),
    ("restore", {"from": "12", "parallelism": 0}, "parallelism"),
])
def test_bad_params_fail_the_guard_sensor_before_it_waits(dags, tmp_path, caplog, which, params, message):
    from airflow.sdk.exceptions import AirflowFailException
    params = {k: (v.replace("@CK@", (tmp_path / "ckpt").as_uri()) if isinstance(v, str) else v)
              for k, v in params.items()}
    ti = BusyJob()
    caplog.set_level(logging.INFO, logger="epochal.airflow")
    with pytest.raises(AirflowFailException, match=message):
        _sensor(dags[which])(ti=ti, params=params)
    assert ti.asked == 0, "the params are checked before asking whether the job is busy"
    assert "waits before touching the job" not in caplog.text
    assert not list((tmp_path / "outside").iterdir())


@pytest.mark.parametrize("which,params", [("savepoint", {"target": None}),
                                          ("savepoint", {"target": "@CK@/orders_payments/savepoints/sp1"}),
                                          ("restore", {"from": "12", "parallelism": 2})])
def test_good_params_wait_and_say_for_what(dags, tmp_path, caplog, which, params):
    params = {k: (v.replace("@CK@", (tmp_path / "ckpt").as_uri()) if isinstance(v, str) else v)
              for k, v in params.items()}
    caplog.set_level(logging.INFO, logger="epochal.airflow")
    busy = BusyJob()
    res = _sensor(dags[which])(ti=busy, params=params)
    assert res.is_done is False and busy.asked > 0
    line = next(r.getMessage() for r in caplog.records if "waits before touching the job" in r.getMessage())
    assert f"{which} of job orders_payments" in line and "process/commit/validate/epoch task(s)" in line, line
    assert "checking again every" in line, line
    assert _sensor(dags[which])(ti=BusyJob(busy=False), params=params).is_done is True
