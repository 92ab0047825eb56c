"""``dag.test()`` runs of the demo job's DAGs with a real local Spark and a real moto S3 server.

One module-scoped timeline (the tests run in file order and build on each other, like a job's life):

1. the epoch DAG over three intervals: one checkpoint per epoch, in order;
2. an Airflow retry of ``process`` after it had completed the epoch: no second checkpoint, no duplicates;
3. a re-run of a completed interval: rewinds to the checkpoint before it and processes forward again;
4. savepoint (stop-with-savepoint) -> epoch runs are skipped -> restore with parallelism 4 -> the epoch runs
   continue; then restore 4 -> 1 from a checkpoint; results identical to a run that never changed.

After every step the committed output equals the independent oracle (pyarrow over the source files up to
the head checkpoint's positions), exactly once. S3 settings come from the Airflow connection ``epochal_s3``.
"""
from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from af_helpers import REPO, committed_vs_oracle, load_dag_module

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.s3, pytest.mark.slow]

E = 60
EPOCHS = 4
START = datetime(2026, 1, 1, tzinfo=UTC)
FIRST = int(START.timestamp()) // E


def end_of(k: int) -> datetime:
    """Logical date of a manual/test run of the epoch DAG for epoch k (its data interval ends there)."""
    return START + timedelta(seconds=E * (k + 1))


class Timeline:
    def __init__(self, root: str, endpoint: str) -> None:
        self.root = root
        self.endpoint = endpoint
        self.source = f"{root}/sources"
        self.checkpoints = f"{root}/checkpoints"
        self.sinks = f"{root}/sinks"
        self.dags: dict[str, object] = {}

    def restores(self) -> list:
        """The job's restore log (every restore and rewind, newest first)."""
        from pipeline.checkpoint.restores import RestoreLog
        from pipeline.fileio import file_io_for, join_uri
        return RestoreLog(file_io_for(self.checkpoints), join_uri(self.checkpoints, "orders_payments")).list()

    def store(self):
        from pipeline.checkpoint.store import CompletedCheckpointStore
        from pipeline.fileio import file_io_for, join_uri
        return CompletedCheckpointStore(file_io_for(self.checkpoints), join_uri(self.checkpoints, "orders_payments"),
                                        job="orders_payments")

    def assert_exactly_once(self):
        report, md = committed_vs_oracle(self.source, self.sinks, self.checkpoints)
        assert report.ok, json.dumps(report.to_dict(), default=str)[:3000]
        return md


