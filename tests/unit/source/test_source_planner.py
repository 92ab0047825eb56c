from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from srchelpers import BASE, iso, rows_table, write_bytes, write_jsonl, write_parquet

from pipeline.checkpoint.handles import Position
from pipeline.exceptions import SourceError
from pipeline.fileio import LocalFileIO
from pipeline.source import planner, positions, summary
from pipeline.source.layout import list_source_files
from pipeline.source.planner import Split, allocate_records, count_rows, plan_segment, plan_segments
from pipeline.source.positions import barrier_position, barrier_positions, end_position, normalize_position
from pipeline.source.summary import FileStatus, summarize_file, summarize_source

pytestmark = pytest.mark.unit
S = 1_000_000  # one second in microseconds


def summaries(root: str, source: str = "orders", partition: int = 0):
    files = list_source_files(LocalFileIO(), root, source)
    return summarize_source(files).get(partition, ())


@pytest.fixture
def column_reads(monkeypatch):
    """Counts reads of the _ingest_ts column (the planner must avoid them unless a boundary straddles)."""
    calls: list[tuple[str, int]] = []
    real = summary.read_group_ts

    def spy(s, group, fileio):
        calls.append((s.uri, group))
        return real(s, group, fileio)

    monkeypatch.setattr(summary, "read_group_ts", spy)
    return calls


# ------------------------------------------------------------------------------------------------ summaries
def test_summary_from_parquet_footer(local_root):
    write_parquet(local_root, "orders", 0, 0, rows_table([BASE + 5, BASE + 1, BASE + 9, BASE + 20]),
                  row_group_size=2)
    (s,) = summaries(local_root)
    assert s.status is FileStatus.OK and s.rows == 4
    assert (s.min_ts, s.max_ts) == (BASE + 1, BASE + 20)
    assert [(g.rows, g.min_ts, g.max_ts, g.nulls) for g in s.row_groups] == [
        (2, BASE + 1, BASE + 5, 0), (2, BASE + 9, BASE + 20, 0)]


def test_summary_converts_nanosecond_and_millisecond_statistics(local_root):
    write_parquet(local_root, "orders", 0, 0, rows_table([BASE + 1, BASE + 3], ts_type=pa.timestamp("ns", "UTC")))
    t = rows_table([BASE, BASE + 2000])
    t = t.set_column(3, "_ingest_ts", t.column("_ingest_ts").cast(pa.timestamp("ms", "UTC")))
    write_parquet(local_root, "orders", 0, 1, t)
    a, b = summaries(local_root)
    assert (a.min_ts, a.max_ts) == (BASE + 1, BASE + 3)
    assert (b.min_ts, b.max_ts) == (BASE, BASE + 2000)


def test_summary_without_statistics_reads_only_the_ts_column_when_needed(local_root, column_reads):
    write_parquet(local_root, "orders", 0, 0, rows_table([BASE, BASE + 10, BASE + 20]), write_statistics=False)
    (s,) = summaries(local_root)
    assert s.rows == 3 and s.min_ts is None and s.row_groups[0].nulls is None
    assert column_reads == []
    assert barrier_position([s], BASE + 10) == Position(0, 1)
    assert len(column_reads) == 1


def test_summary_of_corrupt_files(local_root):
    write_bytes(local_root, "orders", 0, 0, b"PAR1 definitely not parquet PAR1")
    write_bytes(local_root, "orders", 0, 1, b"")
    write_bytes(local_root, "orders", 0, 2, b'{"order_id": "a"}\nnot json\n', "jsonl")
    a, b, c = summaries(local_root)
    assert [x.status for x in (a, b, c)] == [FileStatus.CORRUPT] * 3
    assert a.rows == 0 and "parquet" in a.error and "JSON" in c.error


