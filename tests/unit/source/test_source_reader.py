from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow as pa
import pytest
from srchelpers import BASE, SCHEMA, TS, iso, rows_table, write_bytes, write_jsonl, write_parquet

from pipeline.checkpoint.handles import Position
from pipeline.exceptions import ConfigError, MalformedInputError, SourceError
from pipeline.fileio import LocalFileIO, file_io_for
from pipeline.source.layout import list_source_files
from pipeline.source.planner import Split, plan_segment, splits_table
from pipeline.source.positions import end_position
from pipeline.source.reader import (
    dead_letter_counts,
    dead_letter_uri,
    make_split_reader,
    read_split_table,
    reader_output_schema,
)
from pipeline.source.summary import summarize_source

pytestmark = pytest.mark.unit


def all_splits(root: str, source: str = "orders", max_records: int = 10**9) -> list[Split]:
    by_p = summarize_source(list_source_files(file_io_for(root), root, source))
    out = []
    for ss in by_p.values():
        out += list(plan_segment(ss, Position(0, 0), end_position(ss), max_records).splits)
    return out


@pytest.fixture
def dl(tmp_path) -> str:
    return (tmp_path / "dead-letter").as_uri()


def reader(dl: str, policy: str = "dead_letter", schema: pa.Schema = SCHEMA):
    return make_split_reader(schema, ["order_id"], policy, dl, "job1")


def dl_records(dl: str, source: str, partition: int, seq: int, row_start: int) -> list[dict]:
    uri = dead_letter_uri(dl, "job1", source, partition, seq, row_start)
    return [json.loads(line) for line in file_io_for(uri).read_bytes(uri).splitlines()]


# ------------------------------------------------------------------------------------------------ good data
def test_reads_slices_of_parquet_with_meta_columns(any_root, dl):
    _, root = any_root
    uri = write_parquet(root, "orders", 2, 7, rows_table([BASE + i for i in range(10)]), row_group_size=3)
    split = Split("orders", 2, 7, uri, "parquet", 2, 8)
    t = read_split_table(reader(dl), [split])
    assert t.schema == reader_output_schema(SCHEMA)
    assert t.column("order_id").to_pylist() == [f"o{i}" for i in range(2, 8)]
    assert t.column("_row").to_pylist() == list(range(2, 8))
    assert set(t.column("_partition").to_pylist()) == {2} and set(t.column("_seq").to_pylist()) == {7}
    assert set(t.column("_source").to_pylist()) == {"orders"}
    assert t.schema.field("_partition").type == pa.int32()
    assert dead_letter_counts(None, dl, "job1", [split]) == {"orders": 0}


def test_casts_to_the_declared_schema_and_ignores_extra_columns(local_root, dl):
    t = rows_table([BASE, BASE + 1], ts_type=pa.timestamp("ns", "UTC"))
    t = t.set_column(1, "amount", pa.array([1, 2], pa.int64()))  # int -> double
    t = t.set_column(2, "event_time", pa.array([BASE, BASE], pa.int64()).cast(pa.timestamp("us")))  # naive
    t = t.append_column("extra", pa.array([{"a": 1}, {"a": 2}]))  # not castable, but not declared
    uri = write_parquet(local_root, "orders", 0, 0, t)
    out = read_split_table(reader(dl), [Split("orders", 0, 0, uri, "parquet", 0, 2)])
    assert out.column("amount").to_pylist() == [1.0, 2.0]
    assert out.schema.field("_ingest_ts").type == TS
    assert out.column("_ingest_ts").cast(pa.int64()).to_pylist() == [BASE, BASE + 1]
    assert "extra" not in out.column_names


