"""S3 requests per epoch are counted exactly and do not grow with history (issue 12, "Catch-up and S3"), on the
session's moto server.

A job of this test's own (``clicks -> aggregate per user -> upsert sink``, 2 partitions) runs like Airflow runs
it: a fresh :class:`JobRunner` per epoch (restore, listings, barrier log, id claim, plan, commit, retention,
sink garbage), with one new file per partition before each epoch. ``PIPELINE_S3_LIST_PAGE_SIZE=1`` makes every
listed key cost one LIST request, so a listing of all files ever (source files, commit entries, txn dirs, ...)
shows up as LIST requests that grow by several per epoch. The driver's requests of a one-epoch run early and
later in the history are compared kind by kind: they may differ by a small constant (retention starting, a state chain
being materialised), never by the history. The checkpoint stats record the driver's requests too.

**Counted at the server too.** The driver and the Spark executors reach moto through two counting proxies
(:class:`~pipeline.testing.s3_faults.S3FaultProxy`, no faults, every request logged): the driver's proxy must
have seen exactly the driver's own count, and the executors' proxy exactly the sum of the run's checkpoints'
``executor_s3_requests`` (exact counts: every executor request once, in the checkpoint whose work sent it,
whichever Python worker ran the task; docs/state.md "S3 requests per epoch"). The executors read exactly the new
source files, the same number of GETs for each, in every epoch; a catch-up of three epochs in one tagged round
attributes each epoch's requests to its own checkpoint (the same counts as a one-epoch round).

Default profile: one runner, epoch 2 against epoch 6 with a catch-up run between (~30 s); at most 15 GETs per
one-epoch run (each retained `_metadata` read once per runner, not at every listing of `checkpoints/`). ``EPOCHAL_S3_REQUESTS_LONG=1``: one
fresh runner per epoch, epoch 3 against epoch 15 (~1.5 min).
"""
from __future__ import annotations

import os
from datetime import UTC, datetime
from urllib.parse import unquote

import pytest

from pipeline.config import load_config
from pipeline.credentials import forward_to_executors
from pipeline.fileio import S3FileIO
from pipeline.fileio.request_counter import KINDS, RequestCounting, StorageRequests, request_counts
from pipeline.runtime.driver.runner import JobRunner
from pipeline.testing.doubles import FakeClock
from pipeline.testing.s3_faults import S3FaultProxy
from tests.integration.s3_request_jobs import clicks_job, proxy_diff, write_clicks_epoch

pytestmark = [pytest.mark.spark, pytest.mark.s3]

T0 = datetime(2024, 5, 1, tzinfo=UTC)
ROWS = 10  # per file
LONG = os.environ.get("EPOCHAL_S3_REQUESTS_LONG") == "1"








