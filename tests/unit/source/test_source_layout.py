from __future__ import annotations

import json

import pytest
from srchelpers import rows_table, write_bytes, write_parquet

from pipeline.exceptions import MalformedInputError
from pipeline.fileio import LocalFileIO, file_io_for, join_uri
from pipeline.source.layout import (
    SourceFile,
    list_source_files,
    scan_source,
    source_file_uri,
    unexpected_dead_letter_uri,
)

pytestmark = pytest.mark.unit


def _put(root: str, rel: str, data: bytes = b"x") -> str:
    uri = join_uri(root, rel)
    file_io_for(uri).write_bytes(uri, data)
    return uri


def test_lists_files_per_partition_sorted_by_seq(any_root):
    fio, root = any_root
    write_parquet(root, "orders", 1, 10, rows_table([1, 2]))
    write_parquet(root, "orders", 1, 2, rows_table([1]))
    write_bytes(root, "orders", 0, 0, b'{"a": 1}\n', "jsonl")
    write_parquet(root, "orders", 0, 123456789, rows_table([5]))  # 9 digits: seq beyond 8 digits
    write_parquet(root, "payments", 0, 0, rows_table([5]))  # another source, not listed
    files = list_source_files(fio, root, "orders")
    assert list(files) == [0, 1]
    assert [f.seq for f in files[0]] == [0, 123456789]
    assert [f.seq for f in files[1]] == [2, 10]
    f0 = files[0][0]
    assert f0 == SourceFile("orders", 0, 0, source_file_uri(root, "orders", 0, 0, "jsonl"), "jsonl", 9)
    assert files[1][0].format == "parquet" and files[1][0].size == fio.size(files[1][0].uri)


def test_missing_source_is_empty(any_root):
    fio, root = any_root
    assert list_source_files(fio, root, "orders") == {}


def test_ignores_hidden_temporary_and_in_progress_files(local_root):
    fio = LocalFileIO()
    write_parquet(local_root, "orders", 0, 1, rows_table([1]))
    for rel in ("orders/_SUCCESS", "orders/.hidden", "orders/partition=0/_tmp_00000002.parquet",
                "orders/partition=0/.00000002.parquet.crc", "orders/partition=0/00000002.parquet.inprogress",
                "orders/partition=0/00000003.parquet.tmp", "orders/partition=0/_temporary/x/00000004.parquet",
                "orders/_staging/partition=0/00000005.parquet", "orders/partition=0/00000006.jsonl._COPYING_"):
        _put(local_root, rel)
    listing = scan_source(fio, local_root, "orders")
    assert listing.unexpected == ()
    assert [f.seq for f in listing.files[0]] == [1]


@pytest.mark.parametrize("rel, reason", [
    ("orders/partition=x/00000001.parquet", "partition="),
    ("orders/partition=01/00000001.parquet", "partition="),
    ("orders/p=1/00000001.parquet", "partition="),
    ("orders/partition=0/1.parquet", "file name"),
    ("orders/partition=0/00000001.csv", "file name"),
    ("orders/partition=0/00000001.parquet.gz", "file name"),
    ("orders/partition=0/000000001.parquet", "file name"),  # 9 digits with a leading zero
    ("orders/00000001.parquet", "directly under"),
    ("orders/partition=0/sub/00000001.parquet", "nested"),
])
def test_names_not_matching_the_layout_are_reported(local_root, rel, reason):
    fio = LocalFileIO()
    write_parquet(local_root, "orders", 0, 7, rows_table([1]))
    bad = _put(local_root, rel)
    listing = scan_source(fio, local_root, "orders")
    assert [u.uri for u in listing.unexpected] == [bad]
    assert reason in listing.unexpected[0].reason
    with pytest.raises(MalformedInputError) as e:
        list_source_files(fio, local_root, "orders", policy="fail")
    assert bad in str(e.value)


def test_duplicate_seq_is_reported_and_neither_file_is_read(local_root):
    fio = LocalFileIO()
    a = write_parquet(local_root, "orders", 0, 1, rows_table([1]))
    b = write_bytes(local_root, "orders", 0, 1, b"{}\n", "jsonl")
    write_parquet(local_root, "orders", 0, 2, rows_table([1]))
    listing = scan_source(fio, local_root, "orders")
    assert sorted(u.uri for u in listing.unexpected) == sorted([a, b])
    assert all("duplicate seq 1" in u.reason for u in listing.unexpected)
    assert [f.seq for f in listing.files[0]] == [2]


def test_dead_letter_policy_writes_one_deterministic_record_per_unexpected_file(local_root, tmp_path, caplog):
    fio = LocalFileIO()
    write_parquet(local_root, "orders", 0, 1, rows_table([1]))
    bad = _put(local_root, "orders/partition=0/oops.parquet")
    dl = (tmp_path / "dl").as_uri()
    files = list_source_files(fio, local_root, "orders", policy="dead_letter", dead_letter_root=dl, job="j")
    assert [f.seq for f in files[0]] == [1]
    assert "do not match the source layout" in caplog.text
    listing = scan_source(fio, local_root, "orders")
    uri = unexpected_dead_letter_uri(dl, "j", listing.unexpected[0])
    first = fio.read_bytes(uri)
    rec = json.loads(first)
    assert rec["file"] == bad and rec["partition"] == 0 and "file name" in rec["error"]
    list_source_files(fio, local_root, "orders", policy="dead_letter", dead_letter_root=dl, job="j")
    assert fio.read_bytes(uri) == first
