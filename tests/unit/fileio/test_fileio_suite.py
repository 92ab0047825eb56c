"""One FileIO suite, run against LocalFileIO (tmp_path) and S3FileIO (moto server on loopback)."""
from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.exceptions import ConditionalWriteError, ConfigError, ObjectNotFoundError
from pipeline.fileio import FileInfo, FileIO, LocalFileIO, S3FileIO, file_io_for, join_uri, sha256_of, sha256_of_file

pytestmark = pytest.mark.unit


def test_implements_protocol(any_root):
    fio, _root = any_root
    assert isinstance(fio, FileIO)


def test_write_read_roundtrip_and_overwrite(any_root):
    fio, root = any_root
    uri = join_uri(root, "a", "b.bin")
    fio.write_bytes(uri, b"hello")
    assert fio.read_bytes(uri) == b"hello"
    fio.write_bytes(uri, b"second version")
    assert fio.read_bytes(uri) == b"second version"
    assert fio.size(uri) == len(b"second version")
    assert fio.exists(uri)


def test_missing_objects_raise_not_found_naming_the_uri(any_root):
    fio, root = any_root
    uri = join_uri(root, "nope", "missing.json")
    with pytest.raises(ObjectNotFoundError, match="missing.json"):
        fio.read_bytes(uri)
    with pytest.raises(ObjectNotFoundError, match="missing.json"):
        fio.size(uri)
    with pytest.raises(ObjectNotFoundError, match="missing.json"):
        fio.open_input(uri)
    assert not fio.exists(uri)


def test_conditional_write_creates_once(any_root):
    fio, root = any_root
    uri = join_uri(root, "chk-1", "_metadata")
    fio.write_bytes(uri, b"first", if_none_match=True)
    with pytest.raises(ConditionalWriteError) as err:
        fio.write_bytes(uri, b"second", if_none_match=True)
    assert uri in str(err.value)
    assert fio.read_bytes(uri) == b"first"  # never overwritten
    # a plain write after a create-only one is a normal overwrite
    other = join_uri(root, "chk-1", "other")
    fio.write_bytes(other, b"x")
    with pytest.raises(ConditionalWriteError):
        fio.write_bytes(other, b"y", if_none_match=True)


def test_conditional_write_race_has_exactly_one_winner(any_root):
    fio, root = any_root
    uri = join_uri(root, "ids", "000000000001")
    n = 8
    barrier = threading.Barrier(n, timeout=60)
    winners: list[int] = []
    losers: list[int] = []

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            fio.write_bytes(uri, f"runner-{i}".encode(), if_none_match=True)
            winners.append(i)
        except ConditionalWriteError:
            losers.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert len(winners) == 1 and len(losers) == n - 1
    assert fio.read_bytes(uri) == f"runner-{winners[0]}".encode()


def test_list_is_sorted_files_only_and_prefix_is_a_directory(any_root):
    fio, root = any_root
    for rel in ["chk-1/_metadata", "chk-1/rounds/0/s.parquet", "chk-10/_metadata", "chk-2/x", "top.json"]:
        fio.write_bytes(join_uri(root, rel), rel.encode())
    listed = fio.list(join_uri(root, "chk-1"))
    assert listed == [FileInfo(join_uri(root, "chk-1/_metadata"), len("chk-1/_metadata")),
                      FileInfo(join_uri(root, "chk-1/rounds/0/s.parquet"), len("chk-1/rounds/0/s.parquet"))]
    assert [f.uri for f in fio.list(join_uri(root, "chk-1"), recursive=False)] == [join_uri(root, "chk-1/_metadata")]
    assert [f.uri for f in fio.list(root, recursive=False)] == [join_uri(root, "top.json")]
    everything = [f.uri for f in fio.list(root)]
    assert everything == sorted(everything) and len(everything) == 5
    assert fio.list(join_uri(root, "does-not-exist")) == []


def test_list_start_after_lists_only_later_keys(any_root):
    fio, root = any_root
    names = ["partition=0/00000001.parquet", "partition=0/00000002.parquet", "partition=0/00000010.parquet",
             "partition=0/sub/00000003.parquet", "partition=1/00000001.parquet"]
    for rel in names:
        fio.write_bytes(join_uri(root, rel), b"x")
    part0 = join_uri(root, "partition=0")
    after = [f.uri for f in fio.list(part0, start_after=join_uri(root, "partition=0/00000002"))]
    assert after == [join_uri(root, n) for n in ("partition=0/00000002.parquet", "partition=0/00000010.parquet",
                                                 "partition=0/sub/00000003.parquet")]
    assert [f.uri for f in fio.list(part0, recursive=False, start_after=join_uri(root, "partition=0/00000002.parquet"))] \
        == [join_uri(root, "partition=0/00000010.parquet")]
    assert fio.list(part0, start_after=join_uri(root, "partition=0/zzz")) == []
    assert fio.list(part0, start_after=join_uri(root, "partition=")) == fio.list(part0)


def test_s3_requests_are_counted_by_kind(moto_server, s3_root):
    from pipeline.fileio import S3FileIO
    from pipeline.fileio.request_counter import request_counts
    fio = S3FileIO()
    before = request_counts()
    fio.write_bytes(join_uri(s3_root, "a"), b"1")
    fio.write_bytes(join_uri(s3_root, "b"), b"2", if_none_match=True)
    fio.read_bytes(join_uri(s3_root, "a"))
    fio.exists(join_uri(s3_root, "a"))
    fio.list(s3_root)
    fio.list_dirs(s3_root)
    fio.delete(join_uri(s3_root, "a"))
    fio.delete_prefix(s3_root)  # one LIST and one DeleteObjects
    spent = request_counts() - before
    assert spent.to_dict() == {"list": 3, "get": 1, "head": 1, "put": 2, "delete": 2}
    assert spent.total == 9


