"""What users read, on a dedup-heavy job of our own (issue 29): ``benchmarks.iot_job`` - two deduplicates keyed by a
per-row id (one key per row), a join, an ``emit="update"`` window (Iceberg upsert sink), a ``process`` step and Delta
sinks - a few thousand events through real local Spark.

* the clean checkpoint validates: every suite passes, the dedups are compared with the batch evaluation (nothing
  NOT CHECKED but the process-fed objects, which the replay checks), the open tables and the dead letters are compared
  (``epochal_users_read``);
* a changed value and a deleted row in a data file of a table's current version, read through its format, and a
  deleted dead-letter file each make ``validate`` fail, naming the object; the storage is broken with pyarrow
  directly (never through Epochal), and restored after each case;
* ``restore --validate cheap|none``: what each level runs.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from benchmarks.iot_job import build_job, generate

pytestmark = pytest.mark.spark

CLOCK = "2026-06-01T00:00:00Z"
EPOCHS = 4


def _runner(root: Path):
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    cfg = load_config(env={}, source_uri=(root / "src").as_uri(), checkpoint_uri=(root / "ckpt").as_uri(),
                      sink_uri=(root / "sink").as_uri(), clock_now=CLOCK, epoch_seconds=60, parallelism=2)
    return JobRunner(build_job(), cfg, echo=lambda m: None)


@pytest.fixture(scope="module")
def iot(tmp_path_factory):
    root = tmp_path_factory.mktemp("iot")
    generate(str(root / "src"), events=1200, epochs=EPOCHS, partitions=2, seed=3)
    r = _runner(root)
    rep = r.run()
    assert len(rep.completed) >= EPOCHS, rep.to_dict()
    return root, r


def _validate(r):
    from pipeline.quality import validate_job
    return validate_job(r, replay=False, build_docs=False, store_results=False)


def _failed(v) -> dict[str, list]:
    return {s.suite: [o for o in s.expectations if not o.success] for s in v.suites if not s.success}


def _swap(path: str, edit) -> bytes:
    """Rewrite the Parquet file at ``path`` with ``edit(table)``; returns the original bytes."""
    p = path[len("file://"):] if path.startswith("file://") else path
    before = Path(p).read_bytes()
    pq.write_table(edit(pq.read_table(p)), p)
    return before


def _put(path: str, data: bytes) -> None:
    Path(path[len("file://"):] if path.startswith("file://") else path).write_bytes(data)


def test_clean_dedup_job_validates_and_what_users_read_is_compared(iot):
    _, r = iot
    v = _validate(r)
    assert v.success, v.summary()
    # one key per row: the dedups and everything after them are compared with the batch evaluation
    assert not [m for m in v.messages if "NOT CHECKED against the batch evaluation" in m
                and ("dedup" in m or "ack_join" in m or "device_minutes" in m)], v.messages
    ds = {s.suite: s for s in v.suites}
    assert ds["epochal_users_read"].rows >= 4, v.summary()   # 3 open tables + the window's dead letters


def test_changed_value_deleted_row_and_deleted_dead_letters_fail(iot):
    root, r = iot
    # 1. the Iceberg upsert table (the update window's): one value changed in a data file of its current snapshot
    # (an upsert commit rewrites the files holding updated keys: those exist only in the table, never in Epochal's
    # commit log, whose checksums therefore cannot see them; the staged files both share)
    from pipeline.sink.table import CommittedTable
    ice = r.ctx.table("device_minutes")
    own = {f.uri for f in CommittedTable.committed_files(ice)}
    files = ice.current_files()
    table_only = [f for f in files if f not in own]
    assert table_only, files
    for f in (table_only[0], next(f for f in files if f in own)):
        before = _swap(f, lambda t: t.set_column(t.schema.get_field_index("readings"), "readings",
                                                 pc.add(t["readings"], pa.scalar(1, t.schema.field("readings").type))))
        try:
            v = _validate(r)
            bad = _failed(v)
            assert not v.success and "device_minutes" in v.summary(), v.summary()
            if f in table_only:   # only the table read through its format shows it
                assert any(u.get("object") == "table/device_minutes" for o in bad["epochal_users_read"]
                           for u in o.unexpected_rows), v.summary()
        finally:
            _put(f, before)
    # 2. a row deleted from a data file of a Delta table's current version (the join's append sink)
    delta = r.ctx.table("acked_readings")
    f = next(u for u in delta.current_files() if pq.read_metadata(u[len("file://"):]).num_rows > 1)
    before = _swap(f, lambda t: t.slice(1))
    try:
        v = _validate(r)
        assert not v.success and _failed(v), v.summary()
        assert "acked_readings" in v.summary(), v.summary()
    finally:
        _put(f, before)
    # 3. a changed value in a Delta file of the process step's sink (the replay compares only epoch n's rows)
    alerts = r.ctx.table("alerts")
    f = next(u for u in alerts.current_files() if pq.read_metadata(u[len("file://"):]).num_rows)
    before = _swap(f, lambda t: t.set_column(t.schema.get_field_index("value"), "value",
                                             pc.add(t["value"], pa.scalar(0.5))))
    try:
        v = _validate(r)
        assert not v.success, v.summary()
        assert "alerts" in v.summary(), v.summary()
    finally:
        _put(f, before)
    # 4. a dead-letter file of the window's late records deleted
    dl = sorted((root / "ckpt").parent.rglob("operator=device_minutes/epoch-*/chk-*/*"))
    dl = [p for p in dl if p.is_file()]
    assert dl, "the job dead-letters late records"
    data = dl[-1].read_bytes()
    os.remove(dl[-1])
    try:
        v = _validate(r)
        bad = _failed(v)
        assert "epochal_users_read" in bad, v.summary()
        assert any(u.get("object") == "dead_letters/device_minutes" for o in bad["epochal_users_read"]
                   for u in o.unexpected_rows), v.summary()
    finally:
        dl[-1].write_bytes(data)
    assert _validate(r).success


def test_restore_validation_levels(iot, monkeypatch):
    _, r = iot
    latest = r.coordinator.store.latest()
    res = r.restore(str(latest.checkpoint_id), validate="none")
    assert res["validation"]["level"] == "none" and res["validation"]["success"] is None
    res = r.restore(str(latest.checkpoint_id), validate="cheap")
    assert res["validation"]["level"] == "cheap" and res["validation"]["success"], res["validation"]
    assert "epochal_recovery_key_groups" not in res["validation"]["summary"]
    from pipeline.exceptions import ConfigError
    with pytest.raises(ConfigError, match="full, cheap, none"):
        r.restore(str(latest.checkpoint_id), validate="sometimes")


def test_changed_dead_letter_row_fails(iot):
    """Dead letters are compared row by row with the batch meaning's: one value changed in a dead-letter file (same
    number of rows) fails ``epochal_users_read`` for the window's dead letters."""
    root, r = iot
    dl = [p for p in sorted((root / "ckpt").parent.rglob("operator=device_minutes/epoch-*/chk-*/*.parquet"))
          if p.is_file() and pq.read_metadata(p).num_rows]
    assert dl, "the job dead-letters late records"
    col = "readings" if "readings" in pq.read_schema(dl[0]).names else next(
        f.name for f in pq.read_schema(dl[0]) if pa.types.is_floating(f.type) or pa.types.is_integer(f.type))
    before = _swap(str(dl[0]), lambda t: t.set_column(
        t.schema.get_field_index(col), col, pc.add(t[col], pa.scalar(1, t.schema.field(col).type))))
    try:
        v = _validate(r)
        bad = _failed(v)
        assert "epochal_users_read" in bad, v.summary()
        rows = [u for o in bad["epochal_users_read"] for u in o.unexpected_rows]
        assert any(u.get("object") == "dead_letters/device_minutes" for u in rows), v.summary()
    finally:
        _put(str(dl[0]), before)


