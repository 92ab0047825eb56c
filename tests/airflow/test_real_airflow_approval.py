"""Optional human approval before a restore (Airflow's ApprovalOperator), with the real scheduler and triggerer:
``airflow_standalone.sh`` started with ``EPOCHAL_APPROVE_RESTORE=true``; answers through the REST API."""
from __future__ import annotations

import os
import time
import urllib.request

import pytest
from test_real_airflow import DAG, _instance, _store

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.e2e, pytest.mark.spark, pytest.mark.s3,
              # opt-in (a second real Airflow instance, ~2 min): EPOCHAL_AIRFLOW_HITL=1 runs it
              pytest.mark.skipif(os.environ.get("EPOCHAL_AIRFLOW_HITL") != "1",
                                 reason="opt-in: EPOCHAL_AIRFLOW_HITL=1 (human-approval flow, real scheduler)")]


@pytest.fixture(scope="module")
def airflow_approval(airflow_db_template, tmp_path_factory):
    """An instance whose restore DAG asks for human approval (EPOCHAL_APPROVE_RESTORE=true)."""
    yield from _instance(airflow_db_template, tmp_path_factory, {"EPOCHAL_APPROVE_RESTORE": "true"},
                         logs="real_airflow_approval_logs")


def test_real_scheduler_restore_waits_for_human_approval(airflow_approval):
    """EPOCHAL_APPROVE_RESTORE=true: a restore waits for Airflow's approval; Reject leaves the job untouched,
    Approve restores (and validates)."""
    inst = airflow_approval
    for dag_id in (DAG, f"{DAG}_restore"):
        inst.ok("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    inst.wait_runs(DAG, lambda rs: len(rs) == 2 and all(r["state"] == "success" for r in rs), 1200, "normal runs")
    first = _store(inst).list()[0]

    def ask(expect_task: str = "approve_restore") -> str:
        run = inst.ok("POST", f"/api/v2/dags/{DAG}_restore/dagRuns",
                      {"logical_date": None, "conf": {"from": str(first.checkpoint_id), "parallelism": None}})
        rid = urllib.request.quote(run["dag_run_id"], safe="")
        deadline = time.monotonic() + 300
        # Airflow 3.3: a HITL task waits in state awaiting_input (deferred in older versions)
        while inst.tis(f"{DAG}_restore", run["dag_run_id"])[expect_task]["state"] not in ("awaiting_input", "deferred"):
            assert time.monotonic() < deadline, inst.tis(f"{DAG}_restore", run["dag_run_id"])
            time.sleep(2)
        detail = inst.ok("GET", f"/api/v2/dags/{DAG}_restore/dagRuns/{rid}/taskInstances/{expect_task}/-1/hitlDetails")
        assert detail["options"] == ["Approve", "Reject"] and "Restore Epochal job orders_payments" in detail["subject"]
        assert inst.tis(f"{DAG}_restore", run["dag_run_id"])["restore"]["state"] in (None, "none")
        # Airflow 3.3 race: an answer given before the scheduler has processed the executor's event of the
        # pausing try (the task process exits "success" while the TI waits for input) fails the task
        # ("finished with state success, but the task instance's state attribute is queued"). A person never
        # answers that fast; the API can. Wait for the scheduler to record the pause before answering.
        paused = (f"TaskInstance Finished: dag_id={DAG}_restore, task_id={expect_task}, "
                  f"run_id={run['dag_run_id']}, ")
        log = inst.home / "epochal-standalone" / "standalone.log"
        while not any(paused in line and "state=awaiting_input" in line
                      for line in log.read_text(errors="replace").splitlines()):
            assert time.monotonic() < deadline, f"the scheduler never recorded the pause of {expect_task}"
            time.sleep(1)
        return run["dag_run_id"]

    head = _store(inst).latest().checkpoint_id
    rid = ask()
    inst.ok("PATCH", f"/api/v2/dags/{DAG}_restore/dagRuns/{urllib.request.quote(rid, safe='')}/taskInstances/"
                     "approve_restore/-1/hitlDetails", {"chosen_options": ["Reject"]})
    inst.wait_runs(f"{DAG}_restore", lambda rs: all(r["state"] == "success" for r in rs), 300, "rejected restore")
    tis = inst.tis(f"{DAG}_restore", rid)
    assert tis["restore"]["state"] == "skipped" and tis["validate"]["state"] == "skipped", tis
    assert _store(inst).latest().checkpoint_id == head, "a rejected restore must not touch the job"

    rid = ask()
    inst.ok("PATCH", f"/api/v2/dags/{DAG}_restore/dagRuns/{urllib.request.quote(rid, safe='')}/taskInstances/"
                     "approve_restore/-1/hitlDetails", {"chosen_options": ["Approve"]})
    inst.wait_runs(f"{DAG}_restore", lambda rs: all(r["state"] == "success" for r in rs), 600, "approved restore")
    restored = inst.xcom(f"{DAG}_restore", rid, "restore")
    assert restored["epoch"] == first.epoch and _store(inst).latest().checkpoint_id == restored["checkpoint_id"]
    assert inst.tis(f"{DAG}_restore", rid)["validate"]["state"] == "success"