def test_requests_per_epoch_are_exact_and_do_not_grow_with_history(s3_root, moto_server, monkeypatch):
    monkeypatch.setenv("PIPELINE_S3_LIST_PAGE_SIZE", "1")
    driver_proxy = S3FaultProxy(moto_server.endpoint_url, log=True).start()
    exec_proxy = S3FaultProxy(moto_server.endpoint_url, log=True).start()
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.setenv(k, driver_proxy.endpoint_url)
    job, fio, src = clicks_job("s3req_test"), S3FileIO(), f"{s3_root}/src"
    src_path = "/" + src[len("s3://"):] + "/"
    written = [0]
    clock = FakeClock(T0.timestamp())
    shared: list[JobRunner] = []
    completed: list = []
    sc = None

    def runner() -> JobRunner:
        nonlocal sc
        cfg = load_config(env={}, source_uri=src, checkpoint_uri=f"{s3_root}/ckpt", sink_uri=f"{s3_root}/sink",
                          parallelism=1, epoch_seconds=60, source_listing_window=1, state_max_deltas=2,
                          retained_checkpoints=1, max_epochs_per_round=4, round_target_seconds=0)
        r = JobRunner(job, cfg, clock=clock, echo=lambda m: None)
        r.finalizer.listeners.append(completed.append)  # every checkpoint's _metadata (1 is retained)
        if sc is None:  # the executors reach moto through their own proxy (the session may be shared)
            sc = r.ctx.spark.sparkContext
            forward_to_executors(sc, {**os.environ, "AWS_ENDPOINT_URL": exec_proxy.endpoint_url,
                                      "AWS_ENDPOINT_URL_S3": exec_proxy.endpoint_url})
        return r

    def run(epochs: int) -> dict:
        """Write the next ``epochs`` epochs' files, then complete them in one ``run``; what was sent, counted
        by the driver, by the checkpoint stats and at both proxies."""
        first = written[0]
        new_files = set()
        for e in range(first, first + epochs):
            write_clicks_epoch(fio, src, e, t0=T0, rows=ROWS, users=4, step_s=5)
            new_files |= {f"{src_path}clicks/partition={p}/{e:08d}.parquet" for p in range(2)}
        written[0] += epochs
        clock.t = T0.timestamp() + 60 * written[0] + 1
        if LONG or not shared:  # LONG: a fresh runner (process) per run, as Airflow runs it
            shared[:] = [runner()]
        r = shared[0]
        d0, e0, n0 = dict(driver_proxy.by_kind), dict(exec_proxy.by_kind), len(exec_proxy.log or [])
        before = request_counts()
        report = r.run(epochs)  # restores the latest checkpoint first, like every run
        base = int(T0.timestamp()) // 60
        assert [c.epoch for c in report.completed] == [base + e for e in range(first, first + epochs)]
        spent = request_counts() - before
        ids = {c.checkpoint_id for c in report.completed}
        stats = [md.stats for md in sorted(completed, key=lambda m: m.checkpoint_id) if md.checkpoint_id in ids]
        assert len(stats) == epochs and all(st is not None for st in stats)
        assert all(st.executor_s3_requests_counting is RequestCounting.EXACT for st in stats), stats
        executors = [st.executor_s3_requests for st in stats]
        # exact: what each proxy saw is what was counted (the driver's counter; the run's checkpoint stats)
        assert proxy_diff(d0, dict(driver_proxy.by_kind)) == spent, (d0, driver_proxy.by_kind, spent)
        total = StorageRequests()
        for x in executors:
            total = total + x
        assert proxy_diff(e0, dict(exec_proxy.by_kind)) == total, (e0, exec_proxy.by_kind, executors)
        # the executors read exactly the new source files, each with the same GETs
        src_gets: dict[str, int] = {}
        for kind, _method, path in (exec_proxy.log or [])[n0:]:
            key = unquote(path.split("?")[0])
            if kind == "get" and key.startswith(src_path):
                src_gets[key] = src_gets.get(key, 0) + 1
        assert set(src_gets) == new_files, (sorted(src_gets), sorted(new_files))
        assert len(set(src_gets.values())) == 1, src_gets
        return {"driver": spent, "stats": stats[-1].s3_requests, "executors": executors,
                "tagged": [c.tagged_round for c in report.completed],
                "gets_per_file": next(iter(src_gets.values())), "executor_gets": sum(src_gets.values())}

    try:
        if LONG:  # one fresh runner per epoch (as Airflow runs it): epoch 3 against epoch 15
            runs = [run(1) for _ in range(16)]
            measured = [runs[3], runs[15]]
        else:  # one runner; catch-up runs in between (tagged rounds): epoch 2 (history 2) against epoch 6
            run(2)
            measured = [run(1)]
            catch_up = run(3)
            measured.append(run(1))
    finally:
        if sc is not None:  # later tests of the session reach moto directly again
            forward_to_executors(sc, {**os.environ, **moto_server.env()})
        driver_proxy.stop()
        exec_proxy.stop()
    early, late = measured
    print(f"executors per epoch: early {early['executors']} late {late['executors']}, source GETs per file "
          f"{early['gets_per_file']}; driver early {early['driver']} late {late['driver']}"
          + ("" if LONG else f"; tagged catch-up {catch_up['executors']}"))
    growth = {k: getattr(late["driver"], k) - getattr(early["driver"], k) for k in KINDS}
    # a listing of everything would add >= 4 LISTs (2 source files per epoch, commit entries, txn dirs ...)
    assert growth["list"] <= 2, (early, late)
    assert growth["get"] <= 2, (early, late)  # e.g. every sink commit entry read: +4
    assert growth["head"] <= 2 and growth["put"] <= 2 and growth["delete"] <= 4, (early, late)
    if not LONG:
        # each completed checkpoint's _metadata is read once per runner (CompletedCheckpointStore's cache), not
        # at each of the ~7 listings of checkpoints/ per epoch: 12 GETs measured, 20 without the cache
        assert late["driver"].get <= 15 and early["driver"].get <= 15, (early, late)

    # the checkpoint stats carry the driver's requests (typed), and they do not grow either
    s_early, s_late = early["stats"], late["stats"]
    assert isinstance(s_early, StorageRequests) and isinstance(s_late, StorageRequests)
    assert s_early.list > 0 and s_early.put > 0 and s_early.get > 0
    assert s_late.list <= s_early.list + 2 and s_late.get <= s_early.get + 2, (s_early, s_late)
    if LONG:
        assert s_late.total <= late["driver"].total  # the stats' window ends at _metadata: a part of the run's
    # the executors' requests of one epoch: O(new files), the same early and late (2 new files per epoch, read
    # with the same GETs each; one state snapshot and one staged sink file written)
    (x_early,), (x_late,) = early["executors"], late["executors"]
    assert early["gets_per_file"] == late["gets_per_file"] >= 1, (early, late)
    assert x_early.get >= early["executor_gets"] == 2 * early["gets_per_file"], (x_early, early)
    assert x_early.put >= 2 and x_early == x_late, (x_early, x_late)
    if not LONG:
        # a tagged round of three epochs: each epoch's requests in its own checkpoint, as a one-epoch round's
        assert all(len(t or ()) == 3 for t in catch_up["tagged"]), catch_up  # one Spark round, three checkpoints
        assert catch_up["executor_gets"] == 3 * 2 * catch_up["gets_per_file"], catch_up
        assert catch_up["executors"] == [x_early] * 3, (catch_up["executors"], x_early)