def test_reads_jsonl(local_root, dl):
    uri = write_jsonl(local_root, "orders", 1, 0, [
        {"order_id": "a", "amount": 1.5, "event_time": iso(BASE), "_ingest_ts": iso(BASE + 1), "more": "x"},
        {"order_id": "b", "amount": 2, "event_time": iso(BASE), "_ingest_ts": iso(BASE + 2)},
        {"order_id": "c", "amount": None, "event_time": None, "_ingest_ts": iso(BASE + 3)}])
    ints = write_jsonl(local_root, "orders", 1, 1, [  # integer timestamps are microseconds
        {"order_id": "d", "amount": 1, "event_time": BASE, "_ingest_ts": BASE + 4}])
    out = read_split_table(reader(dl), [Split("orders", 1, 0, uri, "jsonl", 1, 3),
                                        Split("orders", 1, 1, ints, "jsonl", 0, 1)])
    assert out.column("order_id").to_pylist() == ["b", "c", "d"]
    assert out.column("_ingest_ts").cast(pa.int64()).to_pylist() == [BASE + 2, BASE + 3, BASE + 4]
    assert out.column("_row").to_pylist() == [1, 2, 0]
    assert out.column("amount").to_pylist() == [2.0, None, 1.0]


def test_jsonl_with_a_column_changing_json_type_is_unreadable(local_root, dl):
    uri = write_jsonl(local_root, "orders", 0, 0, [
        {"order_id": "a", "amount": 1.5, "event_time": None, "_ingest_ts": iso(BASE)},
        {"order_id": "b", "amount": 2, "event_time": None, "_ingest_ts": BASE + 2}])
    assert read_split_table(reader(dl), [Split("orders", 0, 0, uri, "jsonl", 0, 2)]).num_rows == 0
    (rec,) = dl_records(dl, "orders", 0, 0, 0)
    assert "unreadable JSON Lines" in rec["error"] and rec["row_end"] == 2


def test_mapinarrow_callable_over_split_batches_is_picklable(local_root, dl):
    a = write_parquet(local_root, "orders", 0, 0, rows_table([BASE, BASE + 1]))
    b = write_parquet(local_root, "orders", 1, 0, rows_table([BASE + 2]))
    fn = pickle.loads(pickle.dumps(reader(dl)))
    batches = splits_table([Split("orders", 0, 0, a, "parquet", 0, 2),
                            Split("orders", 1, 0, b, "parquet", 0, 1)]).to_batches()
    out = pa.Table.from_batches(list(fn(iter(batches))))
    assert out.column("order_id").to_pylist() == ["o0", "o1", "o0"]
    assert out.column("_partition").to_pylist() == [0, 0, 1]


def test_reader_config_errors(dl):
    with pytest.raises(ConfigError):
        make_split_reader(SCHEMA, ["order_id"], "skip", dl, "j")
    with pytest.raises(ConfigError):
        make_split_reader(SCHEMA.remove(3), ["order_id"], "fail", dl, "j")
    with pytest.raises(ConfigError):
        make_split_reader(SCHEMA, ["nope"], "fail", dl, "j")


# ------------------------------------------------------------------------------------------------ bad input
def test_unreadable_parquet_is_dead_lettered_whole(data_root, tmp_path):
    _, root = data_root
    dl = root + "/dl"
    uri = write_bytes(root, "orders", 3, 5, b"PAR1 not parquet at all PAR1")
    split = Split("orders", 3, 5, uri, "parquet", 0, None)  # as planned: corrupt, whole file
    assert read_split_table(reader(dl), [split]).num_rows == 0
    (rec,) = dl_records(dl, "orders", 3, 5, 0)
    assert rec["file"] == uri and rec["partition"] == 3 and rec["seq"] == 5 and rec["row"] is None
    assert "unreadable parquet" in rec["error"] and rec["values"] is None
    assert dead_letter_counts(None, dl, "job1", [split]) == {"orders": 1}
    with pytest.raises(MalformedInputError) as e:
        read_split_table(reader(dl, "fail"), [split])
    assert uri in str(e.value) and "partition 3" in str(e.value) and "seq 5" in str(e.value)


def test_file_planned_unreadable_stays_dead_lettered_even_if_readable_now(local_root, dl):
    uri = write_parquet(local_root, "orders", 0, 0, rows_table([BASE]))
    split = Split("orders", 0, 0, uri, "parquet", 0, None)
    assert read_split_table(reader(dl), [split]).num_rows == 0
    (rec,) = dl_records(dl, "orders", 0, 0, 0)
    assert "unreadable when the round was planned" in rec["error"]


