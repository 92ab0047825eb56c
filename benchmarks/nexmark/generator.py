"""Nexmark event generator writing Epochal source files (DESIGN.md "Source layout").

Follows the rules of the Nexmark specification as its reference generator implements them (the public
``nexmark/nexmark`` repository: ``GeneratorConfig``, ``PersonGenerator``, ``AuctionGenerator``, ``BidGenerator``,
``PriceGenerator``, ``StringsGenerator``), written here from those rules, vectorised with numpy:

* event ``i`` (0, 1, 2, ...) is a person, an auction or a bid by ``i mod 50``: proportions 1 : 3 : 46;
* its event time is ``base + i / rate`` (milliseconds, the spec's ``timestampForEvent``);
* person ids and auction ids are consecutive from 1000; a new auction's seller and a new bid's bidder are drawn
  among the people generated *before* it (the last ``num_active_people``; ``id_lead`` > 0 also allows the spec's
  "lead" ids not generated yet, which the reference generator uses: 10); hot sellers (the first person of the
  latest batch of 100, probability 1 - 1/``hot_sellers_ratio``), hot bidders (the second one, 1 - 1/
  ``hot_bidders_ratio``) and hot auctions (the first auction of the latest batch of 100, 1 - 1/``hot_auction_ratio``)
  as in the spec; a bid's auction is otherwise one of the last ``num_in_flight_auctions`` auctions;
* categories 10..14, the spec's US states, cities, first and last names, credit cards ``dddd dddd dddd dddd``,
  e-mails ``<3-6 letters>@<3-4 letters>.com``, prices ``round(10^(6u) * 100)`` cents, reserve = initial bid +
  another price, auction expiry = date_time + 1 + a random length averaging the time until
  ``num_in_flight_auctions`` more auctions exist, item names (< 20) and descriptions (< 100) of random letters
  and spaces;
* bids: channel and url: half of them one of the 4 hot channels (Google, Facebook, Baidu, Apple) with its url,
  the others ``channel-<n>`` of 10,000 with a url of its own which holds ``&channel_id=<n reversed>`` 9 times in 10;
* ``extra``: random letters padding each event towards the spec's average size (person 200, auction 500, bid
  100 bytes) times ``extra_scale`` (default 0.1: small files; 1.0: the spec's sizes).

Arrival: each event goes to a random source partition and arrives ``delay`` ms after its event time, ``delay``
uniform in ``[0, max_delay_ms]``; rows of a partition are stored in arrival order, ``_ingest_ts`` = arrival time
(non-decreasing per partition), so ``date_time`` is out of order by at most ``max_delay_ms`` within a partition.
Files: ``<root>/<source>/partition=<p>/<seq:08d>.parquet``, one per ``file_seconds`` of arrival time.
Deterministic by ``seed``: the same config writes the same bytes.

    python -m benchmarks.nexmark.generator --root file:///tmp/nexmark --events 100000 --rate 1000
"""
from __future__ import annotations

import argparse
import io
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["NexmarkConfig", "PERSON_SCHEMA", "AUCTION_SCHEMA", "BID_SCHEMA", "SCHEMAS", "SIDE_INPUT_ROWS", "generate_tables",
           "write_sources", "FIRST_PERSON_ID", "FIRST_AUCTION_ID", "FIRST_CATEGORY_ID", "US_STATES", "US_CITIES",
           "FIRST_NAMES", "LAST_NAMES", "HOT_CHANNELS"]

TS = pa.timestamp("us", tz="UTC")
PERSON_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("email_address", pa.string()),
                           ("credit_card", pa.string()), ("city", pa.string()), ("state", pa.string()),
                           ("date_time", TS), ("extra", pa.string()), ("_ingest_ts", TS)])
AUCTION_SCHEMA = pa.schema([("id", pa.int64()), ("item_name", pa.string()), ("description", pa.string()),
                            ("initial_bid", pa.int64()), ("reserve", pa.int64()), ("date_time", TS),
                            ("expires", TS), ("seller", pa.int64()), ("category", pa.int64()),
                            ("extra", pa.string()), ("_ingest_ts", TS)])
BID_SCHEMA = pa.schema([("auction", pa.int64()), ("bidder", pa.int64()), ("price", pa.int64()),
                        ("channel", pa.string()), ("url", pa.string()), ("date_time", TS), ("extra", pa.string()),
                        ("_ingest_ts", TS)])
