"""Issue 34, item 2: Delta (and Iceberg) table commits ride out transient S3 faults like Epochal's own storage calls.

A cut S3 listing during a Delta commit used to end the run with a 48-line raw ``OSError: Generic S3 error``
traceback and exit 1: delta-rs does its own S3 requests, outside Epochal's retried FileIO, and its object store does
not retry a body cut short. Now the table commit (steps 2-5 of ``OpenFormatTable.commit``, idempotent) is retried
with a logged warning within ``PIPELINE_S3_RETRY_SECONDS``; past the budget it fails with one SinkError line.

Real components: moto S3 on loopback, the fault-injecting proxy (in a child process: delta-rs holds the GIL while
it waits for S3, so a proxy thread of this process could never answer it), delta-rs, pyiceberg with its own
pyarrow S3 filesystem (``EPOCHAL_ICEBERG_COUNTED_IO=0``). The tables are committed through their sink classes as a
checkpoint's commit does (staged Parquet files, commit entries), then read back with the format's own reader.
"""
from __future__ import annotations

import hashlib
import io
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.ack import AckResult
from pipeline.checkpoint.handles import FileHandle
from pipeline.config import load_config
from pipeline.exceptions import SinkError
from pipeline.fileio import S3FileIO
from pipeline.sink.table import CommitEntry
from pipeline.testing.s3_faults import ProxyProcess

pytestmark = [pytest.mark.s3, pytest.mark.table_formats]


@pytest.fixture
def proxy(moto_server, monkeypatch, tmp_path):
    p = ProxyProcess(moto_server.endpoint_url)
    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):  # delta-rs and pyarrow read these
        monkeypatch.setenv(k, p.endpoint_url)
    monkeypatch.setenv("PIPELINE_S3_RETRY_BASE_MS", "20")
    monkeypatch.setenv("PIPELINE_S3_RETRY_MAX_BACKOFF_SECONDS", "0.2")
    monkeypatch.setenv("EPOCHAL_HOME", str(tmp_path / "home"))   # the embedded Iceberg catalog's SQLite file
    monkeypatch.setenv("EPOCHAL_ICEBERG_COUNTED_IO", "0")        # pyiceberg's own S3 client, not Epochal's
    yield p
    p.stop()


def _table(fmt: str, proxy, s3_root: str):
    cfg = load_config(env={}, sink_uri=f"{s3_root}/sink", checkpoint_uri=f"{s3_root}/ck", source_uri=f"{s3_root}/src")
    fio = S3FileIO(endpoint_url=proxy.endpoint_url)
    if fmt == "delta":
        from pipeline.sink.delta import DeltaLakeTable
        return DeltaLakeTable(fio, cfg, "job", "paid")
    from pipeline.sink.iceberg import IcebergTable
    return IcebergTable(fio, cfg, "job", "paid")


def _stage(t, n: int) -> CommitEntry:
    """Checkpoint ``n``'s staged file (two rows) and its commit entry (parent n-1)."""
    tb = pa.table({"k": pa.array([f"a{n}", f"b{n}"]), "v": pa.array([n, n], pa.int64())})
    buf = io.BytesIO()
    pq.write_table(tb, buf)
    data = buf.getvalue()
    uri = t.part_uri(n, 0)
    t.fileio.write_bytes(uri, data)
    return CommitEntry(table="paid", checkpoint_id=n, parent_id=n - 1 if n > 1 else None,
                       files=(FileHandle(uri, 2, len(data), hashlib.sha256(data).hexdigest()),))


def _rows(t) -> list[tuple[str, int]]:
    return sorted((r["k"], r["v"]) for r in t.open_read().to_pylist())


def _expected(n: int) -> list[tuple[str, int]]:
    return sorted((f"{c}{i}", i) for i in range(1, n + 1) for c in "ab")


def test_cut_delta_log_listings_during_a_delta_commit_are_retried_with_a_warning(proxy, s3_root, caplog):
    t = _table("delta", proxy, s3_root)
    assert t.commit(_stage(t, 1)) is AckResult.SUCCESS
    caplog.set_level(logging.WARNING, logger="pipeline")
    for n, cuts in ((2, 1), (3, 3)):
        proxy.fail_next("cut_body", cuts, request="list", path_contains="_delta_log")
        assert t.commit(_stage(t, n)) is AckResult.SUCCESS
        assert proxy.stats()["pending"] == 0, "every cut listing was injected"
    assert proxy.injected["cut_body"] == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("commit of checkpoint 2: transient failure" in w for w in warnings) == 1, warnings
    assert sum("commit of checkpoint 3: transient failure" in w for w in warnings) == 3, warnings
    assert all("\x1b[" not in w and "\n" not in w for w in warnings), warnings  # one line, no terminal colours
    # every checkpoint exactly once, one Delta version each (no commit landed twice)
    assert _rows(t) == _expected(3)
    from deltalake import DeltaTable
    hist = DeltaTable(t.location, storage_options=t.storage_options).history()
    marks = [h.get("epochal.checkpoint-id") for h in hist if h.get("epochal.checkpoint-id")]
    assert sorted(marks) == ["1", "2", "3"], hist
    assert t.commit(_stage(t, 3)) is AckResult.DUPLICATE  # recoverAndCommit of 3: nothing twice


def test_a_delta_commit_past_the_retry_budget_is_one_sink_error_and_recovers(proxy, s3_root, monkeypatch):
    t = _table("delta", proxy, s3_root)
    t.commit(_stage(t, 1))
    monkeypatch.setenv("PIPELINE_S3_RETRY_SECONDS", "1")
    proxy.fail_next("cut_body", 1000, request="list", path_contains="_delta_log")
    entry = _stage(t, 2)
    with pytest.raises(SinkError) as ei:
        t.commit(entry)
    msg = str(ei.value)
    assert "commit of checkpoint 2 failed" in msg and "PIPELINE_S3_RETRY_SECONDS" in msg, msg
    assert "\n" not in msg and "\x1b[" not in msg, msg
    proxy.clear()
    # the commit log entry was written (step 1): the next run's recoverAndCommit finishes the table commit
    assert t.committed_ids() == [1, 2]
    assert t.commit(entry) is AckResult.SUCCESS     # the table gets checkpoint 2 now
    assert t.commit(entry) is AckResult.DUPLICATE   # and only once
    assert _rows(t) == _expected(2)


def test_iceberg_commits_ride_out_s3_errors_beyond_the_s3_clients_own_retries(proxy, s3_root, caplog):
    t = _table("iceberg", proxy, s3_root)
    assert t.commit(_stage(t, 1)) is AckResult.SUCCESS
    caplog.set_level(logging.WARNING, logger="pipeline")
    proxy.fail_next("error500", 12, request="put", path_contains="/paid/metadata/")
    assert t.commit(_stage(t, 2)) is AckResult.SUCCESS
    assert proxy.stats()["pending"] == 0
    assert any("commit of checkpoint 2: transient failure" in r.getMessage() for r in caplog.records), caplog.text
    assert _rows(t) == _expected(2)
    assert t.commit(_stage(t, 2)) is AckResult.DUPLICATE
