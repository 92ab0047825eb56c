"""Issue 34, item 7: one epoch is processed once - a scheduled run never overtakes a queued run of a backfill.

Seen with a real scheduler: a backfill's next run was queued (Airflow runs backfill runs outside the DAG's
``max_active_runs``), the scheduled run of a later interval triggered, caught up over the backfill's epoch and its
own (two epochs), and the backfill run then rewound and processed the epoch again: one epoch three times.

The rule (:func:`~pipeline.orchestration.epoch_runs.wait_reason`) and the real epoch DAG's ``trigger`` sensor
(loaded from ``dags/``) with its Airflow context; the task-instance handle is a double that answers Airflow's
look-ups (previous DAG run by state, counts). The sensor must wait (and say for which run) without touching the
job; with the backfill run finished it would go on.
"""
from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from af_helpers import REPO, load_dag_module

from pipeline.orchestration.epoch_runs import wait_reason

E = 60
T0 = datetime(2026, 1, 1, tzinfo=UTC)
GO = dict(previous_state="success", previous_run_type="scheduled", this_run_type="scheduled",
          active_process_tasks=0, active_operations=0)


@pytest.mark.unit
def test_no_run_overtakes_a_queued_backfill_run():
    # the previous interval's run is a queued backfill run: a scheduled or manual run waits for it, too
    for this in ("scheduled", "manual", "backfill"):
        why = wait_reason(**{**GO, "this_run_type": this, "previous_state": "queued", "previous_run_type": "backfill"})
        assert why and "backfill" in why, (this, why)
    # a backfill run of an earlier (not the previous) interval is queued or running
    for state in ("queued", "running"):
        why = wait_reason(**GO, earlier_backfill_run=("backfill__2026-01-01T00:03:00+00:00", state))
        assert why and "backfill__2026-01-01T00:03:00+00:00" in why and state in why and "overtakes" in why, why
    # unchanged: a queued scheduled/manual previous run (it waits for this one's slot) is no reason
    assert wait_reason(**{**GO, "previous_state": "queued", "previous_run_type": "manual"}) is None
    assert wait_reason(**GO, earlier_backfill_run=None) is None


class Airflow:
    """The ``ti`` handle of a scheduled run of interval 5 while a backfill's run of interval 3 is queued."""

    def __init__(self, backfill_state: str | None) -> None:
        self.try_number = 1
        self.backfill_state = backfill_state
        self.prev = SimpleNamespace(run_id="scheduled__4", run_type="scheduled", state="success")
        self.backfill = SimpleNamespace(run_id="backfill__2026-01-01T00:04:00+00:00", run_type="backfill",
                                        state=backfill_state)

    def get_previous_dagrun(self, state=None):
        if state is None:
            return self.prev
        return self.backfill if state == self.backfill_state else None

    def get_ti_count(self, **_):
        return 0

    def get_dr_count(self, **_):
        return 0


@pytest.mark.airflow
def test_the_epoch_dags_trigger_waits_for_an_earlier_queued_backfill_run(airflow_home, tmp_path, monkeypatch, caplog,
                                                                        capfd):
    for k, v in {"PIPELINE_SOURCE_URI": (tmp_path / "src").as_uri(),
                 "PIPELINE_CHECKPOINT_URI": (tmp_path / "ckpt").as_uri(),
                 "PIPELINE_SINK_URI": (tmp_path / "sink").as_uri(), "PIPELINE_EPOCH_SECONDS": str(E),
                 "EPOCHAL_POKE_SECONDS": "0", "EPOCHAL_TRIGGER_WAIT_SECONDS": "0"}.items():
        monkeypatch.setenv(k, v)
    dag = load_dag_module(REPO / "dags" / "orders_payments_epochs.py").dag
    trigger = dag.get_task("trigger").python_callable
    dr = SimpleNamespace(dag_id=dag.dag_id, run_id="scheduled__5", run_type="scheduled", clear_number=0,
                         logical_date=T0 + timedelta(seconds=5 * E), data_interval_end=T0 + timedelta(seconds=6 * E))
    caplog.set_level(logging.INFO, logger="epochal.airflow")
    for state in ("queued", "running"):
        caplog.clear()
        capfd.readouterr()
        res = trigger(ti=Airflow(state), dag_run=dr, params={})
        assert res.is_done is False
        said = caplog.text + "".join(capfd.readouterr())  # Airflow may route the logger through structlog
        assert f"backfill run backfill__2026-01-01T00:04:00+00:00 of an earlier interval is {state}" in said, said
        assert "never overtakes a backfill" in said, said
    assert not (tmp_path / "ckpt").exists(), "a waiting trigger does not touch the job"
