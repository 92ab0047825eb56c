"""Fast tests of the orchestration layer: settings resolution, ordering rules, the plugin app (auth, pages)."""
from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from pipeline.exceptions import ConfigError

pytestmark = [pytest.mark.unit]


# -- S3 settings: Airflow connection or AWS environment, never DAG code ---------------------------------
def _conn(**kw):
    return SimpleNamespace(login=kw.get("login"), password=kw.get("password"), host=kw.get("host"),
                           port=kw.get("port"), extra_dejson=kw.get("extra", {}))


def test_s3_settings_from_connection():
    from pipeline.orchestration.settings import resolve_s3_settings
    env = {"AWS_ENDPOINT_URL": "http://stale:1", "AWS_ACCESS_KEY_ID": "env-key"}
    seen = []

    def lookup(conn_id):
        seen.append(conn_id)
        return _conn(login="AK", password="SK", extra={"endpoint_url": "http://minio:9000", "region_name": "eu-west-1"})
    s = resolve_s3_settings(env, lookup=lookup)
    assert seen == ["epochal_s3"]
    assert (s.source, s.endpoint_url, s.access_key_id, s.secret_access_key, s.region) == \
        ("connection:epochal_s3", "http://minio:9000", "AK", "SK", "eu-west-1")
    assert "SK" not in repr(s), "secrets stay out of reprs/logs"


def test_s3_settings_host_style_connection_and_explicit_id():
    from pipeline.orchestration.settings import resolve_s3_settings
    s = resolve_s3_settings({"EPOCHAL_AWS_CONN_ID": "my_minio"},
                            lookup=lambda cid: _conn(login="a", password="b", host="minio", port=9000)
                            if cid == "my_minio" else None)
    assert s.endpoint_url == "http://minio:9000" and s.source == "connection:my_minio"


def test_s3_settings_fall_back_to_environment_only_for_the_default_id():
    from pipeline.orchestration.settings import resolve_s3_settings
    env = {"AWS_ENDPOINT_URL": "http://moto:5000", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
           "AWS_DEFAULT_REGION": "us-east-1"}
    s = resolve_s3_settings(env, lookup=lambda cid: None)
    assert s.source == "environment" and s.endpoint_url == "http://moto:5000" and s.access_key_id == "k"
    with pytest.raises(ConfigError, match="no Airflow connection"):
        resolve_s3_settings({**env, "EPOCHAL_AWS_CONN_ID": "missing"}, lookup=lambda cid: None)
    assert resolve_s3_settings({**env, "EPOCHAL_AWS_CONN_ID": "none"}, lookup=pytest.fail).source == "environment"