SCHEMAS = {"person": PERSON_SCHEMA, "auction": AUCTION_SCHEMA, "bid": BID_SCHEMA}
#: rows of q13's side table ``<root>/side_input/side_input.parquet`` (written by :func:`write_sources`)
SIDE_INPUT_ROWS = 10_000

FIRST_PERSON_ID = 1000
FIRST_AUCTION_ID = 1000
FIRST_CATEGORY_ID = 10
NUM_CATEGORIES = 5
HOT_BATCH = 100                     # hot sellers / bidders / auctions: the first of the latest batch of 100
US_STATES = ("AZ", "CA", "ID", "OR", "WA", "WY")
US_CITIES = ("Phoenix", "Los Angeles", "San Francisco", "Boise", "Portland", "Bend", "Redmond", "Seattle", "Kent",
             "Cheyenne")
FIRST_NAMES = ("Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter")
LAST_NAMES = ("Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris")
HOT_CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
CHANNELS_NUMBER = 10_000
MIN_STRING_LENGTH = 3
_MS = 1000  # microseconds per millisecond


@dataclass(frozen=True)
class NexmarkConfig:
    events: int = 10_000
    rate: float = 1_000.0            # events per second of event time (the spec's firstEventRate)
    seed: int = 1
    partitions: int = 4
    base_time: str = "2026-01-01T00:00:00+00:00"
    max_delay_ms: int = 2_000        # arrival - event time in [0, max_delay_ms]: the out-of-orderness bound
    file_seconds: float = 5.0        # arrival time per file
    extra_scale: float = 0.1         # extra padding: the spec's average sizes x this
    person_proportion: int = 1
    auction_proportion: int = 3
    bid_proportion: int = 46
    hot_auction_ratio: int = 2
    hot_sellers_ratio: int = 4
    hot_bidders_ratio: int = 4
    num_active_people: int = 1_000
    num_in_flight_auctions: int = 100
    id_lead: int = 0                 # the spec's PERSON_ID_LEAD / AUCTION_ID_LEAD is 10 (ids not generated yet)
    avg_person_bytes: int = 200
    avg_auction_bytes: int = 500
    avg_bid_bytes: int = 100

    @property
    def total_proportion(self) -> int:
        return self.person_proportion + self.auction_proportion + self.bid_proportion

    @property
    def base_ms(self) -> int:
        return int(datetime.fromisoformat(self.base_time).astimezone(UTC).timestamp() * 1000)

    def timestamp_ms(self, event_number: np.ndarray) -> np.ndarray:
        """The spec's ``timestampForEvent``: base + floor(n * inter-event delay in us) / 1000."""
        delay_us = 1_000_000.0 / self.rate
        return self.base_ms + (event_number.astype(np.float64) * delay_us).astype(np.int64) // 1000


# --- the spec's id arithmetic --------------------------------------------------------------------------------
def last_base0_person_id(c: NexmarkConfig, event_id: np.ndarray) -> np.ndarray:
    epoch, offset = event_id // c.total_proportion, event_id % c.total_proportion
    offset = np.minimum(offset, c.person_proportion - 1)
    return epoch * c.person_proportion + offset


def last_base0_auction_id(c: NexmarkConfig, event_id: np.ndarray) -> np.ndarray:
    epoch, offset = event_id // c.total_proportion, event_id % c.total_proportion
    pp, ap = c.person_proportion, c.auction_proportion
    out = np.where(offset < pp, (epoch - 1) * ap + ap - 1,
                   np.where(offset >= pp + ap, epoch * ap + ap - 1, epoch * ap + offset - pp))
    return out


def _randint(rng: np.random.Generator, n: np.ndarray) -> np.ndarray:
    """Uniform in [0, n) per element (n >= 1)."""
    return np.floor(rng.random(len(n)) * n).astype(np.int64)


