"""Bad-input fuzz (issue 15): broken source files and rows from tests/reliability/fuzz_inputs.py (truncations,
random bytes, empty files, schema drift, encodings, nulls, huge values, decreasing timestamps, sequence gaps,
late and changed files, bad folder and file names) fed to a job of our own (``counts_job``).

For every case: under ``dead_letter`` it is dead-lettered with the exact count (checkpoint stats) and every
record names its file and partition; under ``fail`` the run stops with a message naming the file (and the
partition); and the rest of the output is exact against the oracle (each good row counted once). Nothing silent.

CI profile: one seed, every kind under ``dead_letter`` (two runs: the late/changed files arrive in between),
three kinds under ``fail``. Bigger, opt-in: ``EPOCHAL_FUZZ_SEEDS=5`` (five seeds) and ``EPOCHAL_FUZZ_FAIL_ALL=1``
(every kind under ``fail``)::

    EPOCHAL_FUZZ_SEEDS=5 EPOCHAL_FUZZ_FAIL_ALL=1 python -m pytest tests/reliability/test_fuzz_inputs.py -q
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipeline.config import load_config
from pipeline.exceptions import EpochalError
from pipeline.runtime.driver.runner import JobRunner
from tests.reliability import fuzz_inputs as fz
from tests.reliability.jobs import counts_job, put_events, totals_oracle

pytestmark = [pytest.mark.spark]

SEEDS = list(range(1, 1 + int(os.environ.get("EPOCHAL_FUZZ_SEEDS", "1"))))
FAIL_ALL = os.environ.get("EPOCHAL_FUZZ_FAIL_ALL") == "1"
BROKEN = [k for k in fz.KINDS if k not in ("extra_column", "unicode_text", "null_group_key_and_value",
                                           "huge_values", "decreasing_ts", "seq_gaps")]
FAIL_KINDS = BROKEN if FAIL_ALL else random.Random(int(os.environ.get("EPOCHAL_FUZZ_FAIL_SEED", "3"))).sample(BROKEN, 3)


def _runner(tmp: Path, src: Path, **kw) -> tuple[JobRunner, list[str]]:
    cfg = load_config(env={}, source_uri=src.as_uri(), checkpoint_uri=(tmp / "ck").as_uri(),
                      sink_uri=(tmp / "sink").as_uri(), parallelism=2, retained_checkpoints=100, **kw)
    msgs: list[str] = []
    return JobRunner(counts_job(), cfg, echo=msgs.append), msgs


def _dead_letter_records(tmp: Path) -> list[dict]:
    out = []
    for f in sorted((tmp / "ck" / "_dead_letter").rglob("*.jsonl")):
        out += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_every_broken_input_is_dead_lettered_and_counted(tmp_path, seed):
    src = tmp_path / "src"
    cases = fz.build(src, seed)
    r1, msgs1 = _runner(tmp_path, src)
    assert r1.run().completed
    for c in cases:
        if c.late:
            c.late(src)
    # new data too, so that an epoch completes and counts the breaches in its checkpoint
    more = [(f"new-{i}", f"u{i % 5}", i, 300 + i) for i in range(30)]
    put_events(src.as_uri(), 0, 3, more)
    cases[0].good += more
    r2, msgs2 = _runner(tmp_path, src)
    assert r2.run().completed
    store = r2.coordinator.store
    counted = sum(cp.metadata.stats.dead_letters.get("events", 0) for cp in store.list())
    expected = sum(c.dead + c.late_dead for c in cases)
    records = _dead_letter_records(tmp_path)
    by_kind = {c.kind: c for c in cases}
    assert counted == expected, (counted, expected, [(r.get("file"), r.get("error")) for r in records])
    # every record names its file and (for layout-conforming folders) its partition
    for rec in records:
        where = rec.get("file") or rec.get("uri") or ""
        assert where and rec.get("error"), rec
    for c in cases:
        if c.dead or c.late_dead:
            where = f"partition={c.partition}/{c.names}" if c.fail_names_partition else f"/{c.names}"
            hits = [r for r in records if where in (r.get("file") or r.get("uri") or "")]
            assert len(hits) == c.dead + c.late_dead, (c.kind, where, hits)
            if c.fail_names_partition:
                assert all(r.get("partition") == c.partition for r in hits), (c.kind, hits)
    # nothing silent: late/changed files are also warned about
    warned = "\n".join(msgs1 + msgs2)
    for kind in ("late_file", "changed_file"):
        assert by_kind[kind].names in warned, (kind, warned)
    # the rest of the output is exact
    r2.export("user_totals", str(tmp_path / "out"))
    got = {d["user"]: (d["n"], d["total"]) for d in pq.read_table(tmp_path / "out").to_pylist()}
    assert got == totals_oracle([row for c in cases for row in c.good])


@pytest.mark.parametrize("kind", FAIL_KINDS)
def test_fail_policy_names_file_and_partition(tmp_path, kind):
    src = tmp_path / "src"
    case = [c for c in fz.build(src, 11, kinds=[kind]) if c.kind == kind][0]
    if case.late:  # the breach comes after a first, clean run
        r, _ = _runner(tmp_path, src, bad_records="fail")
        assert r.run().completed
        case.late(src)
    r, _ = _runner(tmp_path, src, bad_records="fail")
    with pytest.raises(EpochalError) as ei:
        r.run()
    msg = str(ei.value)
    assert "\n" not in msg.strip() and case.names in msg, msg
    if case.fail_names_partition:
        assert f"partition {case.partition}" in msg or f"partition={case.partition}" in msg, msg


def test_int64_sum_overflow_is_a_clear_failure_not_a_wrap_around(tmp_path):
    """Found by the fuzz: a per-user int64 sum past 2^63 wrapped around silently (negative totals)."""
    from pipeline.exceptions import AggregateOverflowError
    src = tmp_path / "src"
    fz.build(src, 2, kinds=["huge_values"])
    fz.write_overflow(src)
    r, _ = _runner(tmp_path, src)
    with pytest.raises(AggregateOverflowError) as ei:
        r.run()
    msg = str(ei.value)
    assert "per-user" in msg and "u-overflow" in msg and "int64" in msg, msg
