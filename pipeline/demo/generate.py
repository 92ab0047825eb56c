"""Deterministic data generator for the demo job ``orders_payments``.

Writes the two sources in the layout of the source contract, through FileIO (``file://`` or ``s3://``),
one atomic write per file::

    <root>/orders/partition=<p>/<seq:08d>.parquet      order_id, customer_id, merchant_id, amount,
                                                        event_time, _ingest_ts
    <root>/payments/partition=<p>/<seq:08d>.parquet    payment_id, order_id, amount, status,
                                                        event_time, _ingest_ts
    <root>/_generator.json                              the timeline's config and progress (for append)

Timeline
    Generator epoch ``r`` covers ``_ingest_ts`` in ``[start + r*E, start + (r+1)*E)``; with the default
    ``start`` (aligned to ``E``) that is pipeline epoch ``start // E + r``. Per epoch and partition there
    are ``files_per_epoch`` files, file ``k`` holding the rows of the ``k``-th equal slice of the epoch, so
    ``_ingest_ts`` never decreases within a partition; rows in a file are sorted by ``_ingest_ts``. ``seq``
    counts files per partition from 0 (it is also bumped by the bad files below).

Orders and payments
    Epoch ``r`` creates ``orders_per_epoch`` orders in random partitions, ``order_id = o-<r:06d>-<i:07d>``
    (unique). Merchants are zipf-distributed (``m<k:05d>``), customers uniform (``c<k:08d>``), amounts
    log-normal rounded to cents (>= 1.00). Each order gets, independently:

    * a ``captured`` payment with probability 0.85 (``payment_id = p-<r:06d>-<i:07d>-c``, same amount);
      it arrives 1-2 epochs *before* its order (8%), 1-12 epochs later (30%, geometric, mean 3) or in the
      same epoch, in a random payments partition;
    * a ``failed`` payment with probability 0.12 (``...-f``), between 1 s and min(120 s, epoch length)
      before the capture time (so for paid orders the failure comes first);

    so every order has at most one captured payment. All of epoch ``r`` is a pure function of
    ``(seed, r)`` and the config: ``generate(epochs=24)`` and ``generate(epochs=12)`` followed by
    ``generate(epochs=12, append=True)`` write identical data. Payments due in epochs not generated yet
    appear when those epochs are appended.

Bad records (``bad_records=True``; placed in the first epoch ``a`` written by that call)
    1. ``orders/partition=0``: an extra file right after epoch ``a``'s files whose bytes are not Parquet
       (unreadable: dead-lettered whole).
    2. ``orders/partition=1 % P``: an extra Parquet file after epoch ``a``'s files with 3 orders
       ``o-badschema-<a:06d>-<i>`` where ``merchant_id`` is missing (the column is called ``merchant``):
       schema mismatch, all 3 rows dead-lettered. ``_ingest_ts`` = end of epoch ``a`` - 1 us.
    3. ``orders/partition=2 % P``, last file of epoch ``a``: 3 extra rows, 2 with a null ``order_id`` and
       1 with ``order_id = ""`` (dead-lettered per record).
    4. ``payments/partition=0``, last file of epoch ``a``: 2 extra ``captured`` rows, one with a null and one
       with an empty ``order_id`` (payment ids ``p-badkey-<a:06d>-<i>``).

    The oracle (:mod:`pipeline.demo.oracle`) skips exactly these: unreadable files, files missing a
    declared column, records with a null/empty key or a null ``_ingest_ts``.

CLI: ``python -m pipeline.demo.generate --root URI [--epochs N] [--append] [--bad-records] ...`` prints a
JSON summary.

Over 400 lines: the demo's data generator, one concept, outside the library.
"""
from __future__ import annotations

import argparse
import io
import json
import math
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.exceptions import ConfigError, EpochalError
from pipeline.fileio import file_io_for, join_uri
from pipeline.jobs.orders_payments import ORDERS_SCHEMA, PAYMENTS_SCHEMA  # the job's schemas: one definition

__all__ = ["ORDERS_SCHEMA", "PAYMENTS_SCHEMA", "GeneratorConfig", "GenerateSummary", "generate", "main",
           "STATE_FILE", "PAID_PROB", "FAILED_PROB"]