def test_list_dirs_returns_immediate_non_empty_directories(any_root):
    fio, root = any_root
    for rel in ["checkpoints/chk-3/_metadata", "checkpoints/chk-12/rounds/0/a", "checkpoints/file.txt"]:
        fio.write_bytes(join_uri(root, rel), b"x")
    assert fio.list_dirs(join_uri(root, "checkpoints")) == ["chk-12", "chk-3"]
    assert fio.list_dirs(join_uri(root, "nothing-here")) == []
    # a directory whose files were all deleted is gone, on both backends
    fio.delete(join_uri(root, "checkpoints/chk-3/_metadata"))
    assert fio.list_dirs(join_uri(root, "checkpoints")) == ["chk-12"]


def test_delete_and_delete_prefix(any_root):
    fio, root = any_root
    fio.delete(join_uri(root, "never-existed"))  # missing is fine
    for rel in ["d/a", "d/sub/b", "d/sub/c", "d2/keep"]:
        fio.write_bytes(join_uri(root, rel), b"1")
    fio.delete(join_uri(root, "d/a"))
    assert not fio.exists(join_uri(root, "d/a"))
    assert fio.delete_prefix(join_uri(root, "d")) == 2
    assert fio.list(join_uri(root, "d")) == []
    assert fio.exists(join_uri(root, "d2/keep"))  # "d" is a directory prefix, not a string prefix
    assert fio.delete_prefix(join_uri(root, "d")) == 0


def test_streams_roundtrip_parquet(any_root):
    fio, root = any_root
    uri = join_uri(root, "data", "txn-1", "part-00000.parquet")
    table = pa.table({"k": ["a", "b", "c"], "v": [1, 2, 3]})
    with fio.open_output(uri) as out:
        pq.write_table(table, out)
    with fio.open_input(uri) as f:
        assert pq.read_table(f).equals(table)
    fs, path = fio.pyarrow_fs(uri)
    assert pq.read_table(path, filesystem=fs).equals(table)
    size, digest = sha256_of_file(fio, uri)
    assert size == fio.size(uri)
    assert digest == sha256_of(fio.read_bytes(uri))


def test_open_output_publishes_only_on_close(any_root):
    fio, root = any_root
    uri = join_uri(root, "state", "big.bin")
    out = fio.open_output(uri)
    out.write(b"partial data")
    assert not fio.exists(uri)  # a killed writer leaves nothing under the final name
    assert fio.list(join_uri(root, "state")) == []
    out.close()
    assert fio.read_bytes(uri) == b"partial data"


def test_sha256_of():
    assert sha256_of(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@pytest.mark.parametrize("root,parts,expected", [
    ("file:///tmp/x/", ("a", "b/c/"), "file:///tmp/x/a/b/c"),
    ("file:///", ("a",), "file:///a"),
    ("s3://bucket", ("job", "chk-1"), "s3://bucket/job/chk-1"),
    ("s3://bucket/pre//", ("/x/",), "s3://bucket/pre/x"),
    ("s3://bucket/p", (), "s3://bucket/p"),
    ("s3://bucket/p", ("", "q"), "s3://bucket/p/q"),
])
def test_join_uri(root, parts, expected):
    assert join_uri(root, *parts) == expected


def test_file_io_for_schemes(monkeypatch):
    assert isinstance(file_io_for("file:///tmp/a"), LocalFileIO)
    assert isinstance(file_io_for("s3://bucket/a"), S3FileIO)
    with pytest.raises(ConfigError, match="s3a://"):
        file_io_for("s3a://bucket/a")
    with pytest.raises(ConfigError, match="/relative/or/bare"):
        file_io_for("/relative/or/bare")


def test_local_tmp_files_are_invisible_and_uris_keep_caller_spelling(tmp_path):
    fio = LocalFileIO()
    root = tmp_path.as_uri()
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / ".x.epochal-tmp-123").write_bytes(b"crashed writer")
    assert fio.list(root) == []
    assert fio.list_dirs(root) == []
    fio.write_bytes(root + "/d/x", b"1")
    assert [f.uri for f in fio.list(root + "/")] == [root + "/d/x"]


def test_s3_settings_come_from_env_and_clients_are_cached(moto_server):
    a, b = S3FileIO(), S3FileIO()
    assert a.endpoint_url == moto_server.endpoint_url
    assert a.client is b.client  # per-process cache: cheap to construct on executors
    other = S3FileIO(endpoint_url="http://127.0.0.1:9")
    assert other.client is not a.client
    assert other.endpoint_url == "http://127.0.0.1:9"


@pytest.mark.s3
def test_s3_missing_bucket_is_a_clear_error(moto_server):
    from pipeline.exceptions import StorageError

    fio = S3FileIO()
    with pytest.raises(StorageError, match="s3://no-such-bucket-xyz/k"):
        fio.write_bytes("s3://no-such-bucket-xyz/k", b"1")


def test_take_unreported_reports_each_request_once():
    from pipeline.fileio.request_counter import count_request, take_unreported
    take_unreported()
    count_request("get", 3)
    count_request("put")
    first = take_unreported()
    assert (first.get, first.put, first.list) == (3, 1, 0)
    assert take_unreported().total == 0  # reported already
    count_request("list")
    assert take_unreported().list == 1
