"""A generator of broken source input for ``counts_job`` (source ``events``: event_id key, user, value,
_ingest_ts), each case with what must happen to it: which rows are good (in the oracle), how many dead-letter
records it must produce under ``PIPELINE_BAD_RECORDS=dead_letter``, and which file/partition a ``fail`` run
must name. Used by ``tests/reliability/test_fuzz_inputs.py``.

Kinds (the issue's list): truncated files, random bytes, empty files, schema drift (missing column, changed
type, extra column), encodings (non-UTF-8 JSON Lines, non-ASCII text), nulls (key, ``_ingest_ts``, grouping
key, value), huge values (int64 sums), decreasing timestamps, sequence gaps, late files and changed files
(arriving after the first run), badly named partition folders and files.

Every case lives in a partition of its own (``partition=<10+i>``); partitions 0 and 1 hold plain good data.
"""
from __future__ import annotations

import io
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.reliability.jobs import EVENTS_SCHEMA, T0, events_table

Row = tuple  # (event_id, user, value, seconds after T0)


@dataclass
class Case:
    kind: str
    partition: int
    good: list = field(default_factory=list)      # rows that must be counted (exactly once)
    dead: int = 0                                 # dead-letter records it must produce (dead_letter policy)
    names: str = ""                               # what a message about it must name (file name)
    late: Callable[[Path], None] | None = None    # what arrives after the first run (late/changed files)
    late_good: list = field(default_factory=list)  # rows of the late part that must be counted
    late_dead: int = 0
    fail_names_partition: bool = True             # a fail-policy message names "partition <p>" (layout breaches
    #                                               name the folder/file instead)


def _rows(tag: str, n: int, start_s: float, rng: random.Random, users: int = 5) -> list[Row]:
    return [(f"{tag}-{i}", f"u{rng.randrange(users)}", rng.randrange(1, 1000), start_s + i * 0.5) for i in range(n)]


def _dir(src: Path, p: int | str) -> Path:
    d = src / "events" / (f"partition={p}" if isinstance(p, int) else p)
    d.mkdir(parents=True, exist_ok=True)
    return d


def _parquet_bytes(tbl: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(tbl, buf)
    return buf.getvalue()


def _write(src: Path, p: int | str, name: str, data: bytes) -> str:
    (_dir(src, p) / name).write_bytes(data)
    return name


def _ts(s: float):
    return T0 + timedelta(seconds=s)


def build(src: Path, seed: int, kinds: list[str] | None = None) -> list[Case]:
    """Write the good partitions and one partition per case kind; returns the cases."""
    rng = random.Random(seed)
    good = []
    for p in (0, 1):
        for seq in (1, 2):
            rs = _rows(f"g{p}{seq}", 60, (seq - 1) * 40, rng)
            _write(src, p, f"{seq:08d}.parquet", _parquet_bytes(events_table(rs)))
            good += rs
    cases = [Case("good", 0, good)]
    all_kinds = [k for k in _KINDS if kinds is None or k in kinds]
    for i, kind in enumerate(all_kinds):
        p = 10 + i
        case = Case(kind, p)
        _KINDS[kind](src, case, rng)
        cases.append(case)
    return cases


# ---------------------------------------------------------------------------------------------- case kinds
def _truncated(src, c: Case, rng):
    ok = _rows(f"t{c.partition}", 30, 0, rng)
    _write(src, c.partition, "00000001.parquet", _parquet_bytes(events_table(ok)))
    data = _parquet_bytes(events_table(_rows(f"tt{c.partition}", 50, 20, rng)))
    c.names = _write(src, c.partition, "00000002.parquet", data[: rng.randrange(10, len(data) - 10)])
    c.good, c.dead = ok, 1


def _random_bytes(src, c: Case, rng):
    ok = _rows(f"r{c.partition}", 20, 0, rng)
    c.names = _write(src, c.partition, "00000001.parquet", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3000))))
    _write(src, c.partition, "00000002.parquet", _parquet_bytes(events_table([(e, u, v, t + 20) for e, u, v, t in ok])))
    c.good, c.dead = [(e, u, v, t + 20) for e, u, v, t in ok], 1


