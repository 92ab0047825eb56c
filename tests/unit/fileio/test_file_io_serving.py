"""``file_io_serving``: a caller's FileIO (the source root's) serves only its own scheme; a lake source's files
in another store (its table on S3 while the source root is file://) get their own FileIO. Found by the lake source
chain on moto S3: the summaries read an s3:// data file through the source root's LocalFileIO."""
from __future__ import annotations

import pytest

from pipeline.fileio import InMemoryFileIO, LocalFileIO, S3FileIO, file_io_serving
from pipeline.testing.doubles import FlakyFileIO

pytestmark = pytest.mark.unit


def test_a_fileio_serves_its_own_scheme_only():
    local = LocalFileIO()
    assert file_io_serving(local, "file:///tmp/x.parquet") is local
    assert isinstance(file_io_serving(local, "s3://bucket/t/part-0.parquet"), S3FileIO)
    mem = InMemoryFileIO()
    assert file_io_serving(mem, "memory://b/x") is mem
    assert isinstance(file_io_serving(mem, "file:///tmp/x"), LocalFileIO)
    assert isinstance(file_io_serving(None, "file:///tmp/x"), LocalFileIO)


def test_a_wrapper_that_does_not_say_its_scheme_is_kept():
    flaky = FlakyFileIO(LocalFileIO())
    assert file_io_serving(flaky, "file:///tmp/x") is flaky
