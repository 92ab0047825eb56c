"""S3 requests outside rounds and of the open-format sinks' clients are counted exactly, or said not to be (issue 12,
"S3 requests per epoch are counted and reported"), on the session's moto server.

As in ``test_s3_requests.py``, the driver and the Spark executors reach moto through two counting proxies
(:class:`~pipeline.testing.s3_faults.S3FaultProxy`), and what each proxy saw is compared kind by kind with what
Epochal reports. A job of this test's own (``clicks -> aggregate per user -> upsert sink``):

* **Iceberg sink** (embedded catalog, pyiceberg's file IO on Epochal's counted S3 client,
  :mod:`pipeline.sink.iceberg_io`): a run of two epochs; the driver's proxy saw exactly the driver's counter (its
  Iceberg metadata and manifest requests included: they go through the driver's proxy only because they are sent
  by S3FileIO), the executors' proxy exactly the checkpoints' ``executor_s3_requests``; the checkpoint stats say
  the sink's requests are counted;
* **export** of the sink table (``JobRunner.export``): its ``s3_requests`` (driver, executors) equal the proxies';
* ``export_state``, ``bootstrap`` (a savepoint of a second job of this test's own computed by the batch plan,
  its sink committed through Iceberg) and a validation (``validate_job`` with the Spark engine): their
  ``s3_requests`` equal the proxies' (a validation's summary, written after its count, is its one PUT more).

Opt-in (``EPOCHAL_S3_REQUESTS_LONG=1``, ~1-2 min): the default suite covers the Iceberg file IO against the
proxy without Spark (``tests/unit/sink/test_iceberg_counted_io.py``) and the sink counting labels.
Delta (delta-rs) is not run here: its requests are not counted (the stats say so); through this proxy its
requests time out (not looked into).
"""
from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest

from pipeline.config import load_config
from pipeline.credentials import forward_to_executors
from pipeline.fileio import S3FileIO
from pipeline.fileio.request_counter import RequestCounting, StorageRequests, request_counts
from pipeline.runtime.driver.runner import JobRunner
from pipeline.testing.doubles import FakeClock
from pipeline.testing.s3_faults import S3FaultProxy
from tests.integration.s3_request_jobs import clicks_job, proxy_diff, write_clicks_epoch

pytestmark = [pytest.mark.spark, pytest.mark.s3,
              pytest.mark.skipif(os.environ.get("EPOCHAL_S3_REQUESTS_LONG") != "1",
                                 reason="opt-in: EPOCHAL_S3_REQUESTS_LONG=1 (~1-2 min)")]

T0 = datetime(2024, 6, 1, tzinfo=UTC)
ROWS = 12








def _reported(d: dict | None) -> StorageRequests:
    assert d is not None
    return StorageRequests.from_dict(d)