def test_summary_of_jsonl_with_iso_and_integer_timestamps(local_root):
    write_jsonl(local_root, "orders", 0, 0, [{"order_id": "a", "_ingest_ts": iso(BASE + 7)},
                                             {"order_id": "b", "_ingest_ts": iso(BASE + 3)},
                                             {"order_id": "c", "_ingest_ts": None}])
    write_jsonl(local_root, "orders", 0, 1, [{"order_id": "d", "_ingest_ts": BASE + 50}])
    write_bytes(local_root, "orders", 0, 2, b"\n  \n", "jsonl")  # empty file: zero rows, not corrupt
    a, b, c = summaries(local_root)
    assert (a.rows, a.min_ts, a.max_ts, a.row_groups[0].nulls) == (3, BASE + 3, BASE + 7, 1)
    assert (b.rows, b.min_ts) == (1, BASE + 50)
    assert (c.status, c.rows) == (FileStatus.OK, 0)


def test_summary_without_ingest_ts_column_has_no_timestamps(local_root):
    write_parquet(local_root, "orders", 0, 0, rows_table([BASE, BASE]).drop_columns(["_ingest_ts"]))
    (s,) = summaries(local_root)
    assert s.rows == 2 and s.row_groups[0].nulls == 2 and s.min_ts is None
    assert barrier_position([s], 0) is None


def test_summaries_are_cached_by_uri_and_size(local_root, monkeypatch):
    write_parquet(local_root, "orders", 0, 0, rows_table([BASE]))
    (f,) = list_source_files(LocalFileIO(), local_root, "orders")[0]
    first = summarize_file(f)

    def boom(*a, **k):
        raise AssertionError("footer read again")

    monkeypatch.setattr(summary, "_summarize_parquet", boom)
    assert summarize_file(f) is first
    summary.clear_summary_cache()
    with pytest.raises(AssertionError):
        summarize_file(f)


def test_vanished_file_is_an_error_not_corruption(local_root):
    uri = write_parquet(local_root, "orders", 0, 0, rows_table([BASE]))
    (f,) = list_source_files(LocalFileIO(), local_root, "orders")[0]
    LocalFileIO().delete(uri)
    with pytest.raises(SourceError, match="partition 0"):
        summarize_file(f)


# ------------------------------------------------------------------------------------------------ barriers
def test_barrier_exactly_at_a_row(local_root, column_reads):
    write_parquet(local_root, "orders", 0, 0, rows_table([BASE, BASE + 10, BASE + 20, BASE + 20, BASE + 30]))
    ss = summaries(local_root)
    assert barrier_position(ss, BASE + 20) == Position(0, 2)
    assert barrier_position(ss, BASE + 19) == Position(0, 2)
    assert barrier_position(ss, BASE + 21) == Position(0, 4)
    assert barrier_position(ss, BASE) == Position(0, 0)  # min >= boundary: from statistics only
    assert barrier_position(ss, BASE + 31) is None
    assert len(column_reads) == 3
    assert barrier_position(ss, BASE + 20) == Position(0, 2)


def test_barrier_between_files_uses_statistics_only(local_root, column_reads):
    write_parquet(local_root, "orders", 0, 3, rows_table([BASE, BASE + 5]))
    write_parquet(local_root, "orders", 0, 4, rows_table([BASE + 60 * S, BASE + 61 * S]))
    ss = summaries(local_root)
    assert barrier_position(ss, BASE + 60 * S) == Position(4, 0)
    assert barrier_position(ss, BASE + 6) == Position(4, 0)
    assert column_reads == []


def test_barrier_inside_a_later_row_group_reads_only_that_group(local_root, column_reads):
    ts = [BASE + i for i in range(10)]
    write_parquet(local_root, "orders", 0, 0, rows_table(ts), row_group_size=3)
    ss = summaries(local_root)
    assert barrier_position(ss, BASE + 7) == Position(0, 7)
    assert [g for _, g in column_reads] == [2]
    assert barrier_position(ss, BASE + 6) == Position(0, 6)  # first row of group 2: statistics only
    assert len(column_reads) == 1


