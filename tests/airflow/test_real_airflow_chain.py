"""The two-job chain in a real Airflow (``scripts/airflow_standalone.sh``: moto S3, the demo data, ``airflow
standalone``): ``epochal_orders_payments`` (job A) commits its Delta table ``paid_orders``; ``epochal_customer_spend``
(job B, dags/customer_spend_epochs.py) reads that table as a lake source and is scheduled on its Asset.

Both DAGs are turned on; the scheduler catches A up over the demo's epochs (one-minute epochs), each of A's commits
emits the Asset event that creates a run of B (``asset_triggered``), and B's runs process every ready epoch. Once A's
runs are done, B's committed totals must equal the group-by of A's committed table (read with ``deltalake``, no
Epochal code), every B run must be asset-triggered and none may have rewound.

Opt-in (``EPOCHAL_AIRFLOW_CHAIN=1``): about 5 minutes on the shared 2-core machine.
"""
from __future__ import annotations

import os
import time

import pandas as pd
import pytest
from af_helpers import free_port
from test_real_airflow import _instance

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.e2e, pytest.mark.spark, pytest.mark.s3,
              pytest.mark.skipif(os.environ.get("EPOCHAL_AIRFLOW_CHAIN") != "1",
                                 reason="opt-in (about 5 min): EPOCHAL_AIRFLOW_CHAIN=1")]

A, B = "epochal_orders_payments", "epochal_customer_spend"
E = 60


@pytest.fixture(scope="module")
def chain(airflow_db_template, tmp_path_factory):
    yield from _instance(airflow_db_template, tmp_path_factory, logs="real_airflow_chain_logs", extra_env={
        "PIPELINE_EPOCH_SECONDS": str(E), "EPOCHAL_DEMO_EPOCHS": "2", "EPOCHAL_START_DATE": "",
        "EPOCHAL_END_DATE": "", "PIPELINE_ALLOWED_LATENESS_SECONDS": "5",
        # the defaults of scripts/airflow_standalone.sh (the fused epoch task on a shared Spark Connect session)
        "EPOCHAL_FUSED_EPOCH": "true", "EPOCHAL_SPARK_CONNECT": "1", "EPOCHAL_CONNECT_PORT": str(free_port()),
        "EPOCHAL_CONNECT_MASTER": "local[2]"})


def _table(inst, path: str) -> pd.DataFrame:
    from deltalake import DeltaTable
    opts = {"AWS_ENDPOINT_URL": inst.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}
    return DeltaTable(f"s3://epochal/demo/sinks/{path}", storage_options=opts).to_pandas()


def _expected(inst) -> pd.DataFrame:
    paid = _table(inst, "orders_payments/paid_orders")
    exp = paid.groupby("customer_id").agg(orders=("order_id", "count"), spent=("paid_amount", "sum"))
    return exp.reset_index().sort_values("customer_id").reset_index(drop=True)


def _got(inst) -> pd.DataFrame | None:
    try:
        got = _table(inst, "customer_spend/customer_spend")
    except Exception:  # noqa: BLE001 - not created yet
        return None
    return got[["customer_id", "orders", "spent"]].sort_values("customer_id").reset_index(drop=True)


def _same(got: pd.DataFrame, exp: pd.DataFrame) -> bool:
    return (got["customer_id"].tolist() == exp["customer_id"].tolist()
            and got["orders"].astype(int).tolist() == exp["orders"].astype(int).tolist()
            and bool(((got["spent"] - exp["spent"]).abs() < 1e-6).all()))


def test_b_runs_on_a_commits_and_equals_the_batch_meaning_of_a_table(chain):
    inst = chain
    inst.ok("PATCH", f"/api/v2/dags/{B}", {"is_paused": False})
    inst.ok("PATCH", f"/api/v2/dags/{A}", {"is_paused": False})
    inst.wait_runs(A, lambda rs: sum(r["state"] == "success" for r in rs) >= 2, 900, "A's catch-up runs")
    # the demo data is in; stop A's schedule so that its commits (and B's runs) come to an end
    inst.ok("PATCH", f"/api/v2/dags/{A}", {"is_paused": True})
    deadline = time.monotonic() + 600
    while True:   # the condition: B's committed totals equal the group-by of A's committed table
        runs_b = inst.runs(B)
        assert not [r for r in runs_b if r["state"] == "failed"], inst.diagnose(B, runs_b[-1]["dag_run_id"])
        # B's runs not done (A is paused: its queued or waiting runs do not go on, so no new commit comes)
        active = [r for r in runs_b if r["state"] in ("queued", "running")]
        got, exp = _got(inst), _expected(inst)
        if got is not None and not active and _same(got, exp):
            break
        assert time.monotonic() < deadline, (f"B never caught up with A: runs {[(r['run_type'], r['state']) for r in runs_b]}"
                                             f"\ngot\n{got}\nexpected\n{exp}")
        time.sleep(5)
    assert runs_b and {r["run_type"] for r in runs_b} == {"asset_triggered"}, runs_b
    actions = [inst.xcom(B, r["dag_run_id"], "trigger")["action"] for r in runs_b if r["state"] == "success"]
    assert "rewind" not in actions, actions
    assert len(exp) > 10