def next_base0_person_id(c: NexmarkConfig, event_id: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    num_people = last_base0_person_id(c, event_id) + 1
    active = np.minimum(num_people, c.num_active_people)
    return num_people - active + _randint(rng, active + c.id_lead)


def next_base0_auction_id(c: NexmarkConfig, event_id: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    last = last_base0_auction_id(c, event_id)
    lo = np.maximum(last - c.num_in_flight_auctions, 0)
    return lo + _randint(rng, last - lo + 1 + c.id_lead)


def next_price(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.round(np.power(10.0, rng.random(n) * 6.0) * 100.0).astype(np.int64)


# --- strings -------------------------------------------------------------------------------------------------
def _strings(lengths: np.ndarray, data: np.ndarray) -> pa.Array:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return pa.LargeStringArray.from_buffers(len(lengths), pa.py_buffer(offsets), pa.py_buffer(
        np.ascontiguousarray(data, dtype=np.uint8).tobytes())).cast(pa.string())


def next_string(rng: np.random.Generator, n: int, max_length: int, special: str = " ") -> pa.Array:
    """The spec's ``nextString``: 3 + randint(max_length - 3) characters, each a special one with probability
    1/13, else a random lower-case letter; then trimmed of spaces."""
    lengths = MIN_STRING_LENGTH + rng.integers(0, max_length - MIN_STRING_LENGTH, n)
    total = int(lengths.sum())
    chars = (rng.integers(0, 26, total) + ord("a")).astype(np.uint8)
    chars[rng.integers(0, 13, total) == 0] = ord(special)
    arr = _strings(lengths, chars)
    return pc.utf8_trim(arr, " ") if special == " " else arr


class _Extra:
    """The spec's ``nextExtra``: random letters so that an event's size averages ``avg`` bytes (x scale), cut
    from one reusable random string at random offsets."""

    def __init__(self, rng: np.random.Generator, scale: float) -> None:
        self.rng, self.scale = rng, scale
        self.pool = (rng.integers(0, 26, 1 << 20) + ord("a")).astype(np.uint8)

    def __call__(self, current: np.ndarray, avg: int) -> pa.Array:
        desired = np.round(np.maximum(avg - current, 0) * self.scale).astype(np.int64)
        delta = np.round(desired * 0.2).astype(np.int64)
        lengths = desired - delta + _randint(self.rng, np.maximum(2 * delta, 1)) * (delta > 0)
        starts = _randint(self.rng, len(self.pool) - lengths)
        offs = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offs[1:])
        idx = np.repeat(starts - offs[:-1], lengths) + np.arange(int(offs[-1]))
        return _strings(lengths, self.pool[idx])


def _join(*parts: pa.Array | str) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def _base_url(rng: np.random.Generator, n: int) -> pa.Array:
    dirs = [next_string(rng, n, 5, "_") for _ in range(3)]
    return _join("https://www.nexmark.com/", dirs[0], "/", dirs[1], "/", dirs[2], "/", "item.htm?query=1")


def _reverse_bits_abs(i: np.ndarray) -> np.ndarray:
    """Java's ``Math.abs(Integer.reverse(i))`` (int32 arithmetic: abs(MIN_VALUE) stays MIN_VALUE)."""
    x = i.astype(np.uint32)
    r = np.zeros_like(x)
    for b in range(32):
        r |= ((x >> np.uint32(b)) & np.uint32(1)) << np.uint32(31 - b)
    s = r.view(np.int32).astype(np.int64)
    return np.where(s == -(2 ** 31), s, np.abs(s))


def _channel_table(seed: int) -> tuple[list[str], list[str]]:
    """Channels and urls: the 4 hot channels with their urls, then ``channel-<n>`` for n < 10000."""
    rng = np.random.default_rng([seed, 99])
    hot_urls = _base_url(rng, len(HOT_CHANNELS)).to_pylist()
    urls = _base_url(rng, CHANNELS_NUMBER).to_pylist()
    with_id = rng.integers(0, 10, CHANNELS_NUMBER) > 0
    ids = _reverse_bits_abs(np.arange(CHANNELS_NUMBER))
    urls = [u + f"&channel_id={ids[n]}" if with_id[n] else u for n, u in enumerate(urls)]
    return list(HOT_CHANNELS) + [f"channel-{n}" for n in range(CHANNELS_NUMBER)], hot_urls + urls


# --- the three event kinds -----------------------------------------------------------------------------------
def _persons(c: NexmarkConfig, ev: np.ndarray, ts: np.ndarray, seed: int) -> dict:
    rng = np.random.default_rng([seed, 1])
    n = len(ev)
    first = np.array(FIRST_NAMES, dtype=object)[rng.integers(0, len(FIRST_NAMES), n)]
    last = np.array(LAST_NAMES, dtype=object)[rng.integers(0, len(LAST_NAMES), n)]
    name = pa.array([f"{a} {b}" for a, b in zip(first, last)], pa.string())
    email = _join(next_string(rng, n, 7), "@", next_string(rng, n, 5), ".com")
    cards = rng.integers(0, 10_000, (n, 4))
    card = pa.array([f"{a:04d} {b:04d} {c_:04d} {d:04d}" for a, b, c_, d in cards], pa.string())
    city = pa.array(np.array(US_CITIES, dtype=object)[rng.integers(0, len(US_CITIES), n)], pa.string())
    state = pa.array(np.array(US_STATES, dtype=object)[rng.integers(0, len(US_STATES), n)], pa.string())
    size = 8 + sum(pc.utf8_length(a).to_numpy(zero_copy_only=False).astype(np.int64)
                   for a in (name, email, card, city, state))
    extra = _Extra(rng, c.extra_scale)(size, c.avg_person_bytes)
    return {"id": last_base0_person_id(c, ev) + FIRST_PERSON_ID, "name": name, "email_address": email,
            "credit_card": card, "city": city, "state": state, "date_time": ts * _MS, "extra": extra}


def _auctions(c: NexmarkConfig, ev: np.ndarray, ts: np.ndarray, seed: int) -> dict:
    rng = np.random.default_rng([seed, 2])
    n = len(ev)
    last_person = last_base0_person_id(c, ev)
    hot = rng.integers(0, c.hot_sellers_ratio, n) > 0
    seller = np.where(hot, (last_person // HOT_BATCH) * HOT_BATCH, next_base0_person_id(c, ev, rng))
    category = FIRST_CATEGORY_ID + rng.integers(0, NUM_CATEGORIES, n)
    initial = next_price(rng, n)
    # expiry: 1 + randint(2 * horizon), horizon = time until num_in_flight_auctions more auctions exist
    ahead = (c.num_in_flight_auctions * c.total_proportion) // c.auction_proportion
    horizon = c.timestamp_ms(ev + ahead) - ts
    expires = ts + 1 + _randint(rng, np.maximum(horizon * 2, 1))
    item = next_string(rng, n, 20)
    desc = next_string(rng, n, 100)
    reserve = initial + next_price(rng, n)
    size = (8 + pc.utf8_length(item).to_numpy(zero_copy_only=False).astype(np.int64)
            + pc.utf8_length(desc).to_numpy(zero_copy_only=False).astype(np.int64) + 40)
    extra = _Extra(rng, c.extra_scale)(size, c.avg_auction_bytes)
    return {"id": last_base0_auction_id(c, ev) + FIRST_AUCTION_ID, "item_name": item, "description": desc,
            "initial_bid": initial, "reserve": reserve, "date_time": ts * _MS, "expires": expires * _MS,
            "seller": seller + FIRST_PERSON_ID, "category": category, "extra": extra}


def _bids(c: NexmarkConfig, ev: np.ndarray, ts: np.ndarray, seed: int) -> dict:
    rng = np.random.default_rng([seed, 3])
    n = len(ev)
    last_auction = last_base0_auction_id(c, ev)
    hot_a = rng.integers(0, c.hot_auction_ratio, n) > 0
    auction = np.where(hot_a, (last_auction // HOT_BATCH) * HOT_BATCH, next_base0_auction_id(c, ev, rng))
    last_person = last_base0_person_id(c, ev)
    hot_b = rng.integers(0, c.hot_bidders_ratio, n) > 0
    hot_bidder = (last_person // HOT_BATCH) * HOT_BATCH + 1
    if c.id_lead == 0:  # "earlier persons": the batch's second person may not exist yet
        hot_bidder = np.minimum(hot_bidder, last_person)
    bidder = np.where(hot_b, hot_bidder, next_base0_person_id(c, ev, rng))
    price = next_price(rng, n)
    channels, urls = _channel_table(seed)
    hot_c = rng.integers(0, 2, n) > 0
    pick = np.where(hot_c, rng.integers(0, len(HOT_CHANNELS), n),
                    len(HOT_CHANNELS) + rng.integers(0, CHANNELS_NUMBER, n))
    extra = _Extra(rng, c.extra_scale)(np.full(n, 32, dtype=np.int64), c.avg_bid_bytes)
    return {"auction": auction + FIRST_AUCTION_ID, "bidder": bidder + FIRST_PERSON_ID, "price": price,
            "channel": pa.array(channels).take(pa.array(pick)), "url": pa.array(urls).take(pa.array(pick)),
            "date_time": ts * _MS, "extra": extra}


def generate_tables(c: NexmarkConfig) -> dict[str, pa.Table]:
    """All events as three tables (columns of the schemas plus ``_partition``), each row with its arrival
    ``_ingest_ts``; rows sorted by (partition, ``_ingest_ts``, event number)."""
    ev = np.arange(c.events, dtype=np.int64)
    ts = c.timestamp_ms(ev)
    rng = np.random.default_rng([c.seed, 0])
    partition = rng.integers(0, c.partitions, c.events)
    arrival = ts + rng.integers(0, c.max_delay_ms + 1, c.events)
    kind = ev % c.total_proportion
    sel = {"person": kind < c.person_proportion,
           "auction": (kind >= c.person_proportion) & (kind < c.person_proportion + c.auction_proportion),
           "bid": kind >= c.person_proportion + c.auction_proportion}
    makers = {"person": _persons, "auction": _auctions, "bid": _bids}
    out = {}
    for name, mask in sel.items():
        cols = makers[name](c, ev[mask], ts[mask], c.seed)
        schema = SCHEMAS[name]
        arrays = [pa.array(cols[f.name], f.type) if not isinstance(cols[f.name], pa.Array)
                  else cols[f.name].cast(f.type) for f in schema if f.name != "_ingest_ts"]
        t = pa.Table.from_arrays(arrays + [pa.array(arrival[mask] * _MS, TS)],
                                 schema=schema)
        t = t.append_column("_partition", pa.array(partition[mask], pa.int32()))
        t = t.append_column("_event", pa.array(ev[mask], pa.int64()))
        out[name] = t.sort_by([("_partition", "ascending"), ("_ingest_ts", "ascending"), ("_event", "ascending")])
    return out


def write_sources(root: str, c: NexmarkConfig) -> dict:
    """Write the three sources under ``root`` (``file://`` or ``s3://``); returns a summary (rows per source,
    files, event-time range)."""
    from pipeline.fileio import file_io_for, join_uri
    fio = file_io_for(root)
    tables = generate_tables(c)
    file_us = int(c.file_seconds * 1_000_000)
    base_us = c.base_ms * _MS
    summary: dict = {"config": asdict(c), "rows": {}, "files": {}}
    for name, t in tables.items():
        part = t["_partition"].to_numpy()
        bucket = (t["_ingest_ts"].cast(pa.int64()).to_numpy() - base_us) // file_us
        files = 0
        for p in range(c.partitions):
            idx = np.nonzero(part == p)[0]
            if not len(idx):
                continue
            seq = 0
            for b in np.unique(bucket[idx]):
                rows = idx[bucket[idx] == b]
                seq += 1
                buf = io.BytesIO()
                pq.write_table(t.take(pa.array(rows)).select(SCHEMAS[name].names), buf, compression="snappy")
                fio.write_bytes(join_uri(root, name, f"partition={p}", f"{seq:08d}.parquet"), buf.getvalue())
                files += 1
        summary["rows"][name] = t.num_rows
        summary["files"][name] = files
    # q13's bounded side input (Nexmark's side_input: key k in [0, 10000), value = k as a string), immutable
    buf = io.BytesIO()
    pq.write_table(pa.table({"key": pa.array(range(SIDE_INPUT_ROWS), pa.int64()),
                             "value": [str(k) for k in range(SIDE_INPUT_ROWS)]}), buf)
    fio.write_bytes(join_uri(root, "side_input", "side_input.parquet"), buf.getvalue())
    last = c.timestamp_ms(np.array([max(c.events - 1, 0)]))[0]
    summary["event_time"] = [c.base_ms, int(last) + c.max_delay_ms]
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="source root URI (file:// or s3://)")
    d = NexmarkConfig()
    for f in ("events", "rate", "seed", "partitions", "base_time", "max_delay_ms", "file_seconds", "extra_scale",
              "hot_auction_ratio", "hot_sellers_ratio", "hot_bidders_ratio", "num_active_people",
              "num_in_flight_auctions", "id_lead"):
        v = getattr(d, f)
        ap.add_argument("--" + f.replace("_", "-"), type=type(v), default=v)
    a = ap.parse_args(argv)
    kw = {k: v for k, v in vars(a).items() if k != "root"}
    print(json.dumps(write_sources(a.root, NexmarkConfig(**kw)), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
