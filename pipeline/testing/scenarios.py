"""Alignment scenarios on top of the demo data (:mod:`pipeline.demo.generate`): a backlog and a lagging partition.

* :func:`write_burst` - **backlog**: one input bursts. A new ``orders`` partition receives ``rows`` extra
  orders (``o-burst-...``, never paid) whose ``_ingest_ts`` lie inside one generator epoch. With
  ``PIPELINE_MAX_RECORDS_PER_EPOCH`` below ``rows`` that partition needs several rounds to reach its
  barrier while every other channel reaches it at once. The oracle (:mod:`pipeline.demo.oracle`) reads the
  partition like any other (the orders have no captured payment, so they produce no output).
* :func:`hold_back` / :func:`deliver` - **lagging partition**: the files of one partition from a given
  generator epoch on are taken out of the source (they "have not arrived yet") and written back later,
  unchanged and under the same names. While they are missing, and the clock (``PIPELINE_CLOCK_NOW``) has
  not passed the epoch end plus ``PIPELINE_ALLOWED_LATENESS_SECONDS``, the partition lags.
* :func:`epoch_bounds` - a generator epoch's pipeline epoch number and end time, to set the clock.
"""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.exceptions import SourceError
from pipeline.fileio import file_io_for, join_uri
from pipeline.state.backend import table_to_parquet_bytes

__all__ = ["EpochBounds", "epoch_bounds", "write_burst", "hold_back", "deliver", "iso"]

_US = 1_000_000
_TS = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class EpochBounds:
    epoch: int        # pipeline epoch number (epoch n = [n*E, (n+1)*E) seconds since the Unix epoch)
    start_us: int
    end_us: int


def _generator(source_root: str) -> dict:
    fio = file_io_for(source_root)
    return json.loads(fio.read_bytes(join_uri(source_root.rstrip("/"), "_generator.json")))["config"]


def epoch_bounds(source_root: str, r: int) -> EpochBounds:
    """Generator epoch ``r`` of the data under ``source_root`` (read from its ``_generator.json``)."""
    cfg = _generator(source_root)
    start = datetime.fromisoformat(cfg["start"].replace("Z", "+00:00")).astimezone(UTC)
    e_us = int(cfg["epoch_seconds"]) * _US
    s_us = int(start.timestamp()) * _US + r * e_us
    return EpochBounds(s_us // e_us, s_us, s_us + e_us)


def iso(us: int) -> str:
    return datetime.fromtimestamp(us / _US, tz=UTC).isoformat().replace("+00:00", "Z")


def _source_schema(fio, source_uri: str) -> pa.Schema:
    """The schema of a source, read from one of its existing Parquet files (this module knows no job)."""
    for f in sorted(fio.list(source_uri), key=lambda f: f.uri):
        if f.uri.endswith(".parquet"):
            return pq.read_schema(io.BytesIO(fio.read_bytes(f.uri)))
    raise SourceError(f"no Parquet file under {source_uri} to take the source's schema from")


def write_burst(source_root: str, *, r: int, rows: int, seed: int = 7) -> str:
    """Write ``rows`` unpaid orders inside generator epoch ``r`` into a new ``orders`` partition; returns its URI."""
    cfg = _generator(source_root)
    root = source_root.rstrip("/")
    fio = file_io_for(root)
    schema = _source_schema(fio, join_uri(root, "orders"))
    existing = {int(d.split("=", 1)[1]) for d in fio.list_dirs(join_uri(root, "orders")) if d.startswith("partition=")}
    part = max(existing | {int(cfg["partitions"]) - 1}) + 1
    b = epoch_bounds(root, r)
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(b.start_us, b.end_us, size=rows))
    table = pa.table({
        "order_id": pa.array([f"o-burst-{r:06d}-{i:07d}" for i in range(rows)]),
        "customer_id": pa.array([f"c{int(x):08d}" for x in rng.integers(0, 1000, size=rows)]),
        "merchant_id": pa.array([f"m{int(x):05d}" for x in rng.integers(0, int(cfg["merchants"]), size=rows)]),
        "amount": pa.array(np.round(rng.uniform(1, 200, size=rows), 2)),
        "event_time": pa.array(ts, pa.int64()).cast(_TS),
        "_ingest_ts": pa.array(ts, pa.int64()).cast(_TS),
    }, schema=schema)
    uri = join_uri(root, "orders", f"partition={part}", "00000000.parquet")
    fio.write_bytes(uri, table_to_parquet_bytes(table))
    return uri


def hold_back(source_root: str, source: str, partition: int, *, from_r: int) -> list[tuple[str, bytes]]:
    """Remove the files of ``source``/``partition`` holding generator epochs ``>= from_r``; returns them
    (uri, bytes) for :func:`deliver`. Only for data written with ``files_per_epoch=1`` and no bad records,
    where file ``seq`` == generator epoch."""
    root = source_root.rstrip("/")
    fio = file_io_for(root)
    held = []
    for f in fio.list(join_uri(root, source, f"partition={partition}")):
        seq = int(f.uri.rsplit("/", 1)[1].split(".", 1)[0])
        if seq >= from_r:
            held.append((f.uri, fio.read_bytes(f.uri)))
    for uri, _ in held:
        fio.delete(uri)
    return sorted(held)


def deliver(held: list[tuple[str, bytes]]) -> None:
    """The late files arrive (written back unchanged, in order)."""
    for uri, data in held:
        file_io_for(uri).write_bytes(uri, data)
