"""S3 faults on the wire (real HTTP through pipeline.testing.s3_faults in front of moto): a write-once PUT
whose answer was lost is not a conflict (defect 4), a body cut mid-way is retried (defect 5), random faults
and an outage within the retry budget are ridden out (defect 7), a longer outage fails with one error."""
from __future__ import annotations

import time

import pytest

from pipeline.exceptions import ConditionalWriteError, StorageError
from pipeline.fileio import S3FileIO
from pipeline.testing.s3_faults import S3FaultProxy

pytestmark = [pytest.mark.s3]


@pytest.fixture
def proxy(moto_server, monkeypatch):
    p = S3FaultProxy(moto_server.endpoint_url, seed=7).start()
    monkeypatch.setenv("PIPELINE_S3_RETRY_BASE_MS", "20")
    monkeypatch.setenv("PIPELINE_S3_RETRY_MAX_BACKOFF_SECONDS", "0.5")
    yield p
    p.stop()


def _fio(p):
    return S3FileIO(endpoint_url=p.endpoint_url)


def test_write_once_put_without_a_retry_is_still_a_conflict(s3_root):
    fio = S3FileIO()
    uri = f"{s3_root}/_metadata"
    fio.write_bytes(uri, b"mine", if_none_match=True)
    for data in (b"mine", b"somebody else's"):  # not retried: an existing object is somebody's, even equal bytes
        with pytest.raises(ConditionalWriteError):
            fio.write_bytes(uri, data, if_none_match=True)
    assert fio.read_bytes(uri) == b"mine"


def test_lost_put_answers_and_cut_bodies(proxy, s3_root):
    fio = _fio(proxy)
    proxy.fail_next("lost_put")
    fio.write_bytes(f"{s3_root}/a/_pending.json", b"x" * 1000, if_none_match=True)  # answer lost, retried: 412
    assert proxy.injected["lost_put"] >= 1
    proxy.fail_next("lost_put")
    with pytest.raises(ConditionalWriteError):  # a lost answer with other bytes is still a conflict
        fio.write_bytes(f"{s3_root}/a/_pending.json", b"y" * 1000, if_none_match=True)
    for _ in range(3):
        proxy.fail_next("cut_body")
        assert fio.read_bytes(f"{s3_root}/a/_pending.json") == b"x" * 1000
    assert proxy.injected["cut_body"] >= 3


def test_random_faults_are_ridden_out(proxy, s3_root):
    fio = _fio(proxy)
    proxy.set_rate(0.3)
    for i in range(30):
        fio.write_bytes(f"{s3_root}/f/{i:03d}", str(i).encode(), if_none_match=(i % 2 == 0))
    assert [fio.read_bytes(f.uri) for f in fio.list(f"{s3_root}/f")] == [str(i).encode() for i in range(30)]
    assert sum(proxy.injected.values()) >= 10


def test_outage_within_budget_is_ridden_out_and_a_longer_one_fails(proxy, s3_root, monkeypatch):
    fio = _fio(proxy)
    monkeypatch.setenv("PIPELINE_S3_RETRY_SECONDS", "10")
    proxy.outage(3)
    t0 = time.monotonic()
    fio.write_bytes(f"{s3_root}/o/1", b"1")
    assert time.monotonic() - t0 >= 2.5 and fio.read_bytes(f"{s3_root}/o/1") == b"1"
    monkeypatch.setenv("PIPELINE_S3_RETRY_SECONDS", "2")
    proxy.outage(30)
    with pytest.raises(StorageError, match="o/2"):
        fio.write_bytes(f"{s3_root}/o/2", b"2")
    proxy.outage(0)


def test_streams_ride_out_faults_large_parquet_through_the_proxy(proxy, s3_root, monkeypatch):
    """open_input (ranged GETs) and open_output (PUT / multipart) go through the retry layer: a large Parquet
    file written and read back with 30% faults (cut bodies, drops, 5xx, lost PUT answers) is intact."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("PIPELINE_S3_PART_MB", "5")
    fio = _fio(proxy)
    rng = np.random.default_rng(3)
    tbl = pa.table({"k": np.arange(1_500_000), "v": rng.random(1_500_000)})  # ~24 MB: multipart
    proxy.set_rate(0.3)
    with fio.open_output(f"{s3_root}/big/a.parquet") as out:
        pq.write_table(tbl, out, row_group_size=200_000)
    small = pa.table({"k": [1, 2, 3]})
    with fio.open_output(f"{s3_root}/big/b.parquet") as out:
        pq.write_table(small, out)
    with fio.open_input(f"{s3_root}/big/a.parquet") as f:
        pf = pq.ParquetFile(f)
        assert pf.metadata.num_row_groups >= 7
        got = pf.read()
    with fio.open_input(f"{s3_root}/big/b.parquet") as f:
        assert pq.read_table(f).equals(small)
    proxy.set_rate(0)
    assert got.equals(tbl)
    assert fio.size(f"{s3_root}/big/a.parquet") > 5 * 1024 * 1024
    assert sum(proxy.injected.values()) >= 5, proxy.injected
    with pytest.raises(StorageError, match="missing.parquet"):
        fio.open_input(f"{s3_root}/big/missing.parquet")


@pytest.mark.unit
def test_task_errors_surface_as_epochal_errors():
    """A StorageError raised in a Spark task (outage past the budget) reaches the CLI as itself (one line),
    not as Spark's wrapped Python traceback (issue 15, defect 7)."""
    from pipeline.exceptions import CorruptCheckpointError
    from pipeline.runtime.spark.dataflow import rethrow_task_error
    wrapped = RuntimeError("An exception was thrown from the Python worker:\nTraceback (most recent call last):\n"
                           '  File "x.py", line 1\npipeline.exceptions.StorageError: cannot write s3://b/k.parquet: '
                           "SlowDown\n\tat org.apache.spark...")
    with pytest.raises(StorageError) as ei:
        rethrow_task_error(wrapped)
    assert str(ei.value) == "cannot write s3://b/k.parquet: SlowDown"
    with pytest.raises(CorruptCheckpointError, match="chk-3"):
        rethrow_task_error(RuntimeError("pipeline.exceptions.CorruptCheckpointError: bad chk-3/_metadata"))
    other = ValueError("pipeline.exceptions.NoSuchThing: x")
    with pytest.raises(ValueError):
        rethrow_task_error(other)