def test_apply_connection_settings_replaces_stale_environment():
    from pipeline.orchestration.settings import S3Settings, apply_s3_settings
    environ = {"AWS_ENDPOINT_URL_S3": "http://stale", "AWS_SESSION_TOKEN": "old", "OTHER": "x"}
    apply_s3_settings(S3Settings("connection:c", "http://new:9000", "a", "b", "us-east-1"), environ)
    assert environ == {"OTHER": "x", "AWS_ENDPOINT_URL": "http://new:9000", "AWS_ENDPOINT_URL_S3": "http://new:9000",
                       "AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.mark.airflow
def test_real_airflow_connection_from_env_var(airflow_home, monkeypatch):
    """An ``AIRFLOW_CONN_*`` connection resolved through Airflow's secrets backends (server-side lookup)."""
    from pipeline.orchestration.settings import airflow_server_connection, resolve_s3_settings
    monkeypatch.setenv("AIRFLOW_CONN_EPOCHAL_S3", json.dumps(
        {"conn_type": "aws", "login": "L", "password": "P",
         "extra": {"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-2"}}))
    s = resolve_s3_settings(lookup=airflow_server_connection)
    assert (s.source, s.endpoint_url, s.access_key_id, s.region) == \
        ("connection:epochal_s3", "http://127.0.0.1:9", "L", "us-east-2")


# -- epochs and ordering ---------------------------------------------------------------------------------
def test_epoch_of_interval_is_the_epoch_ending_at_the_interval_end():
    from pipeline.orchestration.epoch_runs import epoch_of_interval
    end = datetime(2026, 1, 1, 1, 0, tzinfo=UTC)
    n = epoch_of_interval(3600, end)
    assert (n + 1) * 3600 == int(end.timestamp())
    # an unaligned end (manual run at 01:20): the last epoch that is complete by then
    assert epoch_of_interval(3600, datetime(2026, 1, 1, 1, 20, tzinfo=UTC)) == n
    with pytest.raises(ConfigError):
        epoch_of_interval(60, None)


def test_a_run_of_upstream_asset_events_never_rewinds_unless_cleared():
    from pipeline.orchestration.epoch_runs import EpochAction, EpochRun, action_for
    head = SimpleNamespace(epoch=10)
    asset = EpochRun("d", "asset_triggered__1", 10, run_type="asset_triggered")
    assert not asset.rewinds
    assert action_for(head, 10, rewinds=asset.rewinds) is EpochAction.UP_TO_DATE
    assert action_for(head, 9, rewinds=False) is EpochAction.UP_TO_DATE
    assert action_for(head, 11, rewinds=False) is EpochAction.CONTINUE      # still processes what is ready
    assert action_for(head, 13, rewinds=False) is EpochAction.CATCH_UP
    assert action_for(None, 13, rewinds=False) is EpochAction.START
    # a cleared asset run, and every other kind of run of a processed epoch, rewinds as before
    assert EpochRun("d", "asset_triggered__1", 10, clear_number=1, run_type="asset_triggered").rewinds
    for kind in ("scheduled", "manual", "backfill"):
        run = EpochRun("d", "r", 10, run_type=kind)
        assert run.rewinds and action_for(head, 10, rewinds=run.rewinds) is EpochAction.REWIND


def test_an_asset_triggered_run_processes_the_epoch_of_its_newest_event():
    from pipeline.orchestration.epoch_runs import epoch_of_events
    t = datetime(2026, 1, 1, 1, 0, 30, tzinfo=UTC)
    n = epoch_of_events(60, [datetime(2026, 1, 1, 0, 58, 5, tzinfo=UTC), t])
    assert n * 60 <= int(t.timestamp()) < (n + 1) * 60          # the epoch in progress at the newest commit
    assert epoch_of_events(60, [], fallback=t) == n
    with pytest.raises(ConfigError):
        epoch_of_events(60, [])


def test_wait_reason_orders_epochs_across_run_types():
    from pipeline.orchestration.epoch_runs import wait_reason
    go = dict(previous_state="success", previous_run_type="scheduled", this_run_type="scheduled",
              active_process_tasks=0, active_operations=0)
    assert wait_reason(**go) is None
    assert wait_reason(**{**go, "previous_state": None, "previous_run_type": None}) is None
    assert "previous interval" in wait_reason(**{**go, "previous_state": "running"})
    # a backfill runs several runs at once: each waits for the run of its previous interval
    assert wait_reason(**{**go, "previous_state": "queued", "previous_run_type": "backfill",
                          "this_run_type": "backfill"})
    # a queued non-backfill run cannot start while this one runs (max_active_runs=1): do not deadlock on it
    assert wait_reason(**{**go, "previous_state": "queued", "previous_run_type": "manual"}) is None
    assert "processing" in wait_reason(**{**go, "active_process_tasks": 1})
    assert "savepoint or restore" in wait_reason(**{**go, "active_operations": 1})


def test_injected_failure_only_on_the_first_try(monkeypatch):
    from pipeline.exceptions import InjectedFailure
    from pipeline.orchestration.tasks import maybe_inject_failure
    monkeypatch.setenv("EPOCHAL_AIRFLOW_FAIL_ONCE", "process:after_process")
    with pytest.raises(InjectedFailure):
        maybe_inject_failure("process", "after_process", 1)
    maybe_inject_failure("process", "after_process", 2)
    maybe_inject_failure("commit", "after_process", 1)


def test_control_document_round_trip(tmp_path):
    from pipeline.fileio import LocalFileIO
    from pipeline.orchestration.control import ControlStore
    cs = ControlStore(LocalFileIO(), tmp_path.as_uri(), "job")
    assert cs.control().stopped is False
    c = cs.update_control("me", stopped=True, stopped_savepoint="s3://b/sp", parallelism=4)
    assert cs.control() == c and c.updated_by == "me" and c.parallelism == 4
    cs.record_savepoint(7, "s3://b/elsewhere/sp-7", by="me", stop=False)
    assert cs.savepoint_locations() == ["s3://b/elsewhere/sp-7"]


# -- the plugin app --------------------------------------------------------------------------------------
@pytest.fixture
def app_client(tmp_path):
    from fastapi import HTTPException
    from fastapi.testclient import TestClient

    from pipeline.config import PipelineConfig
    from pipeline.orchestration.ui import _Backend, create_app
    root = tmp_path / "chk"
    (root / "orders_payments").mkdir(parents=True)
    (root / "orders_payments" / "job.json").write_text(json.dumps({"job": "orders_payments", "max_parallelism": 128}))
    cfg = PipelineConfig(checkpoint_uri=root.as_uri(), source_uri=(tmp_path / "s").as_uri(),
                         sink_uri=(tmp_path / "o").as_uri())
    calls = []

    async def authenticate(request):
        tok = request.cookies.get("_token") or request.headers.get("authorization", "")
        if not tok:
            raise HTTPException(status_code=401, detail="Not authenticated")
        return tok

    def authorize(user, dag_id):
        calls.append((user, dag_id))
        return "reader" in user

    app = create_app(backend=_Backend(config_loader=lambda: cfg), authenticate=authenticate,
                     authorize=authorize, login_url=lambda nxt: f"/auth/login?next={nxt}")
    return TestClient(app, follow_redirects=False), calls


def test_plugin_requires_airflow_login(app_client):
    client, calls = app_client
    r = client.get("/jobs/orders_payments/")
    assert r.status_code == 302 and r.headers["location"].startswith("/auth/login?next=")
    assert client.get("/api/jobs/orders_payments/checkpoints").status_code == 401
    client.cookies.set("_token", "someone")
    assert client.get("/jobs/orders_payments/").status_code == 403
    assert calls[-1] == ("someone", "epochal_orders_payments")  # authorised against the job's epoch DAG


def test_plugin_pages_render(app_client):
    client, _ = app_client
    client.cookies.set("_token", "reader")
    r = client.get("/")
    assert r.status_code == 200 and "orders_payments" in r.text
    r = client.get("/jobs/orders_payments/")
    assert r.status_code == 200 and "Checkpoint history: orders_payments" in r.text and "No checkpoint yet" in r.text
    # a job without any checkpoint directory (before its first run): an empty state, not "Not found"
    r = client.get("/jobs/fresh_job/")
    assert r.status_code == 200 and "No checkpoint yet" in r.text and "Not found" not in r.text
    assert "http-equiv='refresh'" in r.text and "Configuration" in r.text
    assert "http-equiv" not in client.get("/jobs/orders_payments/?refresh=0").text
    assert client.get("/jobs/orders_payments/checkpoints/99").status_code == 404
    assert client.get("/api/jobs/orders_payments/checkpoints").json()["checkpoints"] == []
    r = client.get("/dags/epochal_orders_payments")
    assert r.status_code == 307 and r.headers["location"].endswith("jobs/orders_payments/")


def test_history_table_rendering():
    from pipeline.orchestration.ui import render_detail_page, render_job_page
    op = {"uid": "paid_orders_join", "subtasks": 2, "acks": 2, "rows": 10, "bytes": 2048, "sync_ms": 5.0,
          "async_ms": 1.0, "alignment_ms": 3.0, "start_delay_ms": 0.0, "inflight_bytes": 0, "mode": "aligned"}
    row = {"checkpoint_id": 7, "kind": "checkpoint", "status": "COMPLETED", "epoch": 42, "barrier_time": "t",
           "trigger_time": "2026-11-21T08:00:00Z", "duration_ms": 1234.0, "state_bytes": 4096, "sink_bytes": 1,
           "alignment_ms": 3.0, "acks": 2, "expected_acks": 2, "parallelism": 2, "parent_id": 6, "location": "s3://x",
           "records": {"orders": 5}, "operators": [op], "problem": None,
           "s3_requests": {"list": 19, "get": 21, "head": 5, "put": 8, "delete": 0}}
    pend = {**row, "checkpoint_id": 8, "status": "PENDING", "acks": None, "expected_acks": 4, "operators": [],
            "s3_requests": None}
    html = render_job_page("orders_payments", "epochal_orders_payments", [pend, row], [], 7, {"stopped": True,
                           "stopped_savepoint": "s3://sp"}, {"max_parallelism": 128})
    for text in ("COMPLETED", "PENDING", "1234 ms", "4.0 KiB", "paid_orders_join 2/2", "latest", "stopped",
                 "S3 requests", "53<br><small>LIST 19 GET 21 HEAD 5 PUT 8</small>"):
        assert text in html, text
    detail = render_detail_page("orders_payments", {"summary": row, "operators": [op], "state": [], "sources": [
        {"source": "orders", "partition": "0", "position": "3:0", "barrier": "3:0"}], "sinks": [], "backlog": {},
        "dead_letters": {}})
    assert "Acknowledgements per operator" in detail and "paid_orders_join" in detail and "3:0" in detail
    assert "href='../data-docs/'" in detail
    sub = {"uid": "paid_orders_join", "alignment_ms": 0.0, "start_delay_ms": 1.0, "state_rows": 3, "in_rows": 5}
    subtasks = [{**sub, "subtask": 0, "ack_ms": 100.0, "sync_ms": 10.0, "async_ms": 4.0, "state_bytes": 1024},
                {**sub, "subtask": 1, "ack_ms": 300.0, "sync_ms": 30.0, "async_ms": 2.0, "state_bytes": 3072}]
    detail = render_detail_page("orders_payments", {"summary": row, "operators": [op], "subtasks": subtasks,
                                                    "state": [], "sources": [], "sinks": [], "backlog": {},
                                                    "dead_letters": {}})
    # per operator, min / avg / max over its subtasks
    assert "Per operator over its subtasks" in detail
    assert ("<td>Acknowledged (after trigger)</td><td class='num'>100 ms</td><td class='num'>200 ms</td>"
            "<td class='num'>300 ms</td>") in detail
    assert "<td>State size</td><td class='num'>1.0 KiB</td><td class='num'>2.0 KiB</td><td class='num'>3.0 KiB" in detail


@pytest.mark.airflow
def test_airflow_user_reads_cookie_or_bearer(airflow_home, monkeypatch):
    import airflow.api_fastapi.core_api.security as sec

    from pipeline.orchestration.ui import airflow_user
    seen = []

    async def fake_resolve(token):
        seen.append(token)
        return "u"
    monkeypatch.setattr(sec, "resolve_user_from_token", fake_resolve)
    req = SimpleNamespace(headers={"authorization": "Bearer abc"}, cookies={"_token": "cookie"})
    assert asyncio.run(airflow_user(req)) == "u"
    req = SimpleNamespace(headers={}, cookies={"_token": "cookie"})
    asyncio.run(airflow_user(req))
    assert seen == ["abc", "cookie"]


def test_operations_and_epochs_never_wait_for_each_other():
    """Operations (savepoint/restore) go first over epochs not yet started; they wait for started epochs."""
    from pipeline.orchestration.exclusion import (
        EpochActivity,
        OperationActivity,
        epoch_wait_reason,
        operation_wait_reason,
    )
    idle = EpochActivity(running_runs=0, waiting_triggers=0, active_work_tasks=0)
    assert operation_wait_reason("j", idle) is None
    # a run whose trigger still waits (e.g. for the operation itself) does not hold the job: no deadlock
    assert operation_wait_reason("j", EpochActivity(running_runs=1, waiting_triggers=1, active_work_tasks=0)) is None
    # a run past its trigger (process not scheduled yet) holds the job
    r = operation_wait_reason("j", EpochActivity(running_runs=1, waiting_triggers=0, active_work_tasks=0))
    assert r and "past their trigger" in r
    assert "process/commit/validate" in operation_wait_reason(
        "j", EpochActivity(running_runs=1, waiting_triggers=0, active_work_tasks=1))
    assert "another savepoint/restore" in operation_wait_reason("j", idle, other_operation_tasks=1)
    assert epoch_wait_reason("j", OperationActivity(pending_runs=0)) is None
    assert "savepoint or restore of job j" in epoch_wait_reason("j", OperationActivity(pending_runs=1))


def test_a_restore_that_only_validates_does_not_hold_the_epochs():
    """The restore DAG validates in its own task: once that task is active, the restore is done and the epoch runs go
    on from the restored checkpoint (issue 29: restore does not hang behind the proof)."""
    from pipeline.orchestration.exclusion import restore_runs_holding
    assert restore_runs_holding(1, 0) == 1      # restoring (or waiting to): epochs wait
    assert restore_runs_holding(1, 1) == 0      # validating: epochs go
    assert restore_runs_holding(0, 0) == 0
    assert restore_runs_holding(0, 1) == 0      # never negative


def _cp(cid, parent, status="COMPLETED", **kw):
    return {"checkpoint_id": cid, "kind": "checkpoint", "status": status, "epoch": cid, "barrier_time": f"T{cid}",
            "trigger_time": None, "duration_ms": kw.get("d"), "state_bytes": kw.get("b"), "sink_bytes": 0,
            "alignment_ms": kw.get("a"), "acks": None, "expected_acks": None, "parallelism": 2, "parent_id": parent,
            "location": f"s3://x/chk-{cid}", "records": {}, "operators": [], "problem": None}


def test_checkpoint_stats_counts_summary_restore_and_abandoned_branch():
    from pipeline.orchestration.checkpoint_stats import counts, lineage, summary
    # 1 <- 2 <- 3 <- 4, savepoint 5 of 3; restore from savepoint 5 -> 6 <- 7; 8 pending
    cps = [_cp(1, None, d=100, b=10, a=0), _cp(2, 1, d=300, b=30, a=4), _cp(3, 2, d=200, b=20, a=2),
           _cp(4, 3, d=400, b=40, a=6), _cp(6, 5, d=500, b=50, a=0), _cp(7, 6, d=600, b=60, a=0),
           _cp(8, 7, status="PENDING")]
    sps = [{**_cp(5, 3), "kind": "savepoint"}]
    assert counts(cps, sps) == {"triggered": 8, "restored": 0, "rewound": 0, "completed": 6, "failed": 0,
                                "in_progress_or_aborted": 1, "corrupt": 0, "savepoints": 1}
    events = [{"kind": "rewind"}, {"kind": "restore"}, {"kind": "restore"}]
    c = counts(cps, sps, restores=events, triggered=11)   # ids 9..11 were claimed and aborted, records gone
    assert (c["triggered"], c["restored"], c["rewound"]) == (11, 2, 1)
    sm = summary(cps)
    # percentiles by linear interpolation over 100..600: p50 between 300 and 400, p90 between 500 and 600
    assert sm["duration_ms"] == {"min": 100.0, "avg": 350.0, "max": 600.0, "p50": 350.0, "p90": 550.0,
                                 "p99": 595.0}
    assert sm["state_bytes"]["max"] == 60.0 and sm["alignment_ms"]["min"] == 0.0
    lin = lineage(cps, sps, 7)
    assert lin["lineage"] == [7, 6]
    assert lin["latest_restore"]["checkpoint_id"] == 6 and lin["latest_restore"]["from_kind"] == "savepoint"
    assert lin["abandoned"] == [], "4 is older than the savepoint's fork point 5? no: the fork is savepoint 5"
    # a rewind: 9 restored from checkpoint 2 abandons 3, 4 (6, 7 are newer than the fork too)
    lin = lineage(cps + [_cp(9, 2)], sps, 9)
    assert lin["latest_restore"] == {"checkpoint_id": 9, "from_id": 2, "from_kind": "checkpoint",
                                     "from_location": "s3://x/chk-2", "epoch": 9}
    assert lin["abandoned"] == [3, 4, 6, 7]
    # plain history: no restore, nothing abandoned
    assert lineage(cps[:4], [], 4) == {"head": 4, "lineage": [4, 3, 2, 1], "latest_restore": None, "abandoned": []}


def test_job_page_overview_config_refresh_and_empty_state():
    from pipeline.config import PipelineConfig
    from pipeline.orchestration.checkpoint_stats import configuration
    from pipeline.orchestration.ui import render_job_page
    cfg_rows = configuration(PipelineConfig(), {"max_parallelism": 64})
    html = render_job_page("j", "epochal_j", [_cp(2, 1, d=300, b=2048, a=4), _cp(1, None, d=100, b=1024, a=0)], [],
                           2, {}, {"max_parallelism": 64}, config_rows=cfg_rows, refresh=15)
    for text in ("Summary (completed checkpoints)", "Minimum", "Average", "200 ms", "1.5 KiB", "Latest restore",
                 "p90", "Latest failed checkpoint", "triggered 2",
                 "Abandoned branch", "Configuration", "exactly_once", "64", "http-equiv='refresh' content='15'",
                 "T2", "dags/epochal_j/runs"):
        assert text in html, text
    empty = render_job_page("j", "epochal_j", [], [], None, {}, {}, config_rows=cfg_rows, refresh=15)
    assert "No checkpoint yet" in empty and "Not found" not in empty and "Configuration" in empty


def test_data_docs_served_per_job_offline_behind_login(app_client, tmp_path):
    """A built site made offline, published to <checkpoint root>/<job>/data_docs/ and served by the plugin."""
    from pipeline.fileio import file_io_for
    from pipeline.quality.docs_site import make_offline, publish_site, site_uri
    client, calls = app_client
    site = tmp_path / "site"
    (site / "validations").mkdir(parents=True)
    (site / "index.html").write_text(
        "<html><head><link href='https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css' "
        "rel='stylesheet'><script src=\"https://code.jquery.com/jquery-3.7.1.min.js\"></script></head><body>"
        "<img src='https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/logo-long.png?d=1'>"
        "<div class='card'>suite ok</div></body></html>")
    (site / "validations" / "v.html").write_text("<html><head></head><body>run</body></html>")
    assert make_offline(site) == 2
    text = (site / "index.html").read_text()
    assert "https://" not in text and 'href="static/epochal-offline.css"' in text and "static/images/logo-long.png" in text
    assert 'href="../static/epochal-offline.css"' in (site / "validations" / "v.html").read_text()
    target = site_uri((tmp_path / "chk").as_uri(), "orders_payments")  # the app_client's checkpoint root
    assert publish_site(site, file_io_for(target), target) == 3
    assert client.get("/jobs/orders_payments/data-docs/").status_code == 302  # login first
    client.cookies.set("_token", "reader")
    r = client.get("/jobs/orders_payments/data-docs/")
    assert r.status_code == 200 and "suite ok" in r.text and r.headers["content-type"].startswith("text/html")
    r = client.get("/jobs/orders_payments/data-docs/static/epochal-offline.css")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/css") and ".card{" in r.text
    assert client.get("/jobs/orders_payments/data-docs/validations/v.html").text.count("run") == 1
    assert client.get("/jobs/orders_payments/data-docs/../job.json").status_code in (400, 404)
    # another job has its own site (none yet): an empty state
    r = client.get("/jobs/other_job/data-docs/")
    assert r.status_code == 200 and "No data-quality results yet" in r.text
    # linked from the job page and every checkpoint page
    assert "href='data-docs/'" in client.get("/jobs/orders_payments/").text


def test_unknown_checkpoint_id_page_has_a_way_back_and_the_retained_ids(app_client, tmp_path):
    """Issue 34, item 10 (part): an unknown checkpoint id is a page (404) with a link back to the job's history and
    the ids that exist, not a bare "Not found"."""
    from pipeline.checkpoint.coordinator import CheckpointCoordinator
    from pipeline.fileio import LocalFileIO
    client, _ = app_client
    client.cookies.set("_token", "reader")
    r = client.get("/jobs/orders_payments/checkpoints/99")
    assert r.status_code == 404 and "Back to the checkpoint history of orders_payments" in r.text, r.text
    assert "href='../'" in r.text and "Retained checkpoints: none" in r.text
    coord = CheckpointCoordinator(LocalFileIO(), (tmp_path / "chk").as_uri(), "orders_payments")
    parent = None
    for _ in range(2):
        p = coord.trigger(epoch=1, barrier_time="2026-01-01T00:01:00Z", expected_tasks={"op": 1}, parent_id=parent,
                          max_parallelism=128, parallelism=1)
        coord.acknowledge_task(p, "op", 0)
        parent = coord.complete(p).checkpoint_id
    r = client.get("/jobs/orders_payments/checkpoints/99")
    assert r.status_code == 404
    assert "<a href='../checkpoints/1'>1</a>, <a href='../checkpoints/2'>2</a>" in r.text, r.text
    assert client.get("/jobs/orders_payments/checkpoints/2").status_code == 200


def test_jobs_without_a_dag_in_this_airflow_are_not_listed_with_one(tmp_path):
    """Issue 34, item 10 (part): a job with checkpoints under the root but no epoch DAG in this Airflow (run by the
    CLI, or by another Airflow) is not shown with a DAG column and an "Airflow runs" link that lead nowhere."""
    from fastapi.testclient import TestClient

    from pipeline.config import PipelineConfig
    from pipeline.orchestration.ui import _Backend, create_app
    root = tmp_path / "chk"
    for job in ("orders_payments", "cli_only"):
        (root / job).mkdir(parents=True)
        (root / job / "job.json").write_text(json.dumps({"job": job, "max_parallelism": 8}))
    cfg = PipelineConfig(checkpoint_uri=root.as_uri(), source_uri=(tmp_path / "s").as_uri(),
                         sink_uri=(tmp_path / "o").as_uri())

    async def authenticate(request):
        return "reader"

    app = create_app(backend=_Backend(config_loader=lambda: cfg, dag_ids_loader=lambda: {"epochal_orders_payments"}),
                     authenticate=authenticate, authorize=lambda user, dag_id: True,
                     login_url=lambda nxt: f"/auth/login?next={nxt}")
    client = TestClient(app, follow_redirects=False)
    r = client.get("/")
    assert r.status_code == 200
    row = {line.split("</a>")[0].rsplit(">", 1)[-1]: line for line in r.text.split("<tr>") if "jobs/" in line}
    assert "epochal_orders_payments" in row["orders_payments"], row
    assert "epochal_cli_only" not in r.text and "no epoch DAG in this Airflow" in row["cli_only"], row
    page = client.get("/jobs/cli_only/").text
    assert "No epoch DAG in this Airflow" in page and "dags/epochal_cli_only" not in page, page
    assert "epochal run" in page
    page = client.get("/jobs/orders_payments/").text
    assert "dags/epochal_orders_payments/runs" in page


def test_restore_log_names_restores_and_rewinds_and_the_page_lists_every_one(tmp_path):
    """Every restore and rewind is kept (time, source, what it abandoned) and named for what it was: a rewind is not
    "restored from checkpoint N"; the newest failed checkpoint shows with its reason."""
    from pipeline.checkpoint.restores import RestoreEvent, RestoreLog
    from pipeline.fileio import file_io_for
    from pipeline.orchestration.ui import render_job_page
    root = tmp_path.as_uri()
    log = RestoreLog(file_io_for(root), f"{root}/j", keep=3)
    log.record(RestoreEvent(kind="restore", at="2026-11-28T10:00:00.000Z", from_kind="savepoint", from_id=5,
                            from_epoch=3, from_location="s3://x/savepoints/sp-5", abandoned=(4,), checkpoint_id=6,
                            parallelism=4))
    log.record(RestoreEvent(kind="rewind", at="2026-11-28T11:00:00.000Z", from_kind="checkpoint", from_id=6,
                            from_epoch=6, from_location="s3://x/chk-6", abandoned=(7,), rerun_epoch=7))
    events = log.list()
    assert [e.kind for e in events] == ["rewind", "restore"]   # newest first
    assert events[0].describe().endswith("rewound to checkpoint 6 (epoch 6) to re-run epoch 7; abandoned "
                                         "checkpoints [7]")
    assert "restored from savepoint 5 (epoch 3) as checkpoint 6 at parallelism 4" in events[1].describe()
    for i in range(3):   # the newest `keep` are kept
        log.record(RestoreEvent(kind="rewind", at=f"2026-11-28T12:0{i}:00.000Z", from_kind="start", from_id=None,
                                from_epoch=None, from_location=None, abandoned=(), rerun_epoch=1))
    assert len(log.list()) == 3 and log.list()[-1].at == "2026-11-28T12:00:00.000Z"
    failed = {**_cp(9, 8, status="FAILED"), "problem": "declined: task 3 of op join failed"}
    html = render_job_page("j", "epochal_j", [failed, _cp(8, 6, d=100), _cp(6, 5, d=100)], [], 8, {}, {},
                           restores=[e.to_dict() for e in events], triggered=9)
    assert "Restores and rewinds" in html and "rewound to checkpoint <a href='checkpoints/6'>6</a>" in html
    assert "restored from savepoint 5" in html and "as checkpoint <a href='checkpoints/6'>6</a>" in html
    assert "restored from checkpoint 6" not in html, "a rewind is named as a rewind"
    assert "triggered 9" in html and "restored 1" in html and "rewound 1" in html
    assert "declined: task 3 of op join failed" in html


def test_a_checkpoint_links_to_the_airflow_run_and_task_that_took_it(monkeypatch):
    """Inside an Airflow task (its AIRFLOW_CTX_* variables) the runner id names the DAG, run, task and try; the
    detail page links the checkpoint to that task instance (its log) in this Airflow."""
    from pipeline.checkpoint.ids import airflow_task_of, default_runner_id
    from pipeline.orchestration.ui import render_detail_page
    for k in ("AIRFLOW_CTX_DAG_ID", "AIRFLOW_CTX_DAG_RUN_ID", "AIRFLOW_CTX_TASK_ID", "AIRFLOW_CTX_TRY_NUMBER"):
        monkeypatch.delenv(k, raising=False)
    plain = default_runner_id()
    assert airflow_task_of(plain) is None and plain.count(":") == 2
    monkeypatch.setenv("AIRFLOW_CTX_DAG_ID", "epochal_j")
    monkeypatch.setenv("AIRFLOW_CTX_DAG_RUN_ID", "scheduled__2026-01-01T00:00:00+00:00")
    monkeypatch.setenv("AIRFLOW_CTX_TASK_ID", "process")
    monkeypatch.setenv("AIRFLOW_CTX_TRY_NUMBER", "2")
    rid = default_runner_id()
    assert airflow_task_of(rid) == {"dag_id": "epochal_j", "run_id": "scheduled__2026-01-01T00:00:00+00:00",
                                    "task_id": "process", "try_number": "2"}, rid
    row = {"checkpoint_id": 7, "kind": "checkpoint", "status": "COMPLETED", "epoch": 42, "location": "s3://x"}
    d = {"summary": row, "operators": [], "state": [], "sources": [], "sinks": [], "backlog": {}, "dead_letters": {},
         "taken_by": {"runner": rid, "airflow": airflow_task_of(rid)}}
    html = render_detail_page("j", d)
    assert ("href='../../../../dags/epochal_j/runs/scheduled__2026-01-01T00%3A00%3A00%2B00%3A00/tasks/process'"
            in html), html
    assert "(try 2, task log)" in html
    d["taken_by"] = {"runner": plain, "airflow": None}
    assert "(not an Airflow task)" in render_detail_page("j", d)
