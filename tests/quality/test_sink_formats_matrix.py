"""Every sink format and mode, broken as users would find it, fails ``validate`` (issue 29, "Checks").

A job of our own (not the demo, not the IoT job): one ``transfers`` source with bad records (a null key, an empty key,
a value that cannot be cast, a malformed JSON line) -> a filter -> append sinks, and -> a running ``aggregate`` ->
upsert sinks, each in the three formats (Epochal's own, Delta, Iceberg): six sinks. After a clean run that
validates, storage is broken with pyarrow (never through Epochal) and restored after each case:

1. one value changed in a data file of each sink's current version -> ``validate`` fails naming all six sinks;
2. one row deleted from a data file of each sink, and a source dead-letter file deleted -> fails naming all six sinks
   and ``dead_letters/source=transfers``.

The source's dead letters are compared with the records the runtime's reader rejects in the prefix
(:mod:`pipeline.quality.source_dead_letters`): the clean run shows them equal and non-empty.
"""
from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline import Job

pytestmark = pytest.mark.spark

CLOCK = "2026-06-01T00:00:00Z"
TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("transfer_id", pa.string()), ("account", pa.string()), ("amount", pa.int64()),
                    ("_ingest_ts", TS)])
FORMATS = ("epochal", "delta", "iceberg")
EPOCHS = 4
T0_US = 1_780_000_000_000_000 // 60_000_000 * 60_000_000


def build_job() -> Job:
    job = Job("transfers_matrix", max_parallelism=16)
    t = job.source("transfers", SCHEMA, key="transfer_id")
    big = t.filter("amount >= 10")
    totals = t.aggregate(uid="totals", key="account", aggs={"total": ("sum", "amount"), "n": ("count", None)})
    for fmt in FORMATS:
        big.sink(f"big_{fmt}", format=fmt)
        totals.sink(f"totals_{fmt}", mode="upsert", format=fmt)
    return job


def _generate(src: Path) -> int:
    """Four epochs of 60 s, two partitions; returns the bad records written."""
    bad = 0
    n = 0
    for e in range(EPOCHS):
        for p in range(2):
            d = src / "transfers" / f"partition={p}"
            d.mkdir(parents=True, exist_ok=True)
            rows = []
            for i in range(30):
                n += 1
                ts = T0_US + e * 60_000_000 + i * 1_500_000 + p * 7
                rows.append({"transfer_id": f"t{n}", "account": f"a{(n * 7) % 11}", "amount": (n * 13) % 50,
                             "_ingest_ts": ts})
            if e in (1, 2):       # a null key and an empty key
                rows[3]["transfer_id"] = None
                rows[5]["transfer_id"] = ""
                bad += 2
            tbl = pa.table({"transfer_id": [r["transfer_id"] for r in rows],
                            "account": [r["account"] for r in rows], "amount": [r["amount"] for r in rows],
                            "_ingest_ts": pa.array([r["_ingest_ts"] for r in rows], TS)}, schema=SCHEMA)
            pq.write_table(tbl, d / f"{2 * e:08d}.parquet")
            # a JSON-lines file after it in the same epoch: partition 0's has a value that cannot be cast (one
            # record), partition 1's a malformed line (the file cannot be parsed: one record for the whole file)
            ts = T0_US + e * 60_000_000 + 50_000_000 + p
            amounts = ["20", "many", "22"] if p == 0 else [20, 21, 22]
            lines = [json.dumps({"transfer_id": f"j{e}-{p}-{k}", "account": "a1", "amount": amounts[k],
                                 "_ingest_ts": _iso(ts + k)}) for k in range(3)]
            if p == 1:
                lines.append('{"transfer_id": "broken", ')
            bad += 1
            (d / f"{2 * e + 1:08d}.jsonl").write_text("\n".join(lines) + "\n")
    return bad


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1_000_000, UTC).isoformat()