def test_barrier_skips_empty_and_corrupt_files_and_null_timestamps(local_root):
    write_parquet(local_root, "orders", 0, 0, rows_table([BASE]))
    write_parquet(local_root, "orders", 0, 1, rows_table([]))
    write_bytes(local_root, "orders", 0, 2, b"garbage")
    write_parquet(local_root, "orders", 0, 3, rows_table([None, BASE + 100, BASE + 200]))
    ss = summaries(local_root)
    assert ss[2].corrupt and ss[1].rows == 0
    assert barrier_position(ss, BASE + 1) == Position(3, 1)  # the null row stays with the rows before it
    assert barrier_position(ss, BASE + 150) == Position(3, 2)


def test_idle_partition_has_no_barrier_and_an_end_position(local_root):
    write_parquet(local_root, "orders", 0, 0, rows_table([BASE, BASE + 1]))
    write_parquet(local_root, "orders", 0, 1, rows_table([BASE + 2]))
    ss = summaries(local_root)
    assert barrier_position(ss, BASE + 60 * S) is None
    assert end_position(ss) == Position(2, 0)
    assert end_position(()) == Position(0, 0)


def test_resolve_barrier_idle_versus_lagging(local_root):
    write_parquet(local_root, "orders", 0, 0, rows_table([BASE, BASE + 1]))
    ss = summaries(local_root)
    end = BASE + 60 * S
    assert positions.resolve_barrier(ss, BASE + 1, now_us=0) == Position(0, 1)  # data decides, not the clock
    assert positions.resolve_barrier(ss, end, now_us=end - 1) is None  # lagging: wait
    assert positions.resolve_barrier(ss, end, now_us=end) == Position(1, 0)  # idle: all it has
    assert positions.resolve_barrier(ss, end, now_us=end + 5 * S, allowed_lateness_us=10 * S) is None
    assert positions.resolve_barrier((), end, now_us=end) == Position(0, 0)


def test_barrier_positions_many_partitions(local_root):
    write_parquet(local_root, "orders", 0, 0, rows_table([BASE, BASE + 10]))
    write_parquet(local_root, "orders", 1, 0, rows_table([BASE + 20]))
    write_parquet(local_root, "orders", 2, 0, rows_table([BASE]))
    by_p = summarize_source(list_source_files(LocalFileIO(), local_root, "orders"))
    assert barrier_positions(by_p, BASE + 10) == {0: Position(0, 1), 1: Position(0, 0), 2: None}


def test_summarize_source_since_leaves_out_consumed_files(local_root):
    for seq in range(4):
        write_parquet(local_root, "orders", 0, seq, rows_table([BASE + seq]))
    by_p = summarize_source(list_source_files(LocalFileIO(), local_root, "orders"), since={0: Position(2, 0)})
    assert [s.seq for s in by_p[0]] == [2, 3]


# ------------------------------------------------------------------------------------------------ positions
def test_normalize_position(local_root):
    write_parquet(local_root, "orders", 0, 0, rows_table([BASE] * 3))
    write_parquet(local_root, "orders", 0, 1, rows_table([]))
    write_bytes(local_root, "orders", 0, 2, b"garbage")
    ss = summaries(local_root)
    assert normalize_position(ss, Position(0, 2)) == Position(0, 2)
    assert normalize_position(ss, Position(0, 3)) == Position(2, 0)  # through the empty file
    assert normalize_position(ss, Position(2, 0)) == Position(2, 0)  # before the corrupt file's slot
    assert normalize_position(ss, Position(7, 0)) == Position(7, 0)
    with pytest.raises(SourceError, match="beyond the end"):
        normalize_position(ss, Position(0, 4))
    with pytest.raises(SourceError, match="does not exist"):
        normalize_position(ss, Position(5, 1))