TS = pa.timestamp("us", tz="UTC")
STATE_FILE = "_generator.json"
PAID_PROB = 0.85
FAILED_PROB = 0.12
EARLY_PROB = 0.08
LATE_PROB = 0.30
LATE_MEAN_EPOCHS = 3.0
MAX_LATE_EPOCHS = 12
MAX_EARLY_EPOCHS = 2
ZIPF_S = 1.1
_US = 1_000_000

_DEFAULTS: dict[str, Any] = dict(start="2026-01-01T00:00:00Z", epoch_seconds=60, partitions=4,
                                 orders_per_epoch=1000, seed=42, files_per_epoch=1, merchants=500,
                                 customers=None, file_format="parquet")


@dataclass(frozen=True, slots=True)
class GeneratorConfig:
    """The timeline's parameters (stored in ``_generator.json``; fixed for appends)."""

    start: str
    epoch_seconds: int
    partitions: int
    orders_per_epoch: int
    seed: int
    files_per_epoch: int
    merchants: int
    customers: int
    file_format: str

    def __post_init__(self) -> None:
        if self.epoch_seconds < 1 or self.partitions < 1 or self.orders_per_epoch < 0 or self.files_per_epoch < 1:
            raise ConfigError(f"invalid generator config {self}")
        if self.merchants < 1 or self.customers < 1:
            raise ConfigError("merchants and customers must be >= 1")
        if self.file_format not in ("parquet", "jsonl"):
            raise ConfigError(f"file_format must be parquet or jsonl, not {self.file_format!r}")
        if self.epoch_seconds * _US % self.files_per_epoch:
            raise ConfigError("epoch length (us) must be divisible by files_per_epoch")
        _parse_start(self.start)

    @property
    def start_us(self) -> int:
        return _parse_start(self.start)

    @property
    def epoch_us(self) -> int:
        return self.epoch_seconds * _US


@dataclass(frozen=True, slots=True)
class GenerateSummary:
    root: str
    first_epoch: int
    epochs_written: int
    epochs_total: int
    start: str
    end: str  # end of the last generated epoch (exclusive _ingest_ts bound)
    epoch_seconds: int
    partitions: int
    rows: dict[str, int]
    files: dict[str, int]
    bad_records: dict[str, Any] | None = None
    totals: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _parse_start(s: str) -> int:
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError as e:
        raise ConfigError(f"start {s!r} is not an ISO-8601 timestamp") from e
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    delta = dt - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * _US + delta.microseconds


def _iso(us: int) -> str:
    dt = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=us)
    return dt.isoformat().replace("+00:00", "Z")


