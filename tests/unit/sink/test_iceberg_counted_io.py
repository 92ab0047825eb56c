"""An Iceberg sink's commits are in the S3 request counts (pipeline.sink.iceberg_io), and every sink's
``sink_s3_requests_counting`` says what is and is not counted (pipeline.sink.formats), without Spark.

A moto server in its own process behind a counting proxy (:class:`~pipeline.testing.s3_faults.S3FaultProxy`):
Iceberg commits of an upsert table (staged files registered, the copy-on-write rewrite, metadata and
manifests; tests/unit/sink/test_open_tables.py runs the whole commit protocol of both modes on the same file IO) are seen by the proxy exactly as this process counted them, kind by kind. With pyiceberg's
own S3 client (``EPOCHAL_ICEBERG_COUNTED_IO=0``) the proxy sees requests the counter does not: the difference
the counted file IO removes, and what the stats then say.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.handles import FileHandle
from pipeline.config import load_config
from pipeline.fileio import S3FileIO
from pipeline.fileio.request_counter import KINDS, StorageRequests, request_counts
from pipeline.sink import iceberg as iceberg_mod
from pipeline.sink.formats import open_sink_table, sink_requests_counting
from pipeline.sink.table import CommitEntry
from pipeline.sink.table_format import TableFormat
from pipeline.testing.s3_faults import S3FaultProxy

pytestmark = [pytest.mark.unit, pytest.mark.table_formats]

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])


@pytest.fixture(scope="module")
def moto_proc():
    from pipeline.testing.moto_server import moto_s3_process
    with moto_s3_process(buckets=["counted"]) as proc:
        yield proc


def _commits(root: str, tmp_path, mode: str) -> None:
    """Two checkpoints' commits of an Iceberg table (the second one an upsert's rewrite in upsert mode)."""
    cfg = load_config(env={}, sink_uri=root, iceberg_catalog_uri=f"sqlite:///{tmp_path}/cat-{mode}.db")
    key = ("k",) if mode == "upsert" else ()
    t = open_sink_table(S3FileIO(), cfg, "job1", f"out_{mode}", mode=mode, key=key, fmt=TableFormat.ICEBERG)
    t.prepare(SCHEMA)
    for cid, rows in ((1, {"k": ["a", "b"], "v": [1, 2]}), (2, {"k": ["b", "c"], "v": [20, 3]})):
        data = pa.BufferOutputStream()
        pq.write_table(pa.table(rows, schema=SCHEMA), data)
        uri = t.part_uri(cid, 0)
        t.fileio.write_bytes(uri, data.getvalue().to_pybytes())
        fh = FileHandle(uri=uri, rows=2, bytes=data.getvalue().size, sha256="")
        t.commit(CommitEntry(table=f"out_{mode}", checkpoint_id=cid, parent_id=cid - 1 or None, files=(fh,),
                             mode=mode, key=key))
    got = sorted((r["k"], r["v"]) for r in t.open_read().to_pylist())
    assert got == ([("a", 1), ("b", 2), ("b", 20), ("c", 3)] if mode == "append" else [("a", 1), ("b", 20), ("c", 3)])


def _seen(proxy: S3FaultProxy, before: dict) -> StorageRequests:
    after = dict(proxy.by_kind)
    diff = {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)}
    assert diff.get("other", 0) == 0, diff
    return StorageRequests(**{k: diff.get(k, 0) for k in KINDS})


@pytest.mark.s3
@pytest.mark.parametrize("mode", ["upsert"])  # registers staged files and rewrites data files (append: a subset)
def test_iceberg_commits_are_counted_exactly(moto_proc, tmp_path, monkeypatch, mode):
    proxy = S3FaultProxy(moto_proc.endpoint_url, log=True).start()
    try:
        for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            monkeypatch.setenv(k, proxy.endpoint_url)
        root = f"s3://counted/{tmp_path.name}-{mode}"
        assert iceberg_mod.iceberg_commits_counted(load_config(env={}, sink_uri=root))
        before, counted0 = dict(proxy.by_kind), request_counts()
        _commits(root, tmp_path, mode)
        seen, counted = _seen(proxy, before), request_counts() - counted0
        assert seen == counted, (seen, counted)
        print(f"iceberg {mode}, two commits: counted {counted}")
        assert seen.put >= 6 and seen.get >= 4, seen  # metadata, manifests, manifest lists went through it
        # pyiceberg's own S3 client: requests the counter does not see
        monkeypatch.setenv("EPOCHAL_ICEBERG_COUNTED_IO", "0")
        root2 = root + "-own"
        before, counted0 = dict(proxy.by_kind), request_counts()
        (tmp_path / "own").mkdir()
        _commits(root2, tmp_path / "own", mode)
        seen, counted = _seen(proxy, before), request_counts() - counted0
        missing = seen - counted
        assert all(getattr(missing, k) >= 0 for k in KINDS) and missing.put >= 4, (seen, counted)
        print(f"pyiceberg's own client: seen {seen}, counted {counted}")
    finally:
        proxy.stop()


def test_every_sink_format_says_whether_its_requests_are_counted(monkeypatch):
    s3 = load_config(env={}, sink_uri="s3://b/sink")
    assert sink_requests_counting(TableFormat.EPOCHAL, s3) == "counted (Epochal's S3 FileIO: staging and commits)"
    assert sink_requests_counting(TableFormat.ICEBERG, s3) == \
        "counted (staging; commits through pyiceberg on Epochal's S3 client)"
    assert sink_requests_counting(TableFormat.DELTA, s3) == \
        "staging counted; commits not counted (delta-rs: Rust object_store, no request hooks)"
    named = load_config(env={}, sink_uri="s3://b/sink", iceberg_catalog="rest1")
    assert sink_requests_counting(TableFormat.ICEBERG, named).startswith("staging counted; commits not counted")
    monkeypatch.setenv("EPOCHAL_ICEBERG_COUNTED_IO", "0")
    assert sink_requests_counting(TableFormat.ICEBERG, s3).startswith("staging counted; commits not counted")
    local = load_config(env={}, sink_uri="file:///tmp/sink")
    assert {sink_requests_counting(f, local) for f in TableFormat} == {"not on S3"}