def run_dag(dag, logical_date=None, conf=None):
    """dag.test() and the resulting task instances {task_id: (state, try_number, xcom return value)}."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    kwargs = {"run_conf": conf} if conf else {}
    if logical_date is not None:
        kwargs["logical_date"] = logical_date
    dr = dag.test(**kwargs)
    out = {}
    with create_session() as session:
        for ti in dr.get_task_instances(session=session):
            rows = session.scalars(XComModel.get_many(run_id=dr.run_id, dag_ids=dag.dag_id, task_ids=ti.task_id))
            xcoms = {x.key: XComModel.deserialize_value(x) for x in rows}
            out[ti.task_id] = (str(getattr(ti.state, "value", ti.state)), ti.try_number, xcoms)
    return dr, out


@pytest.fixture(scope="module")
def tl(airflow_home, moto_server):
    from pipeline.demo.generate import generate
    moto_server.create_bucket("epochal-test")
    t = Timeline(f"s3://epochal-test/airflow-dags-{uuid.uuid4().hex[:8]}", moto_server.endpoint_url)
    mp = pytest.MonkeyPatch()
    env = {
        "PIPELINE_SOURCE_URI": t.source, "PIPELINE_CHECKPOINT_URI": t.checkpoints, "PIPELINE_SINK_URI": t.sinks,
        "PIPELINE_EPOCH_SECONDS": str(E), "PIPELINE_PARALLELISM": "2", "PIPELINE_RETAINED_CHECKPOINTS": "10",
        "EPOCHAL_POKE_SECONDS": "1", "EPOCHAL_DAG_RETRY_DELAY_SECONDS": "0",
        "EPOCHAL_FUSED_EPOCH": "false",  # the four-task shape (the opt-in); the fused default: test_fused_epoch_dag
        "AIRFLOW_CONN_EPOCHAL_S3": json.dumps({"conn_type": "aws", "login": "testing", "password": "testing",
                                               "extra": {"endpoint_url": moto_server.endpoint_url,
                                                         "region_name": "us-east-1"}}),
    }
    for k, v in env.items():
        mp.setenv(k, v)
    mp.delenv("EPOCHAL_AWS_CONN_ID", raising=False)
    generate(t.source, epochs=EPOCHS, orders_per_epoch=300, partitions=2, epoch_seconds=E, start="2026-01-01T00:00:00Z")
    for name in ("orders_payments_epochs", "orders_payments_savepoint", "orders_payments_restore"):
        t.dags[name] = load_dag_module(REPO / "dags" / f"{name}.py").dag
    yield t
    import logging

    from pipeline.runtime.spark.session import stop_spark
    stop_spark()
    logging.getLogger("py4j").setLevel(logging.WARNING)  # no "Closing down" messages at interpreter exit
    mp.undo()


def test_epoch_runs_one_checkpoint_per_interval_in_order(tl):
    dag = tl.dags["orders_payments_epochs"]
    for k in range(3):
        dr, tis = run_dag(dag, end_of(k))
        assert str(dr.state) in ("success", "DagRunState.SUCCESS"), tis
        assert {t: s for t, (s, _, _) in tis.items()} == {"trigger": "success", "process": "success",
                                                         "commit": "success", "validate": "success"}
        processed = tis["process"][2]["return_value"]
        assert processed["epoch"] == FIRST + k and processed["epochs"] == [FIRST + k]
        assert processed["action"] == ("start" if k == 0 else "continue")
        assert tis["validate"][2]["return_value"]["success"] is True
    cps = tl.store().list()
    assert [c.epoch for c in cps] == [FIRST, FIRST + 1, FIRST + 2]
    assert [c.parent_id for c in cps] == [None, cps[0].checkpoint_id, cps[1].checkpoint_id]
    md = tl.assert_exactly_once()
    assert md.epoch == FIRST + 2
    # each checkpoint names the Airflow run and task that took it (the history's link to the task log)
    from pipeline.fileio import file_io_for
    from pipeline.orchestration.history import CheckpointHistory
    taken = CheckpointHistory(file_io_for(tl.checkpoints), tl.checkpoints, "orders_payments").detail(
        cps[-1].checkpoint_id)["taken_by"]
    assert taken["airflow"]["dag_id"] == dag.dag_id and taken["airflow"]["task_id"] == "process", taken
    assert taken["airflow"]["run_id"] == dr.run_id, (taken, dr.run_id)
    # the sink tables are Airflow Assets: commit emitted one event per checkpoint, with its id and epoch
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select
    with create_session() as session:
        events = session.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                                 .where(AssetModel.name == "epochal/orders_payments/paid_orders")).all()
        extras = sorted((dict(e.extra or {}) for e in events), key=lambda x: x["checkpoint_id"])
    assert [x["checkpoint_id"] for x in extras] == [c.checkpoint_id for c in cps], extras
    # the demo's sinks are Delta tables: each event names the table version that holds its checkpoint; read
    # with delta-rs directly (not Epochal), that version holds exactly the rows committed up to the checkpoint
    from deltalake import DeltaTable
    opts = _delta_opts(tl)
    location = f"{tl.sinks}/orders_payments/paid_orders"
    assert all(x["format"] == "delta" for x in extras), extras
    versions = [int(str(x["table_version"]).split()[-1]) for x in extras]
    assert versions == sorted(set(versions)), versions  # one new table version per checkpoint
    total = 0
    for x, v in zip(extras, versions):
        total += int(x["rows_in_checkpoint"])
        assert DeltaTable(location, version=v, storage_options=opts).to_pyarrow_table().num_rows == total, (x, v)
    assert DeltaTable(location, storage_options=opts).version() == versions[-1]


def test_retry_of_process_is_idempotent(tl, monkeypatch):
    """process completes checkpoint n, then its try fails: the retry must not process again."""
    dag = tl.dags["orders_payments_epochs"]
    before = tl.store().ids()
    monkeypatch.setenv("EPOCHAL_AIRFLOW_FAIL_ONCE", "process:after_process")
    dr, tis = run_dag(dag, end_of(3))
    state, tries, xcoms = tis["process"]
    assert state == "success" and tries == 2, tis["process"]
    assert xcoms["return_value"]["skipped"] is True
    new = [i for i in tl.store().ids() if i not in before]
    assert len(new) == 1, f"exactly one new checkpoint for epoch {FIRST + 3}, got {new}"
    assert tl.store().get(new[0]).epoch == FIRST + 3
    assert tis["commit"][0] == tis["validate"][0] == "success"
    tl.assert_exactly_once()


def test_commit_is_idempotent_and_recovers_a_missing_commit(tl):
    """``commit`` = notifyCheckpointComplete: re-running it is a no-op; if the task that completed the
    checkpoint died between ``_metadata`` and the sink commit, it commits (recoverAndCommit)."""
    from pipeline.fileio import file_io_for
    from pipeline.orchestration.settings import load_pipeline_config
    from pipeline.orchestration.tasks import Orchestrator
    from pipeline.sink.table import CommittedTable
    orch = Orchestrator("orders_payments", load_pipeline_config())
    head = tl.store().latest()
    res = orch.commit(head.checkpoint_id)
    assert {t: v["result"] for t, v in res.tables.items()} == {"paid_orders": "already committed",
                                                                 "merchant_revenue": "already committed"}
    # simulate the crash: neither the lineage entry nor the Delta commit of the head checkpoint exists
    from deltalake import DeltaTable
    for table in ("paid_orders", "merchant_revenue"):
        t = CommittedTable(file_io_for(tl.sinks), tl.sinks, "orders_payments", table)
        t.fileio.delete(t.commit_uri(head.checkpoint_id))
        assert t.head().checkpoint_id < head.checkpoint_id
        log_files = sorted(f.uri for f in t.fileio.list(f"{t.table_uri}/_delta_log/") if f.uri.endswith(".json"))
        t.fileio.delete(log_files[-1])  # the newest Delta version: the head checkpoint's commit
        app = f"epochal:orders_payments:{table}"
        assert DeltaTable(t.table_uri, storage_options=_delta_opts(tl)).transaction_version(app) < head.checkpoint_id
    res = orch.commit(head.checkpoint_id)
    assert {t: v["result"] for t, v in res.tables.items()} == {"paid_orders": "committed now",
                                                                 "merchant_revenue": "committed now"}
    for table in ("paid_orders", "merchant_revenue"):
        dt = DeltaTable(f"{tl.sinks}/orders_payments/{table}", storage_options=_delta_opts(tl))
        assert dt.transaction_version(f"epochal:orders_payments:{table}") == head.checkpoint_id
    assert orch.validate(head.checkpoint_id).success  # reuses the head entries its commit just read
    # a validate task of its own reads each table's head (not the whole lineage) and checks the parent link
    assert Orchestrator("orders_payments", load_pipeline_config()).validate(head.checkpoint_id).success
    t = CommittedTable(file_io_for(tl.sinks), tl.sinks, "orders_payments", "paid_orders")
    parent = t.head().parent_id
    saved = t.fileio.read_bytes(t.commit_uri(parent))
    t.fileio.delete(t.commit_uri(parent))
    try:
        res = Orchestrator("orders_payments", load_pipeline_config()).validate(head.checkpoint_id)
    finally:
        t.fileio.write_bytes(t.commit_uri(parent), saved)
    assert not res.success and any(f"sink table paid_orders: broken lineage - commit {head.checkpoint_id} has parent "
                                   f"checkpoint {parent}" in p for p in res.problems), res.problems
    tl.assert_exactly_once()


def _delta_opts(tl) -> dict[str, str]:
    """delta-rs storage options for the test's moto server (independent of Epochal's own helper)."""
    return {"AWS_ENDPOINT_URL": tl.endpoint, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}


def test_rerun_of_completed_interval_rewinds_and_stays_exactly_once(tl):
    dag = tl.dags["orders_payments_epochs"]
    head_before = tl.store().latest()
    by_epoch = {c.epoch: c.checkpoint_id for c in tl.store().list()}
    dr, tis = run_dag(dag, end_of(1))  # interval of epoch FIRST+1 again
    p = tis["process"][2]["return_value"]
    assert p["action"] == "rewind"
    assert p["rewound_to"] == by_epoch[FIRST]           # restored the checkpoint just before the interval
    assert p["epochs"] == [FIRST + 1, FIRST + 2, FIRST + 3]  # re-processed, then forward to where it was
    assert p["forwarded_to"] == head_before.epoch
    ev = tl.restores()[0]   # recorded, and named a rewind (not a restore)
    assert (ev.kind, ev.from_id, ev.rerun_epoch) == ("rewind", by_epoch[FIRST], FIRST + 1), ev
    assert set(ev.abandoned) == {c for e, c in by_epoch.items() if e > FIRST}, ev
    head = tl.store().latest()
    assert head.epoch == head_before.epoch and head.checkpoint_id > head_before.checkpoint_id
    md = tl.assert_exactly_once()
    assert md.checkpoint_id == head.checkpoint_id
    # the sink lineage of the head is the new branch: old commits of the re-processed epochs are not visible
    from pipeline.fileio import file_io_for
    from pipeline.sink.table import CommittedTable
    chain = [e.checkpoint_id for e in CommittedTable(file_io_for(tl.sinks), tl.sinks, "orders_payments",
                                                     "paid_orders").lineage()]
    assert chain == [by_epoch[FIRST]] + p["completed"]


def test_savepoint_stop_restore_other_parallelism(tl):
    epochs_dag = tl.dags["orders_payments_epochs"]
    head = tl.store().latest()
    # stop-with-savepoint: location in XCom and logs; epoch runs are skipped afterwards
    dr, tis = run_dag(tl.dags["orders_payments_savepoint"], conf={"target": None, "stop_after_savepoint": True})
    assert tis["savepoint"][0] == "success", tis
    loc = tis["savepoint"][2]["savepoint_location"]
    res = tis["savepoint"][2]["return_value"]
    assert loc.startswith(tl.checkpoints) and "/savepoints/" in loc and res["of_checkpoint"] == head.checkpoint_id
    from pipeline.checkpoint.completed import CompletedCheckpoint
    from pipeline.fileio import file_io_for
    sp = CompletedCheckpoint.load(file_io_for(loc), loc)
    assert sp.metadata.kind == "savepoint" and sp.metadata.epoch == head.epoch
    state_files = [h.file.uri for h in sp.metadata.state_handles() if h.file is not None]
    assert state_files and all(u.startswith(loc + "/") for u in state_files), "a savepoint is self-contained"
    dr, tis = run_dag(epochs_dag, end_of(3))
    assert tis["trigger"][0] == "skipped" and tis["process"][0] == "skipped", tis

    # restore from the savepoint with another parallelism (2 -> 4); validation runs after it
    dr, tis = run_dag(tl.dags["orders_payments_restore"], conf={"from": loc, "parallelism": 4,
                                                                 "allow_non_restored_state": False})
    assert {t: s for t, (s, _, _) in tis.items()} == {"wait_for_epoch_runs": "success", "restore": "success",
                                                     "validate": "success"}, tis
    restored = tis["restore"][2]["return_value"]
    assert restored["parallelism"] == 4 and restored["epoch"] == head.epoch
    ev = tl.restores()[0]
    assert (ev.kind, ev.from_kind, ev.from_location, ev.checkpoint_id, ev.parallelism) == (
        "restore", "savepoint", loc, restored["checkpoint_id"], 4), ev
    assert tis["validate"][2]["return_value"]["success"] is True
    rmd = tl.store().get(restored["checkpoint_id"]).metadata
    assert rmd.parallelism == 4 and rmd.max_parallelism == head.metadata.max_parallelism
    tl.assert_exactly_once()
    # NO_CLAIM: the savepoint is untouched by later checkpoints
    sp_files = {f.uri: f.sha256 for f in sp.metadata.referenced_files()}

    # epoch runs continue at parallelism 4 (a re-run of the last interval: rewinds across the restore)
    dr, tis = run_dag(epochs_dag, end_of(3))
    assert tis["process"][0] == "success", tis
    assert tl.store().latest().metadata.parallelism == 4
    tl.assert_exactly_once()

    # and back down 4 -> 1 from a checkpoint id
    cid = tl.store().latest().checkpoint_id
    dr, tis = run_dag(tl.dags["orders_payments_restore"], conf={"from": str(cid), "parallelism": 1})
    assert tis["validate"][0] == "success", tis
    assert tl.store().latest().metadata.parallelism == 1
    tl.assert_exactly_once()
    for uri in sp_files:
        fio = file_io_for(uri)
        assert fio.exists(uri), f"savepoint file {uri} was deleted"
    assert CompletedCheckpoint.load(file_io_for(loc), loc).metadata.to_json() == sp.metadata.to_json()


def test_restore_refuses_a_savepoint_with_unknown_operators(tl):
    """A savepoint with state for operators the job does not have: the restore fails naming the uids,
    unless allow_non_restored_state is set."""
    from pipeline.checkpoint.completed import CompletedCheckpoint
    from pipeline.fileio import file_io_for, join_uri
    sp_loc = next(r.location for r in _history(tl).savepoints())
    fio = file_io_for(sp_loc)
    doc = json.loads(fio.read_bytes(join_uri(sp_loc, "_metadata")))
    uid = next(iter(doc["operators"]))
    doc["operators"]["retired_operator_uid"] = [dict(h, operator_uid="retired_operator_uid")
                                                for h in doc["operators"][uid]]
    bad = f"{tl.root}/foreign-savepoints/sp-bad"
    for f in fio.list(sp_loc):  # the same files, under a new savepoint directory (written directly)
        if not f.uri.endswith("/_metadata"):
            fio.write_bytes(bad + f.uri[len(sp_loc):], fio.read_bytes(f.uri))
    text = json.dumps(doc).replace(sp_loc, bad)
    fio.write_bytes(join_uri(bad, "_metadata"), text.encode())
    CompletedCheckpoint.load(fio, bad)  # still a readable savepoint
    restore = tl.dags["orders_payments_restore"]
    dr, tis = run_dag(restore, conf={"from": bad, "parallelism": None, "allow_non_restored_state": False})
    assert tis["restore"][0] == "failed" and tis["validate"][0] == "upstream_failed", tis
    log = _task_log(restore.dag_id, dr.run_id, "restore")
    assert log is None or "retired_operator_uid" in log
    dr, tis = run_dag(restore, conf={"from": bad, "parallelism": None, "allow_non_restored_state": True})
    assert tis["restore"][0] == "success" and tis["validate"][0] == "success", tis
    assert tis["restore"][2]["return_value"]["dropped_operators"] == ["retired_operator_uid"]
    tl.assert_exactly_once()


def _history(tl):
    from pipeline.fileio import file_io_for
    from pipeline.orchestration.history import CheckpointHistory
    return CheckpointHistory(file_io_for(tl.checkpoints), tl.checkpoints, "orders_payments")


def _task_log(dag_id: str, run_id: str, task_id: str) -> str | None:
    import os
    from pathlib import Path
    base = Path(os.environ["AIRFLOW_HOME"]) / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    logs = sorted(base.glob("*.log")) if base.exists() else []
    return "".join(p.read_text() for p in logs) if logs else None



def _claimed(tl) -> int:
    from pipeline.checkpoint.ids import CheckpointIdCounter
    from pipeline.fileio import file_io_for, join_uri
    return CheckpointIdCounter(file_io_for(tl.checkpoints), join_uri(tl.checkpoints, "orders_payments")).latest_claimed()


def _control(tl) -> bytes | None:
    from pipeline.fileio import file_io_for, join_uri
    uri = join_uri(tl.checkpoints, "orders_payments", "orchestration", "control.json")
    fio = file_io_for(uri)
    return fio.read_bytes(uri) if fio.exists(uri) else None


@pytest.mark.parametrize("conf,message", [
    ({"from": "/data/sp"}, "expected a file:///absolute/path or s3://bucket/prefix URI"),
    ({"from": "999999"}, "no such checkpoint"),
    ({"from": "s3a://bucket/sp"}, "use s3://"),
])
def test_restore_user_error_fails_once_before_any_side_effect(tl, conf, message):
    """A user error fails the task once (no retry although retries=2), claims no checkpoint id and writes nothing."""
    claimed, control, head = _claimed(tl), _control(tl), tl.store().latest().checkpoint_id
    restore = tl.dags["orders_payments_restore"]
    assert restore.get_task("restore").retries >= 1
    dr, tis = run_dag(restore, conf={"parallelism": None, **conf})
    # the guard sensor checks the parameters before it waits (issue 34 item 8); what only the task can check
    # (the checkpoint exists) fails the task
    failed = [t for t, v in tis.items() if v[0] == "failed"]
    assert len(failed) == 1 and tis[failed[0]][1] == 1, tis
    assert failed[0] in ("wait_for_epoch_runs", "restore"), tis
    if failed[0] != "restore":
        assert tis["restore"][0] == "upstream_failed", tis
    log = _task_log(restore.dag_id, dr.run_id, failed[0])
    assert log is None or message in log, log
    assert (_claimed(tl), _control(tl), tl.store().latest().checkpoint_id) == (claimed, control, head)


def test_savepoint_bad_target_fails_once_and_claims_nothing(tl, capsys):
    claimed = _claimed(tl)
    dag = tl.dags["orders_payments_savepoint"]
    dr, tis = run_dag(dag, conf={"target": "/data/sp", "stop_after_savepoint": False})
    # refused by the guard sensor before it waits for the epoch runs (issue 34 item 8): once, no retry
    assert tis["wait_for_epoch_runs"][0] == "failed" and tis["wait_for_epoch_runs"][1] == 1, tis
    assert tis["savepoint"][0] == "upstream_failed", tis
    # the CLI checks the target before it builds the runner: exit 2, one line, no id claimed
    from pipeline.cli import main
    assert main(["savepoint", "--job", "orders_payments", "--target", "/data/sp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("epochal: ") and "did you mean file:///data/sp" in err[-1], err
    assert _claimed(tl) == claimed