def _empty_file(src, c: Case, rng):
    ok = _rows(f"e{c.partition}", 20, 10, rng)
    c.names = _write(src, c.partition, "00000001.parquet", b"")
    _write(src, c.partition, "00000002.parquet", _parquet_bytes(events_table(ok)))
    c.good, c.dead = ok, 1


def _missing_column(src, c: Case, rng):
    rs = _rows(f"m{c.partition}", 12, 0, rng)
    tbl = events_table(rs).drop_columns(["value"])
    c.names = _write(src, c.partition, "00000001.parquet", _parquet_bytes(tbl))
    c.dead = len(rs)


def _changed_type(src, c: Case, rng):
    rs = _rows(f"c{c.partition}", 10, 0, rng)
    vals = [str(r[2]) if i % 2 else f"x{r[2]}" for i, r in enumerate(rs)]  # half castable, half not
    tbl = pa.table({"event_id": [r[0] for r in rs], "user": [r[1] for r in rs], "value": vals,
                    "_ingest_ts": [_ts(r[3]) for r in rs]})
    c.names = _write(src, c.partition, "00000001.parquet", _parquet_bytes(tbl))
    c.good = [r for i, r in enumerate(rs) if i % 2]
    c.dead = len(rs) - len(c.good)


def _extra_column(src, c: Case, rng):
    rs = _rows(f"x{c.partition}", 15, 0, rng)
    tbl = events_table(rs).append_column("surprise", pa.array([rng.random() for _ in rs]))
    _write(src, c.partition, "00000001.parquet", _parquet_bytes(tbl))
    c.good = rs


def _bad_encoding_jsonl(src, c: Case, rng):
    rs = _rows(f"j{c.partition}", 8, 0, rng)
    lines = [json.dumps({"event_id": e, "user": u, "value": v, "_ingest_ts": _ts(t).isoformat()}) for e, u, v, t in rs]
    data = ("\n".join(lines) + "\n").encode().replace(b'"u', b'"\xe9u', 1)  # a latin-1 byte: not UTF-8
    c.names = _write(src, c.partition, "00000001.jsonl", data)
    c.dead = 1


def _unicode_text(src, c: Case, rng):
    rs = [(f"ü{c.partition}-{i}-名前", rng.choice(["ü", "名前", "😀", "a\u0000b", "e\u0301"]), rng.randrange(1, 50),
           i * 0.7) for i in range(20)]
    _write(src, c.partition, "00000001.parquet", _parquet_bytes(events_table(rs)))
    c.good = rs


def _nulls(src, c: Case, rng):
    rs = _rows(f"n{c.partition}", 20, 0, rng)
    ids = [None if i == 3 else ("" if i == 4 else r[0]) for i, r in enumerate(rs)]
    ts = [None if i == 5 else _ts(r[3]) for i, r in enumerate(rs)]
    tbl = pa.table({"event_id": ids, "user": [r[1] for r in rs], "value": [r[2] for r in rs], "_ingest_ts": ts},
                   schema=EVENTS_SCHEMA)
    c.names = _write(src, c.partition, "00000001.parquet", _parquet_bytes(tbl))
    c.good = [r for i, r in enumerate(rs) if i not in (3, 4, 5)]
    c.dead = 3


def _null_group_key_and_value(src, c: Case, rng):
    rs = _rows(f"k{c.partition}", 10, 0, rng)
    users = [None if i == 2 else r[1] for i, r in enumerate(rs)]
    vals = [None if i == 6 else r[2] for i, r in enumerate(rs)]
    tbl = pa.table({"event_id": [r[0] for r in rs], "user": users, "value": vals,
                    "_ingest_ts": [_ts(r[3]) for r in rs]}, schema=EVENTS_SCHEMA)
    c.names = _write(src, c.partition, "00000001.parquet", _parquet_bytes(tbl))
    c.good = [(r[0], users[i], vals[i], r[3]) for i, r in enumerate(rs)]


def _huge_values(src, c: Case, rng):
    rs = [(f"h{c.partition}-a", "u-huge", 2 ** 62, 1.0), (f"h{c.partition}-b", "u-huge", 2 ** 61, 2.0),
          (f"h{c.partition}-m", "u-min", -(2 ** 63), 5.0), (f"h{c.partition}-M", "u-max", 2 ** 63 - 1, 6.0)]
    c.names = _write(src, c.partition, "00000001.parquet", _parquet_bytes(events_table(rs)))
    c.good = rs  # extreme, but every sum fits in int64


