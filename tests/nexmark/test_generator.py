"""The Nexmark generator: proportions, determinism, ids drawn from earlier events, the source layout contract
(``_ingest_ts`` non-decreasing per partition) and the out-of-orderness bound of ``date_time``."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from benchmarks.nexmark.generator import (
    FIRST_AUCTION_ID,
    FIRST_PERSON_ID,
    HOT_CHANNELS,
    SCHEMAS,
    US_CITIES,
    US_STATES,
    NexmarkConfig,
    generate_tables,
    write_sources,
)

pytestmark = pytest.mark.unit

CFG = NexmarkConfig(events=25_000, rate=500.0, seed=7, partitions=3, max_delay_ms=1500)


@pytest.fixture(scope="module")
def tables() -> dict[str, pa.Table]:
    return generate_tables(CFG)


def _us(a) -> np.ndarray:
    return a.cast(pa.int64()).to_numpy()


def _event_number(t: pa.Table) -> np.ndarray:
    return t["_event"].to_numpy()


def test_proportions_1_3_46(tables):
    n = {k: t.num_rows for k, t in tables.items()}
    assert n == {"person": 500, "auction": 1500, "bid": 23_000}
    # and by position in the stream: event i is a person iff i % 50 == 0, an auction iff 1 <= i % 50 <= 3
    assert set(_event_number(tables["person"]) % 50) == {0}
    assert set(_event_number(tables["auction"]) % 50) == {1, 2, 3}
    assert set(_event_number(tables["bid"]) % 50) == set(range(4, 50))


def test_deterministic_by_seed(tmp_path: Path):
    small = NexmarkConfig(events=3_000, seed=3)
    a, b = generate_tables(small), generate_tables(small)
    other = generate_tables(NexmarkConfig(events=3_000, seed=4))
    for k in a:
        assert a[k].equals(b[k])
    assert not a["bid"].equals(other["bid"])
    write_sources((tmp_path / "x").as_uri(), small)
    write_sources((tmp_path / "y").as_uri(), small)
    files_x = sorted(p.relative_to(tmp_path / "x") for p in (tmp_path / "x").rglob("*.parquet"))
    assert files_x == sorted(p.relative_to(tmp_path / "y") for p in (tmp_path / "y").rglob("*.parquet"))
    for f in files_x:
        assert (tmp_path / "x" / f).read_bytes() == (tmp_path / "y" / f).read_bytes()


def test_ids_and_sellers_bidders_are_earlier_persons(tables):
    p, a, b = tables["person"], tables["auction"], tables["bid"]
    # person and auction ids are consecutive from 1000 in event order
    assert sorted(p["id"].to_pylist()) == list(range(FIRST_PERSON_ID, FIRST_PERSON_ID + p.num_rows))
    assert sorted(a["id"].to_pylist()) == list(range(FIRST_AUCTION_ID, FIRST_AUCTION_ID + a.num_rows))
    person_event = dict(zip(p["id"].to_pylist(), _event_number(p)))
    auction_event = dict(zip(a["id"].to_pylist(), _event_number(a)))
    for who, t in (("seller", a), ("bidder", b)):
        ev = _event_number(t)
        earlier = [person_event[x] < e for x, e in zip(t[who].to_pylist(), ev)]
        assert all(earlier), f"a {who} that is not an earlier person"
    assert all(auction_event[x] < e for x, e in zip(b["auction"].to_pylist(), _event_number(b)))


def test_hot_sellers_bidders_auctions(tables):
    a, b = tables["auction"], tables["bid"]
    # hot ratios 4, 4, 2: most auctions go to a batch's first person (id % 100 == 0), most bids come from the
    # batch's second one (id % 100 == 1) and half the bids or more go to a batch's first auction
    assert np.mean((a["seller"].to_numpy() - FIRST_PERSON_ID) % 100 == 0) > 0.7
    assert np.mean((b["bidder"].to_numpy() - FIRST_PERSON_ID) % 100 == 1) > 0.6
    assert np.mean((b["auction"].to_numpy() - FIRST_AUCTION_ID) % 100 == 0) > 0.45
    # a hot auction takes about half the bids while it is the batch's first (100 auctions = 1667 events)
    assert b.group_by("auction").aggregate([("price", "count")])["price_count"].to_numpy().max() > 500


def test_spec_domains(tables):
    p, a, b = tables["person"], tables["auction"], tables["bid"]
    assert set(p["state"].to_pylist()) <= set(US_STATES) and set(p["city"].to_pylist()) <= set(US_CITIES)
    assert set(a["category"].to_pylist()) == {10, 11, 12, 13, 14}
    assert all(r >= i for r, i in zip(a["reserve"].to_pylist(), a["initial_bid"].to_pylist()))
    assert pc.all(pc.greater(a["expires"], a["date_time"])).as_py()
    prices = b["price"].to_numpy()
    assert prices.min() >= 100 and prices.max() <= 100_000_000  # round(10^(6u) * 100)
    assert np.mean(prices < 10_000) == pytest.approx(1 / 3, abs=0.03)  # log-uniform over 6 decades
    hot = np.isin(b["channel"].to_numpy(zero_copy_only=False), HOT_CHANNELS)
    assert np.mean(hot) == pytest.approx(0.5, abs=0.03)
    assert all(u.startswith("https://www.nexmark.com/") for u in b["url"].to_pylist()[:100])
    cards = p["credit_card"].to_pylist()
    assert all(len(c) == 19 and c.count(" ") == 3 for c in cards)


def test_source_layout_ingest_order_and_bounded_out_of_orderness(tmp_path: Path):
    root = tmp_path / "src"
    summary = write_sources(root.as_uri(), CFG)
    assert summary["rows"] == {"person": 500, "auction": 1500, "bid": 23_000}
    worst = 0
    for name, schema in SCHEMAS.items():
        parts = sorted((root / name).glob("partition=*"))
        assert [d.name for d in parts] == [f"partition={p}" for p in range(CFG.partitions)]
        for d in parts:
            files = sorted(d.glob("*.parquet"))
            assert [f.name for f in files] == [f"{i:08d}.parquet" for i in range(1, len(files) + 1)]
            t = pa.concat_tables([pq.read_table(f) for f in files])
            assert t.schema.equals(schema)
            ingest, event = _us(t["_ingest_ts"]), _us(t["date_time"])
            assert (np.diff(ingest) >= 0).all(), f"{d}: _ingest_ts decreases"
            delay = ingest - event
            assert delay.min() >= 0 and delay.max() <= CFG.max_delay_ms * 1000
            # event times really arrive out of order, by less than the bound
            later_max = np.maximum.accumulate(event)
            worst = max(worst, int((later_max - event).max()))
    assert 0 < worst <= CFG.max_delay_ms * 1000
