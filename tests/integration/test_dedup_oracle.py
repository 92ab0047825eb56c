"""``deduplicate`` against an oracle that shares no code with Epochal (issue 29, item 8).

The source files are written here with pyarrow; the expected output is a DuckDB query over those files (the first
row per key by ``_ingest_ts``, among the rows before the end of the last completed epoch); the actual output is the
Delta sink read with delta-rs. Neither side uses Epochal's reader, batch plan or sink code. Repeats of a key fall in
other epochs than its first row (several per key, across partitions), so "first" is unambiguous; the DuckDB
references of the Nexmark tests (tests/nexmark) cover windows, joins and aggregates the same way.
"""
from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.spark

E = 60
EPOCHS = 5
TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("event_id", pa.string()), ("device", pa.string()), ("value", pa.float64()),
                    ("event_time", TS), ("_ingest_ts", TS)])
T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _write_sources(src: Path, seed: int = 5) -> None:
    rnd = random.Random(seed)
    ids = [f"e{i:04d}" for i in range(300)]
    first = {i: rnd.randrange(EPOCHS) for i in ids}
    per: dict[tuple[int, int], list[dict]] = {}
    for i in ids:
        for k in range(1 + rnd.randrange(3)):          # the first row, then repeats in strictly later epochs
            ep = first[i] + k * (1 + rnd.randrange(2))
            if ep > EPOCHS:
                break
            t = T0 + timedelta(seconds=ep * E + rnd.uniform(0, E - 1))
            per.setdefault((ep, rnd.randrange(2)), []).append(
                {"event_id": i, "device": f"d{rnd.randrange(7)}", "value": round(rnd.uniform(0, 100), 3),
                 "event_time": t - timedelta(seconds=rnd.uniform(0, 5)), "_ingest_ts": t})
    for p in range(2):
        d = src / "events" / f"partition={p}"
        d.mkdir(parents=True)
        for ep in range(EPOCHS + 1):
            rows = sorted(per.get((ep, p), []), key=lambda r: r["_ingest_ts"])
            pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), d / f"{ep:08d}.parquet")


def _job():
    from pipeline.job import Job
    job = Job("dedup_oracle", max_parallelism=16)
    job.source("events", SCHEMA, key="event_id") \
        .deduplicate(uid="event_dedup", key="event_id").sink("unique_events", format="delta")
    return job


def test_dedup_equals_a_duckdb_query_over_the_input_files(tmp_path):
    import duckdb
    from deltalake import DeltaTable

    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner

    src = tmp_path / "src"
    _write_sources(src)
    epoch0 = int(T0.timestamp()) // E
    cfg = load_config(env={}, source_uri=src.as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri(), epoch_seconds=E, parallelism=2,
                      clock_now=(T0 + timedelta(seconds=(EPOCHS + 3) * E)).isoformat())
    r = JobRunner(_job(), cfg, echo=lambda m: None)
    rep = r.run()
    assert rep.completed, rep.to_dict()
    last = r.coordinator.store.latest().metadata.epoch
    assert last >= epoch0 + EPOCHS - 1
    end = datetime.fromtimestamp((last + 1) * E, tz=UTC)

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    want = con.execute(
        "SELECT event_id, device, value, event_time FROM ("
        "  SELECT *, row_number() OVER (PARTITION BY event_id ORDER BY _ingest_ts) AS rn"
        f"  FROM read_parquet('{src}/events/*/*.parquet') WHERE _ingest_ts < ?) WHERE rn = 1 ORDER BY event_id",
        [end]).fetch_arrow_table()
    table = [p for p in (tmp_path / "sink").rglob("_delta_log") if p.is_dir()]
    assert len(table) == 1, table
    got = DeltaTable(str(table[0].parent)).to_pyarrow_table().select(["event_id", "device", "value", "event_time"])
    got = got.sort_by("event_id")
    assert want.num_rows > 200
    assert got.column("event_id").to_pylist() == want.column("event_id").to_pylist()
    for c in ("device", "value"):
        assert got.column(c).to_pylist() == want.column(c).to_pylist(), c
    as_us = [int(v.timestamp() * 1_000_000) for v in got.column("event_time").to_pylist()]
    assert as_us == [int(v.timestamp() * 1_000_000) for v in want.column("event_time").to_pylist()]
