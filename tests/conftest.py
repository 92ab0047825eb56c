"""Repository-wide pytest fixtures.

S3 (marker ``s3``): one moto S3 server on 127.0.0.1 (free port) per test session, started the first time a
test asks for it, in a child process (``python -m pipeline.testing.moto_server``): libraries that keep the
GIL while they wait on S3 (delta-rs) cannot deadlock against it, and moto's CPU runs beside the tests. While it runs, the ``AWS_*`` variables point at it with dummy
credentials (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_DEFAULT_REGION``), so ``S3FileIO()`` / ``file_io_for("s3://...")`` / boto3 / pyarrow just work.

Fixtures:
    moto_server   the session server (:class:`pipeline.testing.moto_server.MotoProcess`)
    s3_root       a fresh ``s3://epochal-test/<test>-<random>`` prefix (bucket re-created if needed)
    local_root    a fresh ``file://`` root in ``tmp_path``
    memory_root   a fresh ``memory://`` root (InMemoryFileIO)
    any_root      parametrised over all three: ``(FileIO, root URI)`` - for suites that must pass on each
    data_root     local and S3 only: roots that Spark tasks in other processes can reach (dead letters, ...)

JVM options of the suite's Spark drivers (``SPARK_SUBMIT_OPTS``, read by ``spark-submit``, so they hold for the
in-process session, the jobs run as subprocesses, Airflow's tasks and the Spark Connect server): the C1 compiler
only and the serial collector (``EPOCHAL_TEST_JVM_OPTS``). A test's JVM lives seconds to minutes on tiny data; the
C2 compiler and G1's threads spent the CPU the test needed (one job subprocess: 65-72 s with the defaults against
33-39 s at load 14-22 on 2 cores, notes in docs/development/tests.md). Semantics are untouched. An explicit
``SPARK_SUBMIT_OPTS`` wins; ``EPOCHAL_TEST_JVM_OPTS=`` (empty) keeps the JVM's defaults.
"""
from __future__ import annotations

import os
import re
import sys
import uuid
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:  # the package without installing it
    sys.path.insert(0, str(_REPO))

S3_TEST_BUCKET = "epochal-test"

TEST_JVM_OPTS = os.environ.get("EPOCHAL_TEST_JVM_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
if TEST_JVM_OPTS and "SPARK_SUBMIT_OPTS" not in os.environ:  # before any test starts a JVM
    os.environ["SPARK_SUBMIT_OPTS"] = TEST_JVM_OPTS


@pytest.fixture(scope="session")
def moto_server():
    from pipeline.testing.moto_server import spawn_moto_server

    server = spawn_moto_server([S3_TEST_BUCKET])
    mp = pytest.MonkeyPatch()
    for key in ("AWS_SESSION_TOKEN", "AWS_PROFILE"):
        mp.delenv(key, raising=False)
    for key, value in server.env().items():
        mp.setenv(key, value)
    try:
        yield server
    finally:
        mp.undo()
        server.stop()


@pytest.fixture
def s3_root(moto_server, request) -> str:
    # the bucket may have been deleted by a test: make sure it exists
    moto_server.create_bucket(S3_TEST_BUCKET)
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:60].strip("-")
    return f"s3://{S3_TEST_BUCKET}/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def local_root(tmp_path) -> str:
    root = tmp_path / "root"
    root.mkdir()
    return root.as_uri()


@pytest.fixture
def memory_root(request) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", request.node.name)[:60].strip("-")
    return f"memory://epochal-test/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["local", "s3", "memory"])
def any_root(request):
    """``(fileio, root_uri)`` on LocalFileIO, on S3FileIO (moto) and on InMemoryFileIO; S3 cases carry the
    ``s3`` marker."""
    from pipeline.fileio import InMemoryFileIO, LocalFileIO, S3FileIO

    if request.param == "local":
        return LocalFileIO(), request.getfixturevalue("local_root")
    if request.param == "memory":
        return InMemoryFileIO(), request.getfixturevalue("memory_root")
    request.node.add_marker(pytest.mark.s3)
    return S3FileIO(), request.getfixturevalue("s3_root")


@pytest.fixture(params=["local", "s3"])
def data_root(request):
    """``(fileio, root_uri)`` on LocalFileIO and S3FileIO (moto): roots the data plane (Spark tasks) can use."""
    from pipeline.fileio import LocalFileIO, S3FileIO

    if request.param == "local":
        return LocalFileIO(), request.getfixturevalue("local_root")
    request.node.add_marker(pytest.mark.s3)
    return S3FileIO(), request.getfixturevalue("s3_root")


#: the slowest modules of the default suite (1.5-2.5 min each), started first so that with ``-n 2`` (two
#: workers, ``--dist loadfile``) neither worker is left with one of them at the end; the Airflow modules stay
#: ahead of everything (the in-process Airflow tests need their AIRFLOW_HOME before anything imports Airflow)
SLOW_MODULES = ("tests/airflow/test_real_airflow.py", "tests/cluster/test_cluster_export.py",
                "tests/e2e/test_crash_recovery.py", "tests/batch/test_property_crash.py",
                "tests/reliability/test_kill_loop.py")


def pytest_collection_modifyitems(config, items):
    """Airflow modules first, then :data:`SLOW_MODULES`, then the rest, each module's tests in their order."""
    def rank(item) -> int:
        path = item.nodeid.split("::", 1)[0]
        if path.startswith("tests/airflow/"):
            return 0 if path in SLOW_MODULES else 1
        return 2 if path in SLOW_MODULES else 3
    items[:] = sorted(items, key=rank)  # sorted() is stable: the order within each rank is kept