# ----------------------------------------------------------------------------------------------------
# The timeline: everything of order-epoch r is a pure function of (config, r)
# ----------------------------------------------------------------------------------------------------
class _Timeline:
    def __init__(self, c: GeneratorConfig) -> None:
        self.c = c
        self.E = c.epoch_us
        self.start = c.start_us
        w = 1.0 / np.arange(1, c.merchants + 1) ** ZIPF_S
        self.merchant_p = w / w.sum()
        self.merchant_names = pc.binary_join_element_wise(
            "m", pc.utf8_lpad(pc.cast(pa.array(np.arange(c.merchants)), pa.string()), 5, "0"), "")
        self.customer_names = pc.binary_join_element_wise(
            "c", pc.utf8_lpad(pc.cast(pa.array(np.arange(c.customers)), pa.string()), 8, "0"), "")
        self.delta_max = max(2 * _US, min(120 * _US, self.E))  # failed attempt: [1 s, delta_max) before capture
        self.early_span = MAX_EARLY_EPOCHS + (self.delta_max - 1) // self.E + 1
        self._cache: dict[int, dict[str, Any]] = {}

    def epoch(self, r: int) -> dict[str, Any]:
        hit = self._cache.get(r)
        if hit is None:
            hit = self._cache[r] = self._make(r)
        return hit

    def forget_before(self, r: int) -> None:
        for k in [k for k in self._cache if k < r]:
            del self._cache[k]

    def _make(self, r: int) -> dict[str, Any]:
        c, E, S = self.c, self.E, self.start
        rng = np.random.default_rng([c.seed, 20260101, r])
        n = c.orders_per_epoch
        merchant = rng.choice(c.merchants, size=n, p=self.merchant_p)
        customer = rng.integers(0, c.customers, size=n)
        amount = np.round(np.maximum(1.0, rng.lognormal(3.5, 1.0, size=n)), 2)
        o_part = rng.integers(0, c.partitions, size=n)
        o_ts = S + r * E + rng.integers(0, E, size=n)
        o_event = o_ts - rng.integers(0, 10 * _US, size=n)
        paid = rng.random(n) < PAID_PROB
        failed = rng.random(n) < FAILED_PROB
        v = rng.random(n)
        early = v < EARLY_PROB
        late = (~early) & (v < EARLY_PROB + LATE_PROB)
        d = np.zeros(n, dtype=np.int64)
        d_early = -rng.integers(1, MAX_EARLY_EPOCHS + 1, size=n)
        d_late = np.minimum(rng.geometric(1.0 / LATE_MEAN_EPOCHS, size=n), MAX_LATE_EPOCHS)
        d[early] = d_early[early]
        d[late] = d_late[late]
        cap_epoch = np.maximum(0, r + d)
        cap_ts = S + cap_epoch * E + rng.integers(0, E, size=n)
        cap_part = rng.integers(0, c.partitions, size=n)
        cap_event = cap_ts - rng.integers(0, 5 * _US, size=n)
        fail_ts = np.maximum(S, cap_ts - rng.integers(_US, self.delta_max, size=n))
        fail_part = rng.integers(0, c.partitions, size=n)
        fail_event = fail_ts - rng.integers(0, 5 * _US, size=n)
        idx = pc.utf8_lpad(pc.cast(pa.array(np.arange(n)), pa.string()), 7, "0")
        order_id = pc.binary_join_element_wise(f"o-{r:06d}-", idx, "")
        orders = dict(order_id=order_id, customer_id=self.customer_names.take(pa.array(customer)),
                      merchant_id=self.merchant_names.take(pa.array(merchant)), amount=amount,
                      event_time=o_event, _ingest_ts=o_ts, part=o_part, tie=np.arange(n, dtype=np.int64),
                      epoch=np.full(n, r, dtype=np.int64))
        ci, fi = np.flatnonzero(paid), np.flatnonzero(failed)
        pay_id = pa.concat_arrays([
            pc.binary_join_element_wise(f"p-{r:06d}-", idx.take(pa.array(ci)), "-c", ""),
            pc.binary_join_element_wise(f"p-{r:06d}-", idx.take(pa.array(fi)), "-f", "")])
        p_ts = np.concatenate([cap_ts[ci], fail_ts[fi]])
        payments = dict(
            payment_id=pay_id, order_id=order_id.take(pa.array(np.concatenate([ci, fi]))),
            amount=np.concatenate([amount[ci], amount[fi]]),
            status=pa.concat_arrays([pa.repeat(pa.scalar("captured"), len(ci)),
                                     pa.repeat(pa.scalar("failed"), len(fi))]),
            event_time=np.concatenate([cap_event[ci], fail_event[fi]]), _ingest_ts=p_ts,
            part=np.concatenate([cap_part[ci], fail_part[fi]]),
            tie=np.concatenate([r * 4 * n + 2 * ci, r * 4 * n + 2 * fi + 1]).astype(np.int64),
            epoch=(p_ts - S) // E)
        return {"orders": orders, "payments": payments}

    def payments_in(self, t: int) -> dict[str, Any]:
        parts = []
        for r in range(max(0, t - MAX_LATE_EPOCHS), t + self.early_span + 1):
            p = self.epoch(r)["payments"]
            sel = np.flatnonzero(p["epoch"] == t)
            if len(sel):
                parts.append(_take(p, sel))
        return _concat(parts, PAYMENTS_SCHEMA)


def _take(cols: dict[str, Any], sel: np.ndarray) -> dict[str, Any]:
    idx = pa.array(sel)
    return {k: (v.take(idx) if isinstance(v, pa.Array) else v[sel]) for k, v in cols.items()}


def _concat(parts: list[dict[str, Any]], schema: pa.Schema) -> dict[str, Any]:
    if not parts:
        out: dict[str, Any] = {f.name: (pa.array([], f.type) if f.type == pa.string() else np.array([]))
                               for f in schema}
        out.update(part=np.array([], dtype=np.int64), tie=np.array([], dtype=np.int64),
                   epoch=np.array([], dtype=np.int64), _ingest_ts=np.array([], dtype=np.int64),
                   event_time=np.array([], dtype=np.int64), amount=np.array([], dtype=np.float64))
        return out
    return {k: (pa.concat_arrays([p[k] for p in parts]) if isinstance(parts[0][k], pa.Array)
                else np.concatenate([p[k] for p in parts])) for k in parts[0]}


def _table(cols: dict[str, Any], sel: np.ndarray, schema: pa.Schema) -> pa.Table:
    idx = pa.array(sel, type=pa.int64())
    arrays = []
    for f in schema:
        v = cols[f.name]
        if isinstance(v, pa.Array):
            arrays.append(v.take(idx))
        elif f.type == TS:
            arrays.append(pa.array(np.asarray(v)[sel].astype(np.int64), pa.int64()).cast(TS))
        else:
            arrays.append(pa.array(np.asarray(v)[sel], f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _encode(table: pa.Table, fmt: str) -> bytes:
    if fmt == "parquet":
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="snappy")
        return buf.getvalue()
    cols = {}
    for f in table.schema:
        col = table.column(f.name)
        cols[f.name] = pc.strftime(col, format="%Y-%m-%dT%H:%M:%SZ") if pa.types.is_timestamp(f.type) else col
    lines = []
    for row in pa.table(cols).to_pylist():
        lines.append(json.dumps(row, separators=(",", ":")))
    return ("\n".join(lines) + ("\n" if lines else "")).encode("utf-8")


# ----------------------------------------------------------------------------------------------------
# generate()
# ----------------------------------------------------------------------------------------------------
def _load_state(root: str) -> dict[str, Any] | None:
    fio = file_io_for(root)
    uri = join_uri(root, STATE_FILE)
    if not fio.exists(uri):
        return None
    try:
        return json.loads(fio.read_bytes(uri))
    except (ValueError, UnicodeDecodeError) as e:
        raise ConfigError(f"generator state {uri} is unreadable: {e}") from e


def generate(source_root_uri: str, *, start: str | None = None, epochs: int = 24, epoch_seconds: int | None = None,
             partitions: int | None = None, orders_per_epoch: int | None = None, seed: int | None = None,
             files_per_epoch: int | None = None, append: bool = False, bad_records: bool = False,
             merchants: int | None = None, customers: int | None = None,
             file_format: str | None = None) -> GenerateSummary:
    """Write ``epochs`` epochs of orders and payments under ``source_root_uri`` (see the module doc).

    ``append=True`` continues the timeline stored in ``<root>/_generator.json``; the stored config wins and
    passing a different value for one of its keys is an error. Without ``append`` the root must be new.
    

    Over 80 lines: one pass that writes every file in epoch order, with the knobs resolved at the top.
    Over 8 parameters: the generator's knobs, each a keyword with a default from the config."""
    root = source_root_uri.rstrip("/")
    fio = file_io_for(root)
    given = dict(start=start, epoch_seconds=epoch_seconds, partitions=partitions,
                 orders_per_epoch=orders_per_epoch, seed=seed, files_per_epoch=files_per_epoch,
                 merchants=merchants, customers=customers, file_format=file_format)
    state = _load_state(root)
    if epochs < 0:
        raise ConfigError("epochs must be >= 0")
    if append:
        if state is None:
            raise ConfigError(f"append=True but {join_uri(root, STATE_FILE)} does not exist")
        cfg = GeneratorConfig(**state["config"])
        for k, v in given.items():
            if v is not None and v != getattr(cfg, k):
                raise ConfigError(f"append: {k}={v!r} differs from the stored timeline ({getattr(cfg, k)!r})")
    else:
        if state is not None or fio.list(join_uri(root, "orders")) or fio.list(join_uri(root, "payments")):
            raise ConfigError(f"{root} already holds generated data; use append=True or a fresh root")
        values: dict[str, Any] = {k: (v if v is not None else _DEFAULTS[k]) for k, v in given.items()}
        if values["customers"] is None:
            values["customers"] = max(100, 5 * values["orders_per_epoch"])
        cfg = GeneratorConfig(**values)
        state = {"version": 1, "config": asdict(cfg), "epochs": 0,
                 "next_seq": {"orders": [0] * cfg.partitions, "payments": [0] * cfg.partitions},
                 "rows": {"orders": 0, "payments": 0}, "files": {"orders": 0, "payments": 0},
                 "bad_records": []}
    tl = _Timeline(cfg)
    P, E, S, F = cfg.partitions, cfg.epoch_us, cfg.start_us, cfg.files_per_epoch
    ext = "parquet" if cfg.file_format == "parquet" else "jsonl"
    a = int(state["epochs"])
    rows = {"orders": 0, "payments": 0}
    files = {"orders": 0, "payments": 0}
    next_seq = state["next_seq"]
    bad_info: dict[str, Any] | None = None

    def write(source: str, p: int, data: bytes, n_rows: int, ext_: str = ext) -> str:
        seq = next_seq[source][p]
        next_seq[source][p] = seq + 1
        uri = join_uri(root, source, f"partition={p}", f"{seq:08d}.{ext_}")
        fio.write_bytes(uri, data)
        rows[source] += n_rows
        files[source] += 1
        return uri

    for t in range(a, a + epochs):
        tl.forget_before(t - MAX_LATE_EPOCHS)
        extra = _bad_rows(cfg, t) if (bad_records and t == a) else {}
        for source, cols, schema in (("orders", tl.epoch(t)["orders"], ORDERS_SCHEMA),
                                     ("payments", tl.payments_in(t), PAYMENTS_SCHEMA)):
            ts = np.asarray(cols["_ingest_ts"], dtype=np.int64)
            sub = ((ts - S - t * E) * F) // E
            key = np.asarray(cols["part"], dtype=np.int64) * F + sub
            order = np.lexsort((np.asarray(cols["tie"]), ts, key))
            bounds = np.searchsorted(key[order], np.arange(P * F + 1))
            for part in range(P):
                for chunk in range(F):
                    sel = order[bounds[part * F + chunk]:bounds[part * F + chunk + 1]]
                    table = _table(cols, sel, schema)
                    if chunk == F - 1 and (source, part) in extra:
                        table = _merge_sorted(table, extra[(source, part)])
                    write(source, part, _encode(table, cfg.file_format), table.num_rows)
                if bad_records and t == a:
                    for bsource, bp, data, n_bad, what in _bad_files(cfg, t):
                        if (bsource, bp) == (source, part):
                            uri = write(source, part, data, n_bad)
                            bad_info = bad_info or {}
                            bad_info[what] = uri
        state["epochs"] = t + 1
    if bad_records and epochs > 0:
        bad_info = dict(bad_info or {})
        bad_info.update(_bad_rows_doc(cfg, a))
        state["bad_records"].append(bad_info)
    state["next_seq"] = next_seq
    for s in ("orders", "payments"):
        state["rows"][s] += rows[s]
        state["files"][s] += files[s]
    fio.write_bytes(join_uri(root, STATE_FILE), json.dumps(state, indent=1, sort_keys=True).encode("utf-8"))
    total = int(state["epochs"])
    return GenerateSummary(root=root, first_epoch=a, epochs_written=epochs, epochs_total=total, start=cfg.start,
                           end=_iso(S + total * E), epoch_seconds=cfg.epoch_seconds, partitions=P, rows=rows,
                           files=files, bad_records=bad_info,
                           totals={"rows": dict(state["rows"]), "files": dict(state["files"]),
                                   "pipeline_first_epoch": S // E if S % E == 0 else None})


def _merge_sorted(table: pa.Table, extra: pa.Table) -> pa.Table:
    merged = pa.concat_tables([table, extra])
    ts = merged.column("_ingest_ts").cast(pa.int64()).to_numpy()
    order = np.argsort(ts, kind="stable")
    return merged.take(pa.array(order))


def _bad_rows(cfg: GeneratorConfig, t: int) -> dict[tuple[str, int], pa.Table]:
    """Extra rows with null / empty order_id, put into the last file of epoch t (items 3 and 4)."""
    S, E = cfg.start_us, cfg.epoch_us
    mid = S + t * E + (E * (cfg.files_per_epoch * 2 - 1)) // (cfg.files_per_epoch * 2)  # inside the last slice
    ts = pa.array([mid, mid + 1, mid + 2], pa.int64()).cast(TS)
    orders = pa.Table.from_arrays([
        pa.array([None, None, ""], pa.string()), pa.array(["c00000001"] * 3), pa.array(["m00000"] * 3),
        pa.array([10.0, 20.0, 30.0]), ts, ts], schema=ORDERS_SCHEMA)
    payments = pa.Table.from_arrays([
        pa.array([f"p-badkey-{t:06d}-0", f"p-badkey-{t:06d}-1"]), pa.array([None, ""], pa.string()),
        pa.array([10.0, 20.0]), pa.array(["captured", "captured"]), ts.slice(0, 2), ts.slice(0, 2)],
        schema=PAYMENTS_SCHEMA)
    return {("orders", 2 % cfg.partitions): orders, ("payments", 0): payments}


def _bad_rows_doc(cfg: GeneratorConfig, t: int) -> dict[str, Any]:
    return {"null_or_empty_order_id": {"orders": {"partition": 2 % cfg.partitions, "epoch": t, "rows": 3},
                                       "payments": {"partition": 0, "epoch": t, "rows": 2}}}


def _bad_files(cfg: GeneratorConfig, t: int) -> list[tuple[str, int, bytes, int, str]]:
    """(source, partition, bytes, rows, label) of the bad files written after epoch t's files."""
    ext_ok = cfg.file_format
    garbage = b"PAR1" + b"this is not a parquet file; the generator wrote it on purpose" + b"PAR1"
    if ext_ok == "jsonl":
        garbage = b'{"order_id": "o-broken", "amount": \n this is not JSON\n'
    ts = pa.array([cfg.start_us + (t + 1) * cfg.epoch_us - 1] * 3, pa.int64()).cast(TS)
    mismatch = pa.table({"order_id": pa.array([f"o-badschema-{t:06d}-{i}" for i in range(3)]),
                         "customer_id": pa.array(["c00000001"] * 3), "merchant": pa.array(["m00000"] * 3),
                         "amount": pa.array([1.0, 2.0, 3.0]), "event_time": ts, "_ingest_ts": ts})
    return [("orders", 0, garbage, 0, "unreadable_file"),
            ("orders", 1 % cfg.partitions, _encode(mismatch, cfg.file_format), 3, "schema_mismatch_file")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.demo.generate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="source root URI (file:///abs/path or s3://bucket/prefix)")
    ap.add_argument("--epochs", type=int, default=24)
    ap.add_argument("--start", help=f"first epoch start, ISO-8601 UTC (default {_DEFAULTS['start']})")
    ap.add_argument("--epoch-seconds", type=int)
    ap.add_argument("--partitions", type=int)
    ap.add_argument("--orders-per-epoch", type=int)
    ap.add_argument("--orders", type=int, help="total orders; sets --orders-per-epoch = ceil(orders / epochs)")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--files-per-epoch", type=int)
    ap.add_argument("--merchants", type=int)
    ap.add_argument("--customers", type=int)
    ap.add_argument("--format", dest="file_format", choices=("parquet", "jsonl"))
    ap.add_argument("--append", action="store_true", help="continue the timeline in <root>/_generator.json")
    ap.add_argument("--bad-records", action="store_true", help="add the documented bad files and rows")
    a = ap.parse_args(argv)
    root = a.root
    if "://" not in root:
        import os

        root = "file://" + os.path.abspath(root)
    ope = a.orders_per_epoch
    if a.orders is not None:
        ope = math.ceil(a.orders / max(1, a.epochs))
    try:
        summary = generate(root, start=a.start, epochs=a.epochs, epoch_seconds=a.epoch_seconds,
                           partitions=a.partitions, orders_per_epoch=ope, seed=a.seed,
                           files_per_epoch=a.files_per_epoch, append=a.append, bad_records=a.bad_records,
                           merchants=a.merchants, customers=a.customers, file_format=a.file_format)
    except EpochalError as e:
        print(f"error: {e}", file=sys.stderr)
        return getattr(e, "exit_code", 1)
    print(json.dumps(summary.to_dict(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