def write_overflow(src: Path, partition: int = 9) -> str:
    """Rows whose per-user sum leaves int64 (3 * 2^62): the epoch must fail naming operator and key."""
    rs = [(f"o-{i}", "u-overflow", 2 ** 62, i * 1.0) for i in range(3)]
    return _write(src, partition, "00000001.parquet", _parquet_bytes(events_table(rs)))


def _decreasing_ts(src, c: Case, rng):
    rs = _rows(f"d{c.partition}", 40, 0, rng)
    rs = [(e, u, v, 100 - t) for e, u, v, t in rs]  # _ingest_ts decreases within the file
    c.names = _write(src, c.partition, "00000001.parquet", _parquet_bytes(events_table(rs)))
    c.good = rs


def _seq_gaps(src, c: Case, rng):
    a, b = _rows(f"s{c.partition}a", 10, 0, rng), _rows(f"s{c.partition}b", 10, 30, rng)
    _write(src, c.partition, "00000001.parquet", _parquet_bytes(events_table(a)))
    _write(src, c.partition, "00000007.parquet", _parquet_bytes(events_table(b)))
    c.good = a + b


def _late_file(src, c: Case, rng):
    a, b = _rows(f"l{c.partition}a", 10, 0, rng), _rows(f"l{c.partition}b", 10, 30, rng)
    _write(src, c.partition, "00000001.parquet", _parquet_bytes(events_table(a)))
    _write(src, c.partition, "00000005.parquet", _parquet_bytes(events_table(b)))
    c.good = a + b
    late_rows = _rows(f"l{c.partition}late", 10, 20, rng)
    c.names = "00000003.parquet"

    def late(src_: Path, p=c.partition):
        _write(src_, p, "00000003.parquet", _parquet_bytes(events_table(late_rows)))
    c.late, c.late_dead = late, 1


def _changed_file(src, c: Case, rng):
    a = _rows(f"cf{c.partition}", 10, 0, rng)
    _write(src, c.partition, "00000001.parquet", _parquet_bytes(events_table(a)))
    c.good = a
    c.names = "00000001.parquet"
    more = a + _rows(f"cf{c.partition}more", 5, 10, rng)

    def late(src_: Path, p=c.partition):
        _write(src_, p, "00000001.parquet", _parquet_bytes(events_table(more)))
    c.late, c.late_dead = late, 1


def _bad_folder(src, c: Case, rng):
    rs = _rows(f"bf{c.partition}", 5, 0, rng)
    name = rng.choice(["partition=x", "partition=01", "partition=-1", "part=3"])
    _write(src, name, "00000001.parquet", _parquet_bytes(events_table(rs)))
    c.names, c.dead, c.fail_names_partition = name, 1, False


def _bad_file_name(src, c: Case, rng):
    rs = _rows(f"bn{c.partition}", 5, 0, rng)
    ok = _rows(f"bn{c.partition}ok", 5, 10, rng)
    _write(src, c.partition, "00000002.parquet", _parquet_bytes(events_table(ok)))
    c.names = f"partition={c.partition}/" + _write(
        src, c.partition, rng.choice(["1.parquet", "0000000x.parquet", "00000001.csv"]), _parquet_bytes(events_table(rs)))
    c.good, c.dead, c.fail_names_partition = ok, 1, False


_KINDS: dict[str, Callable] = {
    "truncated": _truncated, "random_bytes": _random_bytes, "empty_file": _empty_file,
    "missing_column": _missing_column, "changed_type": _changed_type, "extra_column": _extra_column,
    "bad_encoding_jsonl": _bad_encoding_jsonl, "unicode_text": _unicode_text, "nulls": _nulls,
    "null_group_key_and_value": _null_group_key_and_value, "huge_values": _huge_values,
    "decreasing_ts": _decreasing_ts, "seq_gaps": _seq_gaps, "late_file": _late_file, "changed_file": _changed_file,
    "bad_folder": _bad_folder, "bad_file_name": _bad_file_name,
}
KINDS = tuple(_KINDS)