def test_corrupted_barrier_and_round_log_entries_fail_naming_checkpoint_and_file(iot):
    """The barrier log is checked against the source files' ``_ingest_ts`` as pyarrow reads them, the round log
    against the checkpoints' ``_metadata`` (``epochal_runtime_logs``): a barrier entry moved by one row, and a round
    entry starting past its checkpoint's barrier, each fail validation naming the log file and the checkpoint."""
    root, r = iot
    latest = r.coordinator.store.latest()
    md = latest.metadata
    barriers = root / "ckpt" / r.job.name / "barriers"
    v = _validate(r)
    assert v.success, v.summary()
    ds = {s.suite: s for s in v.suites}
    assert ds["epochal_runtime_logs"].rows >= len(list(barriers.glob("epoch-*.json"))), v.summary()

    # 1. a barrier entry one row late (a partition that was not idle when the barrier was cut)
    victim, doc, src, part = None, None, None, None
    for f in sorted(barriers.glob("epoch-*.json")):
        d = json.loads(f.read_text())
        if d["epoch"] > md.epoch:
            continue
        for s, ps in d["barriers"].items():
            for p in ps:
                if p not in d.get("idle_partitions", {}).get(s, []):
                    victim, doc, src, part = f, d, s, p
    assert victim is not None
    original = victim.read_bytes()
    doc["barriers"][src][part]["row"] += 1
    victim.write_text(json.dumps(doc))
    try:
        v = _validate(r)
        bad = _failed(v)
        assert "epochal_runtime_logs" in bad, v.summary()
        rows = [u for o in bad["epochal_runtime_logs"] for u in o.unexpected_rows]
        assert any(u["file"].endswith(victim.name) and u["checkpoint"].startswith("chk-") and u["source"] == src
                   and u["partition"] == part for u in rows), v.summary()
        assert victim.name in v.summary() and "chk-" in v.summary()
    finally:
        victim.write_bytes(original)

    # 2. a round entry of the latest checkpoint that starts past its barrier (and names a round it never had)
    rounds = barriers / "rounds"
    rounds.mkdir(exist_ok=True)
    s0 = sorted(md.barriers)[0]
    p0 = sorted(md.barriers[s0])[0]
    b = md.barriers[s0][p0]
    forged = rounds / f"epoch-{md.epoch}-chk-{md.checkpoint_id:012d}-r1.json"
    existed = forged.read_bytes() if forged.exists() else None
    forged.write_text(json.dumps({"job": r.job.name, "epoch": md.epoch, "checkpoint_id": md.checkpoint_id, "round": 1,
                                  "starts": {s0: {p0: {"seq": b.seq + 5, "row": 0}}}}))
    try:
        v = _validate(r)
        bad = _failed(v)
        assert "epochal_runtime_logs" in bad, v.summary()
        rows = [u for o in bad["epochal_runtime_logs"] for u in o.unexpected_rows]
        assert any(u["file"].endswith(forged.name) and u["checkpoint"] == f"chk-{md.checkpoint_id}" for u in rows), \
            v.summary()
    finally:
        if existed is None:
            forged.unlink()
        else:
            forged.write_bytes(existed)
    assert _validate(r).success