# ------------------------------------------------------------------------------------------------ segments
@pytest.fixture
def three_files(local_root):
    write_parquet(local_root, "orders", 0, 0, rows_table([BASE + i for i in range(5)]))
    write_parquet(local_root, "orders", 0, 1, rows_table([BASE + 10 + i for i in range(3)]))
    write_parquet(local_root, "orders", 0, 2, rows_table([BASE + 20 + i for i in range(4)]))
    return summaries(local_root)


def test_plan_segment_whole_range(three_files):
    seg = plan_segment(three_files, Position(0, 0), Position(3, 0), 100)
    assert [(s.seq, s.row_start, s.row_end) for s in seg.splits] == [(0, 0, 5), (1, 0, 3), (2, 0, 4)]
    assert (seg.records, seg.backlog, seg.reached, seg.done) == (12, 0, Position(3, 0), True)
    assert seg.source == "orders" and seg.partition == 0


def test_plan_segment_capped_mid_file_with_backlog(three_files):
    seg = plan_segment(three_files, Position(0, 2), Position(2, 2), 4)
    assert [(s.seq, s.row_start, s.row_end) for s in seg.splits] == [(0, 2, 5), (1, 0, 1)]
    assert (seg.records, seg.backlog, seg.reached, seg.done) == (4, 4, Position(1, 1), False)
    nxt = plan_segment(three_files, seg.reached, seg.stop, 4)
    assert [(s.seq, s.row_start, s.row_end) for s in nxt.splits] == [(1, 1, 3), (2, 0, 2)]
    assert (nxt.records, nxt.backlog, nxt.done) == (4, 0, True)


def test_plan_segment_cap_exactly_at_file_end_normalises(three_files):
    seg = plan_segment(three_files, Position(0, 0), Position(3, 0), 5)
    assert seg.reached == Position(1, 0) and seg.backlog == 7
    seg = plan_segment(three_files, Position(0, 0), Position(1, 0), 5)
    assert seg.done and seg.backlog == 0


def test_plan_segment_start_at_end_of_file_and_empty_range(three_files):
    seg = plan_segment(three_files, Position(0, 5), Position(1, 0), 10)
    assert seg.splits == () and seg.done and seg.start == Position(1, 0)
    seg = plan_segment(three_files, Position(3, 0), Position(3, 0), 10)
    assert seg.splits == () and seg.done


def test_plan_segment_rejects_stop_before_start(three_files):
    with pytest.raises(SourceError, match="partition 0"):
        plan_segment(three_files, Position(2, 0), Position(1, 1), 10)


def test_corrupt_and_empty_files_are_whole_file_splits_that_cost_nothing(local_root):
    write_parquet(local_root, "orders", 0, 0, rows_table([BASE, BASE + 1]))
    write_bytes(local_root, "orders", 0, 1, b"garbage")
    write_parquet(local_root, "orders", 0, 2, rows_table([]))
    write_parquet(local_root, "orders", 0, 3, rows_table([BASE + 5]))
    ss = summaries(local_root)
    seg = plan_segment(ss, Position(0, 0), end_position(ss), 2)
    assert [s.as_dict()["row_end"] for s in seg.splits] == [2, None]
    assert seg.splits[1] == Split("orders", 0, 1, ss[1].uri, "parquet", 0, None)
    assert (seg.reached, seg.backlog) == (Position(3, 0), 1)
    rest = plan_segment(ss, seg.reached, seg.stop, 2)
    assert [(s.seq, s.row_start, s.row_end) for s in rest.splits] == [(3, 0, 1)] and rest.done
    # a segment that stops right before the corrupt file does not include it; the next one does
    a = plan_segment(ss, Position(0, 0), Position(1, 0), 10)
    b = plan_segment(ss, a.reached, Position(4, 0), 10)
    assert [s.seq for s in a.splits] == [0] and [s.seq for s in b.splits] == [1, 3]
    assert count_rows(ss, Position(0, 0), Position(4, 0)) == 3