def _runner(root: Path):
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    cfg = load_config(env={}, source_uri=(root / "src").as_uri(), checkpoint_uri=(root / "ckpt").as_uri(),
                      sink_uri=(root / "sink").as_uri(), clock_now=CLOCK, epoch_seconds=60, parallelism=2)
    return JobRunner(build_job(), cfg, echo=lambda m: None)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    bad = _generate(root / "src")
    r = _runner(root)
    rep = r.run()
    assert len(rep.completed) >= EPOCHS - 1, rep.to_dict()
    return root, r, bad


def _validate(r):
    from pipeline.quality import validate_job
    return validate_job(r, replay=False, build_docs=False, store_results=False)


def _users_read(v) -> dict[str, dict]:
    """The source dead-letter rows of dataset ``users_read`` (validate's figures carry them)."""
    return dict(v.figures.get("source_dead_letters") or {})


def _data_file(r, table: str) -> str:
    """A data file of ``table``'s current version holding more than one row."""
    from pipeline.sink.table import CommittedTable
    t = r.ctx.table(table)
    files = t.current_files() if hasattr(t, "current_files") else [f.uri for f in CommittedTable.committed_files(t)]
    for f in files:
        p = f[len("file://"):] if f.startswith("file://") else f
        if p.endswith(".parquet") and pq.read_metadata(p).num_rows > 1:
            return p
    raise AssertionError(f"{table}: no data file with rows among {files}")


def _swap(path: str, edit) -> bytes:
    before = Path(path).read_bytes()
    pq.write_table(edit(pq.read_table(path)), path)
    return before


def _bump(col: str):
    def edit(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index(col)
        return t.set_column(i, col, pc.add(t[col], pa.scalar(1, t.schema.field(col).type)))
    return edit


def _sinks() -> list[tuple[str, str]]:
    return [(f"big_{f}", "amount") for f in FORMATS] + [(f"totals_{f}", "total") for f in FORMATS]


def _assert_names(v, names: list[str]) -> None:
    assert not v.success, v.summary()
    # every failing row of every expectation (the summary shows a few per expectation)
    text = "\n".join([v.summary(), *v.messages, *(json.dumps([*e.unexpected_rows, *e.examples], default=str)
                                                   for e in v.failed_expectations)])
    missing = [n for n in names if n not in text]
    assert not missing, f"not named: {missing}\n{text}"


def test_clean_run_validates_and_source_dead_letters_are_compared(matrix):
    root, r, bad = matrix
    v = _validate(r)
    assert v.success, v.summary()
    rows = _users_read(v)
    src = rows.get("dead_letters/source=transfers")
    assert src is not None, sorted(rows)
    # every bad record written is inside the validated prefix or after it; the ones inside were found on both sides
    assert 0 < src["rows_expected"] == src["rows_actual"] <= bad, src
    assert src["only_expected"] == 0 and src["only_actual"] == 0, src


def test_changed_values_in_every_format_and_mode_fail(matrix):
    _, r, _ = matrix
    saved = []
    try:
        for table, col in _sinks():
            p = _data_file(r, table)
            saved.append((p, _swap(p, _bump(col))))
        _assert_names(_validate(r), [t for t, _ in _sinks()])
    finally:
        for p, data in saved:
            Path(p).write_bytes(data)


def test_deleted_rows_and_a_deleted_source_dead_letter_file_fail(matrix):
    root, r, _ = matrix
    saved = []
    dl = sorted(p for p in root.rglob("transfers/partition=*/*.jsonl") if (root / "src") not in p.parents)
    assert dl, "the source dead-letters its bad records"
    try:
        for table, _ in _sinks():
            p = _data_file(r, table)
            saved.append((p, _swap(p, lambda t: t.slice(1))))
        saved.append((str(dl[0]), dl[0].read_bytes()))
        os.remove(dl[0])
        v = _validate(r)
        _assert_names(v, [t for t, _ in _sinks()])
        src = _users_read(v).get("dead_letters/source=transfers")
        assert src is not None and src["only_expected"] > 0 and src["only_actual"] == 0, src
    finally:
        for p, data in saved:
            Path(p).write_bytes(data)
    assert _validate(r).success