def test_corrupt_data_pages_are_dead_lettered_per_row_group(local_root, dl):
    good = rows_table([BASE + i for i in range(1000)], prefix="long-order-id-")
    uri = write_parquet(local_root, "orders", 0, 0, good, row_group_size=500)
    path = LocalFileIO.path_of(uri)
    data = bytearray(Path(path).read_bytes())
    data[100:300] = b"\xff" * 200  # inside the first row group's pages
    Path(path).write_bytes(bytes(data))
    out = read_split_table(reader(dl), [Split("orders", 0, 0, uri, "parquet", 0, 1000)])
    recs = dl_records(dl, "orders", 0, 0, 0)
    assert out.num_rows + sum(r["row_end"] - r["row_start"] for r in recs) == 1000
    assert all(r["row"] is None and "row group" in r["error"] for r in recs)


def test_schema_mismatch_missing_column(local_root, dl):
    t = rows_table([BASE, BASE + 1]).rename_columns(["order_id", "amount_eur", "event_time", "_ingest_ts"])
    uri = write_parquet(local_root, "orders", 1, 4, t)
    split = Split("orders", 1, 4, uri, "parquet", 0, 2)
    assert read_split_table(reader(dl), [split]).num_rows == 0
    recs = dl_records(dl, "orders", 1, 4, 0)
    assert [r["row"] for r in recs] == [0, 1]
    assert all("missing column(s) ['amount']" in r["error"] for r in recs)
    assert recs[0]["values"]["amount_eur"] == 0.0 and recs[1]["values"]["order_id"] == "o1"
    assert dead_letter_counts(None, dl, "job1", [split]) == {"orders": 2}
    with pytest.raises(MalformedInputError, match="partition 1.*missing column"):
        read_split_table(reader(dl, "fail"), [split])


def test_schema_mismatch_uncastable_type(local_root, dl):
    t = rows_table([BASE]).set_column(1, "amount", pa.array([{"eur": 1.0}]))
    uri = write_parquet(local_root, "orders", 0, 0, t)
    split = Split("orders", 0, 0, uri, "parquet", 0, 1)
    assert read_split_table(reader(dl), [split]).num_rows == 0
    (rec,) = dl_records(dl, "orders", 0, 0, 0)
    assert "column 'amount'" in rec["error"] and rec["values"]["amount"] == {"eur": 1.0}
    with pytest.raises(MalformedInputError, match=uri):
        read_split_table(reader(dl, "fail"), [split])


def test_bad_records_are_dead_lettered_one_by_one(local_root, dl):
    t = rows_table([BASE, BASE + 1, None, BASE + 3, BASE + 4, BASE + 5],
                   ids=["a", None, "c", "", "e", "f"])
    t = t.set_column(1, "amount", pa.array(["1.5", "2", "3", "4", "not a number", "6"]))  # castable strings
    uri = write_parquet(local_root, "orders", 0, 9, t)
    split = Split("orders", 0, 9, uri, "parquet", 0, 6)
    out = read_split_table(reader(dl), [split])
    assert out.column("order_id").to_pylist() == ["a", "f"]
    assert out.column("amount").to_pylist() == [1.5, 6.0]
    assert out.column("_row").to_pylist() == [0, 5]
    recs = {r["row"]: r for r in dl_records(dl, "orders", 0, 9, 0)}
    assert sorted(recs) == [1, 2, 3, 4]
    assert recs[1]["error"] == "null key column 'order_id'"
    assert recs[2]["error"] == "null _ingest_ts"
    assert recs[3]["error"] == "empty key column 'order_id'"
    assert "cannot be cast" in recs[4]["error"] and recs[4]["values"]["amount"] == "not a number"
    assert all(r["file"] == uri and r["partition"] == 0 and r["seq"] == 9 for r in recs.values())
    assert dead_letter_counts(None, dl, "job1", [split]) == {"orders": 4}
    with pytest.raises(MalformedInputError) as e:
        read_split_table(reader(dl, "fail"), [split])
    msg = str(e.value)
    assert uri in msg and "partition 0" in msg and "row 1" in msg and "null key column" in msg


