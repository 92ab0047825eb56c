"""The DuckDB references on tiny hand-made event sets whose answers are checked by hand: joins, string
functions, and the watermark rules of docs/windows.md (firing, a late record, an idle partition)."""
from __future__ import annotations

import importlib
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.nexmark.generator import SCHEMAS
from benchmarks.nexmark.reference import connect, window_pairs

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)
E = 10  # epoch seconds


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def write(root: Path, source: str, partition: int, rows: list[dict]) -> None:
    """One file of ``rows`` (missing columns get defaults) in the source layout."""
    schema = SCHEMAS[source]
    defaults = {pa.int64(): 0, pa.string(): ""}
    cols = {f.name: [r.get(f.name, defaults.get(f.type)) for r in rows] for f in schema}
    d = root / source / f"partition={partition}"
    d.mkdir(parents=True, exist_ok=True)
    seq = len(list(d.glob("*.parquet"))) + 1
    pq.write_table(pa.Table.from_pydict(cols, schema=schema), d / f"{seq:08d}.parquet")


def empty_sources(root: Path) -> None:
    for s in SCHEMAS:
        write(root, s, 0, [])


def rows(con, q: str) -> list[tuple]:
    sql = importlib.import_module(f"benchmarks.nexmark.queries.{q}").reference()
    return sorted(con.execute(sql).fetchall())


def test_q3_join_filters_and_columns(tmp_path: Path):
    empty_sources(tmp_path)
    write(tmp_path, "person", 1, [
        dict(id=1000, name="Kate Smith", city="Bend", state="OR", date_time=at(0), _ingest_ts=at(0.1)),
        dict(id=1001, name="Paul White", city="Kent", state="WA", date_time=at(1), _ingest_ts=at(1.1))])
    write(tmp_path, "auction", 0, [  # the seller's auction arrives before the seller (another partition)
        dict(id=2000, seller=1000, category=10, date_time=at(0), _ingest_ts=at(0.05)),
        dict(id=2001, seller=1001, category=10, date_time=at(1), _ingest_ts=at(1.2)),   # WA: not selected
        dict(id=2002, seller=1000, category=11, date_time=at(2), _ingest_ts=at(2.2)),   # category 11
        dict(id=2003, seller=1000, category=10, date_time=at(30), _ingest_ts=at(31))])  # a later epoch
    con = connect(tmp_path, E)
    assert rows(con, "q3") == [("Kate Smith", "Bend", "OR", 2000), ("Kate Smith", "Bend", "OR", 2003)]
    # the join's TTL rule (docs/operators.md): with a 20 s TTL the person (ingest 0.1 s) has expired when the
    # auction of epoch 3 arrives: min(0.1, 31) < end(3) - 20 = 20
    con = connect(tmp_path, E, ttl_seconds=20)
    assert rows(con, "q3") == [("Kate Smith", "Bend", "OR", 2000)]


def test_q2_q21_q22_string_and_number_functions(tmp_path: Path):
    empty_sources(tmp_path)
    base = "https://www.nexmark.com/ab_c/de/fgh/item.htm?query=1"
    write(tmp_path, "bid", 0, [
        dict(auction=1107, bidder=1, price=10, channel="Apple", url=base, date_time=at(0), _ingest_ts=at(0)),
        dict(auction=1230, bidder=2, price=20, channel="channel-5", url=base + "&channel_id=123",
             date_time=at(1), _ingest_ts=at(1)),
        dict(auction=1231, bidder=3, price=30, channel="channel-6", url=base, date_time=at(2), _ingest_ts=at(2))])
    con = connect(tmp_path, E)
    assert rows(con, "q2") == [(1107, 10), (1230, 20)]  # 1107 = 9 * 123, 1230 = 10 * 123
    assert rows(con, "q21") == [(1107, 1, 10, "Apple", "0"), (1230, 2, 20, "channel-5", "123")]
    assert rows(con, "q22")[0] == (1107, 1, 10, "Apple", "ab_c", "de", "fgh")


def test_q14_ranges_time_types_and_count_char(tmp_path: Path):
    empty_sources(tmp_path)
    write(tmp_path, "bid", 0, [
        dict(auction=1, price=2_000_000, extra="cacc", date_time=at(9 * 3600), _ingest_ts=at(0)),   # 09:00 day
        dict(auction=2, price=2_000_000, extra="x", date_time=at(19 * 3600), _ingest_ts=at(1)),     # 19:00 other
        dict(auction=3, price=2_000_000, extra="", date_time=at(2 * 3600), _ingest_ts=at(2)),       # 02:00 night
        dict(auction=4, price=1_000_000, extra="c", date_time=at(9 * 3600), _ingest_ts=at(3))])     # 908000 < 1M
    got = [(r[0], float(r[2]), r[3], r[6]) for r in rows(connect(tmp_path, E), "q14")]
    assert got == [(1, 1_816_000.0, "dayTime", 3), (2, 1_816_000.0, "otherTime", 0), (3, 1_816_000.0, "nightTime", 0)]