def test_plan_segment_needs_source_without_summaries():
    seg = plan_segment((), Position(0, 0), Position(0, 0), 5, source="orders", partition=3)
    assert seg.partition == 3 and seg.done
    with pytest.raises(ValueError):
        plan_segment((), Position(0, 0), Position(0, 0), 5)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 6), min_size=1, max_size=6), cap=st.integers(1, 7),
       data=st.data())
def test_rounds_cover_every_row_exactly_once(tmp_path_factory, sizes, cap, data):
    root = tmp_path_factory.mktemp("r").as_uri()
    summary.clear_summary_cache()
    for seq, n in enumerate(sizes):
        write_parquet(root, "orders", 0, seq, rows_table([BASE + seq] * n))
    ss = summaries(root)
    total = sum(sizes)
    a_row = data.draw(st.integers(0, total))
    b_row = data.draw(st.integers(a_row, total))

    def pos(k):  # the position of the k-th row overall
        for seq, n in enumerate(sizes):
            if k < n:
                return Position(seq, k)
            k -= n
        return Position(len(sizes), 0)

    start, stop = pos(a_row), pos(b_row)
    seen: list[tuple[int, int]] = []
    cur = start
    for _ in range(total + 2):
        seg = plan_segment(ss, cur, stop, cap)
        assert seg.records <= cap
        seen += [(s.seq, r) for s in seg.splits for r in range(s.row_start, s.row_end)]
        cur = seg.reached
        if seg.done:
            break
    expected = [(seq, r) for seq, n in enumerate(sizes) for r in range(n)][a_row:b_row]
    assert seen == expected


# ------------------------------------------------------------------------------------------------ many partitions
def test_allocate_records_water_filling():
    assert allocate_records([5, 1, 10], 100).tolist() == [5, 1, 10]
    assert allocate_records([5, 1, 10], 7).tolist() == [3, 1, 3]
    assert allocate_records([5, 1, 10], 8).tolist() == [4, 1, 3]
    assert allocate_records([0, 0], 3).tolist() == [0, 0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=10), st.integers(0, 200))
def test_allocate_records_properties(backlogs, cap):
    alloc = allocate_records(backlogs, cap)
    assert alloc.sum() == min(cap, sum(backlogs))
    assert all(0 <= a <= b for a, b in zip(alloc, backlogs))
    if alloc.size:  # fair: nobody short of its backlog gets more than one record less than anyone else
        short = [a for a, b in zip(alloc, backlogs) if a < b]
        if short:
            assert max(alloc) - min(short) <= 1


def test_plan_segments_shares_the_cap_of_an_input(local_root):
    for p, n in ((0, 10), (1, 2), (2, 10)):
        write_parquet(local_root, "orders", p, 0, rows_table([BASE] * n))
    by_p = summarize_source(list_source_files(LocalFileIO(), local_root, "orders"))
    stops = {p: end_position(v) for p, v in by_p.items()} | {3: Position(0, 0)}
    segs = plan_segments(by_p, {}, stops, 8, source="orders")
    assert {p: s.records for p, s in segs.items()} == {0: 3, 1: 2, 2: 3, 3: 0}
    assert {p: s.backlog for p, s in segs.items()} == {0: 7, 1: 0, 2: 7, 3: 0}
    per = plan_segments(by_p, {}, stops, 8, source="orders", per_partition=True)
    assert {p: s.records for p, s in per.items()} == {0: 8, 1: 2, 2: 8, 3: 0}


def test_splits_table_schema_matches_spark_ddl():
    t = planner.splits_table([Split("orders", 1, 2, "file:///x", "parquet", 0, 5),
                              Split("orders", 1, 3, "file:///y", "parquet", 0, None)])
    assert t.schema == planner.SPLIT_SCHEMA
    assert t.column("row_end").to_pylist() == [5, None]
    assert [Split.from_dict(d) for d in t.to_pylist()][1].row_end is None