def test_dead_letters_are_deterministic_per_split(local_root, dl):
    uri = write_parquet(local_root, "orders", 0, 0, rows_table([BASE, BASE, BASE, BASE], ids=["a", None, "", "d"]))
    first, second = Split("orders", 0, 0, uri, "parquet", 0, 2), Split("orders", 0, 0, uri, "parquet", 2, 4)
    read_split_table(reader(dl), [first, second])
    a = dead_letter_uri(dl, "job1", "orders", 0, 0, 0)
    b = dead_letter_uri(dl, "job1", "orders", 0, 0, 2)
    assert a.endswith("job1/orders/partition=0/00000000-00000000.jsonl")
    assert b.endswith("job1/orders/partition=0/00000000-00000002.jsonl")
    before = LocalFileIO().read_bytes(a), LocalFileIO().read_bytes(b)
    read_split_table(reader(dl), [first, second])  # a replay rewrites identical content
    assert (LocalFileIO().read_bytes(a), LocalFileIO().read_bytes(b)) == before
    assert dead_letter_counts(LocalFileIO(), dl, "job1", [first, second]) == {"orders": 2}
    assert dead_letter_counts(LocalFileIO(), dl, "job1", [first]) == {"orders": 1}


def test_unreadable_jsonl_and_jsonl_missing_column(local_root, dl):
    bad = write_bytes(local_root, "orders", 0, 0, b'{"order_id": "a"}\n{oops\n', "jsonl")
    miss = write_jsonl(local_root, "orders", 0, 1, [{"order_id": "x", "_ingest_ts": BASE}])
    splits = [Split("orders", 0, 0, bad, "jsonl", 0, None), Split("orders", 0, 1, miss, "jsonl", 0, 1)]
    assert read_split_table(reader(dl), splits).num_rows == 0
    assert "JSON" in dl_records(dl, "orders", 0, 0, 0)[0]["error"]
    assert "missing column" in dl_records(dl, "orders", 0, 1, 0)[0]["error"]
    assert dead_letter_counts(None, dl, "job1", splits) == {"orders": 2}


def test_vanished_file_fails_clearly_under_both_policies(local_root, dl):
    uri = write_parquet(local_root, "orders", 0, 0, rows_table([BASE]))
    LocalFileIO().delete(uri)
    for policy in ("dead_letter", "fail"):
        with pytest.raises(SourceError, match="partition 0"):
            read_split_table(reader(dl, policy), [Split("orders", 0, 0, uri, "parquet", 0, 1)])


def test_end_to_end_plan_and_read_on_s3(s3_root):
    pytest.importorskip("moto")
    write_parquet(s3_root, "orders", 0, 0, rows_table([BASE, BASE + 1], ids=["a", ""]))
    write_bytes(s3_root, "orders", 0, 1, b"garbage")
    write_parquet(s3_root, "orders", 1, 0, rows_table([BASE]))
    splits = all_splits(s3_root)
    dl = s3_root + "/dead-letter"
    out = read_split_table(reader(dl), splits)
    assert sorted(out.column("order_id").to_pylist()) == ["a", "o0"]
    assert dead_letter_counts(None, dl, "job1", splits) == {"orders": 2}


def test_dead_letter_counts_list_only_what_follows_the_splits(dl):
    """Counting a round's dead letters lists each partition from the round's first file on: the partition's
    history of dead-letter files is never listed (O(new files), as the source listing)."""
    fio = LocalFileIO()
    for seq in range(300):  # history: a dead letter for every earlier file, in two partitions
        for p in (0, 1):
            fio.write_bytes(dead_letter_uri(dl, "job1", "orders", p, seq, 0), b'{"error": "x"}\n')
    listed: list[int] = []

    class Counting(LocalFileIO):
        def list(self, prefix_uri, *, recursive=True, start_after=None):  # type: ignore[override]
            out = super().list(prefix_uri, recursive=recursive, start_after=start_after)
            listed.append(len(out))
            return out

    splits = [Split("orders", 0, 298, "u", "parquet", 0, 5), Split("orders", 0, 299, "u", "parquet", 0, 5),
              Split("orders", 1, 299, "u", "parquet", 0, 5), Split("orders", 1, 299, "u", "parquet", 5, 9)]
    assert dead_letter_counts(Counting(), dl, "job1", splits) == {"orders": 3}
    assert listed == [2, 1]  # one listing per partition read, holding only the round's files (not 300 each)
