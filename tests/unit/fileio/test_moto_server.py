"""The moto S3 launcher: in-process context manager and separate process."""
from __future__ import annotations

import os

import pytest

from pipeline.fileio import S3FileIO
from pipeline.testing.moto_server import moto_s3, spawn_moto_server

pytestmark = [pytest.mark.unit, pytest.mark.s3]


def test_context_manager_sets_and_restores_env(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://sentinel:1")
    with moto_s3(buckets=["ctx-bucket"]) as server:
        assert os.environ["AWS_ENDPOINT_URL"] == server.endpoint_url
        assert server.endpoint_url.startswith("http://127.0.0.1:")
        fio = S3FileIO()
        fio.write_bytes("s3://ctx-bucket/k", b"v")
        assert fio.read_bytes("s3://ctx-bucket/k") == b"v"
    assert os.environ["AWS_ENDPOINT_URL"] == "http://sentinel:1"


def test_rejects_short_bucket_names():
    with pytest.raises(ValueError, match="3 characters"):
        with moto_s3(buckets=["ab"]):
            pass


def test_separate_process_survives_its_clients_and_stops():
    mp = spawn_moto_server(["proc-bucket"])
    try:
        assert mp.proc.poll() is None
        fio = S3FileIO(endpoint_url=mp.endpoint_url, access_key_id="testing", secret_access_key="testing")
        fio.write_bytes("s3://proc-bucket/a/b", b"durable", if_none_match=True)
        again = S3FileIO(endpoint_url=mp.endpoint_url, access_key_id="testing", secret_access_key="testing")
        assert again.read_bytes("s3://proc-bucket/a/b") == b"durable"
    finally:
        mp.stop()
    assert mp.proc.returncode is not None