def test_window_reference_follows_the_watermark_rules(tmp_path: Path):
    """Tumbling 10 s windows on date_time, out-of-orderness 4 s, epochs of 10 s of _ingest_ts.

    partition 0: epoch 0 (ingest 1): t=1; epoch 1 (ingest 15): t=15 -> W(1) = 15 - 4 = 11;
                 epoch 2 (ingest 21): t=5 is late ([0,10) ends at 10 <= W(1) = 11), t=24 -> W(2) = 20.
    partition 1: epoch 2 (ingest 22): t=26, a second channel: W(2) = min(24, 26) - 4 = 20.
    Fired by the end: [0,10) (1 record: the late one is not counted) and [10,20) (20 <= W(2)); [20,30) is open.
    """
    empty_sources(tmp_path)
    write(tmp_path, "bid", 0, [dict(bidder=7, date_time=at(1), _ingest_ts=at(1)),
                               dict(bidder=7, date_time=at(15), _ingest_ts=at(15)),
                               dict(bidder=7, date_time=at(5), _ingest_ts=at(21)),
                               dict(bidder=7, date_time=at(24), _ingest_ts=at(24))])
    write(tmp_path, "bid", 1, [dict(bidder=7, date_time=at(26), _ingest_ts=at(22))])
    con = connect(tmp_path, E)
    w = window_pairs("bid", key="bidder", event_time="date_time", size=10, out_of_orderness=4)
    got = con.execute(f"SELECT window_start, count(*) FROM {w} GROUP BY ALL ORDER BY 1").fetchall()
    assert [(ws.replace(tzinfo=UTC), n) for ws, n in got] == [(at(0), 1), (at(10), 1)]
    # sliding windows of 10 s every 5 s: t=5 is late for [0,10) (10 <= 11) but not for [5,15) (15 > 11), so it
    # counts there (docs/windows.md: a record is late only when all its windows are closed); t=15 is in [10,20)
    # and [15,25) (not fired: 25 > 20)
    w = window_pairs("bid", key="bidder", event_time="date_time", size=10, slide=5, out_of_orderness=4)
    got = con.execute(f"SELECT window_start, count(*) FROM {w} GROUP BY ALL ORDER BY 1").fetchall()
    assert [(ws.replace(tzinfo=UTC), n) for ws, n in got] == [(at(-5), 1), (at(0), 1), (at(5), 1),
                                                                       (at(10), 1)]


def test_q12_processing_time_windows_with_an_idle_partition(tmp_path: Path):
    """q12 windows on _ingest_ts (out-of-orderness 0). Partition 0: ingest 0.5, 3 (epoch 0), 12 (epoch 1);
    partition 1: ingest 25 (epoch 2, partition 0 idle there). W(0) = 3, W(1) = 12, W(2) = 25: [0,10) fired with
    2 bids of bidder 1, [10,20) with 1; bidder 2's [20,30) is still open."""
    empty_sources(tmp_path)
    write(tmp_path, "bid", 0, [dict(bidder=1, date_time=at(0), _ingest_ts=at(0.5)),
                               dict(bidder=1, date_time=at(0), _ingest_ts=at(3)),
                               dict(bidder=1, date_time=at(0), _ingest_ts=at(12))])
    write(tmp_path, "bid", 1, [dict(bidder=2, date_time=at(0), _ingest_ts=at(25))])
    got = [(b, n, s.replace(tzinfo=UTC), e.replace(tzinfo=UTC))
           for b, n, s, e in rows(connect(tmp_path, E), "q12")]
    assert got == [(1, 1, at(10), at(20)), (1, 2, at(0), at(10))]


def test_q11_session_reference_follows_the_watermark_rules(tmp_path: Path):
    """q11 sessions (gap 10 s, out-of-orderness 4 s), one partition, epochs of 10 s of _ingest_ts:
    W(0) = 8 - 4 = 4, W(1) = 15 - 4 = 11, W(2) = 29 - 4 = 25, W(3) = 44 - 4 = 40, W(6) = 62 - 4 = 58.
    Bidder 7: 1, 8, 15 (one session [1, 25)); t=10 arrives in epoch 2 behind W(1) = 11: late, not counted; 29 and 40
    are 10 s or more apart: [29, 39) and [40, 50). Bidder 8: 26, then 44 and 35 in epoch 3: 35 bridges 26 and 44 into
    [26, 54). Bidder 9's [62, 72) is still open (72 > 58)."""
    empty_sources(tmp_path)
    write(tmp_path, "bid", 0, [dict(bidder=7, date_time=at(1), _ingest_ts=at(1)),
                               dict(bidder=7, date_time=at(8), _ingest_ts=at(8)),
                               dict(bidder=7, date_time=at(15), _ingest_ts=at(15)),
                               dict(bidder=7, date_time=at(10), _ingest_ts=at(21)),
                               dict(bidder=7, date_time=at(29), _ingest_ts=at(21)),
                               dict(bidder=8, date_time=at(26), _ingest_ts=at(27)),
                               dict(bidder=8, date_time=at(44), _ingest_ts=at(31)),
                               dict(bidder=8, date_time=at(35), _ingest_ts=at(34)),
                               dict(bidder=7, date_time=at(40), _ingest_ts=at(38)),
                               dict(bidder=9, date_time=at(62), _ingest_ts=at(65))])
    got = [(b, n, s.replace(tzinfo=UTC), e.replace(tzinfo=UTC))
           for b, n, s, e in rows(connect(tmp_path, E), "q11")]
    assert got == [(7, 1, at(29), at(39)), (7, 1, at(40), at(50)), (7, 3, at(1), at(25)), (8, 3, at(26), at(54))]