def test_requests_outside_rounds_and_of_sink_clients_are_counted_or_said_not_to_be(s3_root, moto_server, monkeypatch,
                                                                                     tmp_path):
    monkeypatch.setenv("EPOCHAL_HOME", str(tmp_path / "home"))  # the embedded Iceberg catalog of this test
    driver_proxy = S3FaultProxy(moto_server.endpoint_url, log=True).start()
    exec_proxy = S3FaultProxy(moto_server.endpoint_url, log=True).start()
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.setenv(k, driver_proxy.endpoint_url)
    fio, src = S3FileIO(), f"{s3_root}/src"
    clock = FakeClock(T0.timestamp())
    completed: list = []
    sc = None
    base = int(T0.timestamp()) // 60

    def runner(name: str, fmt: str, *, parallelism: int = 1) -> JobRunner:
        nonlocal sc
        cfg = load_config(env={}, source_uri=src, checkpoint_uri=f"{s3_root}/{name}/ckpt",
                          sink_uri=f"{s3_root}/{name}/sink", parallelism=parallelism, epoch_seconds=60,
                          source_listing_window=1, state_max_deltas=2, retained_checkpoints=2)
        r = JobRunner(clicks_job(name, fmt), cfg, clock=clock, echo=lambda m: None)
        r.finalizer.listeners.append(completed.append)
        if sc is None:  # the executors reach moto through their own proxy
            sc = r.ctx.spark.sparkContext
            forward_to_executors(sc, {**os.environ, "AWS_ENDPOINT_URL": exec_proxy.endpoint_url,
                                      "AWS_ENDPOINT_URL_S3": exec_proxy.endpoint_url})
        return r

    def marks() -> tuple[dict, dict, StorageRequests]:
        return dict(driver_proxy.by_kind), dict(exec_proxy.by_kind), request_counts()

    def seen(m: tuple[dict, dict, StorageRequests]) -> tuple[StorageRequests, StorageRequests, StorageRequests]:
        """(driver proxy, executors' proxy, driver counter) since ``m``."""
        return (proxy_diff(m[0], dict(driver_proxy.by_kind)), proxy_diff(m[1], dict(exec_proxy.by_kind)),
                request_counts() - m[2])

    def check_span(what: str, m, reported: dict, *, driver_extra: StorageRequests | None = None) -> None:
        d, e, _ = seen(m)
        driver_extra = driver_extra or StorageRequests()
        assert reported["executor_counting"] == "exact", (what, reported)
        assert d == _reported(reported["driver"]) + driver_extra, (what, d, reported)
        assert e == _reported(reported["executors"]), (what, e, reported)

    try:
        for e in range(2):
            write_clicks_epoch(fio, src, e, t0=T0, rows=ROWS, users=5, step_s=4)
        clock.t = T0.timestamp() + 60 * 2 + 1
        # -- an Iceberg sink: its commits through Epochal's counted client --------------------------------------
        ice = runner("ice", "iceberg")
        m = marks()
        report = ice.run(2)
        assert [c.epoch for c in report.completed] == [base, base + 1]
        d, ex, spent = seen(m)
        stats = [md.stats for md in completed if md.job == "ice"]
        assert len(stats) == 2 and all(st is not None for st in stats)
        assert all(st.executor_s3_requests_counting is RequestCounting.EXACT for st in stats)
        assert d == spent, (d, spent)  # pyiceberg's requests are the driver's, counted
        total = StorageRequests()
        for st in stats:
            total = total + st.executor_s3_requests
        assert ex == total, (ex, total)
        sink_path = "/" + f"{s3_root}/ice/sink"[len("s3://"):]
        iceberg_meta = [(k, p) for k, _m, p in (driver_proxy.log or []) if p.startswith(sink_path) and "metadata" in p]
        assert any(k == "put" for k, _ in iceberg_meta) and any(k == "get" for k, _ in iceberg_meta), iceberg_meta
        for st in stats:
            assert st.sink_s3_requests_counting == {
                "user_totals": "counted (staging; commits through pyiceberg on Epochal's S3 client)"}
        assert ice.table("user_totals").open_read().num_rows == 5
        # -- export of the Iceberg table: the command's requests, driver and executors ------------------------------
        m = marks()
        out = ice.export("user_totals", f"{s3_root}/exports/totals")
        assert out["rows"] == 5
        check_span("export_table", m, out["s3_requests"])
        assert _reported(out["s3_requests"]["executors"]).get > 0 and _reported(out["s3_requests"]["executors"]).put > 0
        m = marks()
        st_out = ice.export_state(str(report.completed[-1].checkpoint_id), "per-user", f"{s3_root}/exports/state")
        assert st_out["rows"] == 5
        check_span("export_state", m, st_out["s3_requests"])
        from pipeline.quality.validate import validate_job
        m = marks()
        res = validate_job(ice, None, engine="spark", build_docs=False, replay=False)
        check_span("validate_job", m, res.figures["s3_requests"], driver_extra=StorageRequests(put=1))
        from pipeline.batch.bootstrap.savepoint import bootstrap
        boot = runner("boot", "iceberg")
        m = marks()
        bd = bootstrap(boot, epoch=base + 1)
        check_span("bootstrap", m, bd["s3_requests"])
        assert _reported(bd["s3_requests"]["executors"]).put > 0
        print(f"iceberg run: driver {spent} executors {total}")
        for what, r in (("export", out), ("export_state", st_out), ("bootstrap", bd)):
            print(f"{what}: driver {_reported(r['s3_requests']['driver'])}, executors "
                  f"{_reported(r['s3_requests']['executors'])}")
        print(f"validate_job: driver {_reported(res.figures['s3_requests']['driver'])} (+ the summary's PUT), "
              f"executors {_reported(res.figures['s3_requests']['executors'])}")
    finally:
        if sc is not None:  # later tests of the session reach moto directly again
            forward_to_executors(sc, {**os.environ, **moto_server.env()})
        driver_proxy.stop()
        exec_proxy.stop()
