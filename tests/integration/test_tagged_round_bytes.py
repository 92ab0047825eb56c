"""A catch-up of large rows is split into tagged rounds by bytes (``PIPELINE_MAX_TASK_BYTES_PER_ROUND``,
pipeline.runtime.spark.round_bytes), with a real local Spark and a job of this test's own making: ``blobs`` (8 KB bodies,
some blobs re-sent in a later epoch) -> deduplicate -> per-group count and body bytes -> upsert sink.

Seven epochs wait. No round has measured the rows yet, so the first round's budget uses a figure sampled from its
first Parquet file (round_bytes.sampled_bytes_per_row) and takes 2 epochs (8 are allowed by count); its checkpoints
record the measured figure. A new runner (nothing in memory: the figure comes from the latest checkpoint's
``_metadata``) continues in rounds of 2 at once. Every epoch completes its own checkpoint, and the committed totals equal the oracle (each blob counted
exactly once). The no-Spark tests of the decision are tests/unit/runtime/test_round_bytes.py.
"""
from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.recovery_fields import BYTES_PER_ROW_KEY
from pipeline.config import load_config
from pipeline.job import Job
from pipeline.runtime.driver.runner import JobRunner

pytestmark = [pytest.mark.spark]

T0 = datetime(2024, 7, 1, tzinfo=UTC)
TS = pa.timestamp("us", tz="UTC")
BLOBS = pa.schema([("bid", pa.string()), ("grp", pa.string()), ("body", pa.string()), ("_ingest_ts", TS)])
EPOCHS, PER_PARTITION, BODY = 7, 20, 8000


def _job() -> Job:
    job = Job("blob_totals", max_parallelism=8)
    first = job.source("blobs", BLOBS, key="bid").deduplicate(uid="first_blob", key="bid")
    first.select("grp", "length(body) AS len").aggregate(
        uid="per_grp", key="grp", aggs={"n": ("count", None), "chars": ("sum", "len")}).sink(
        "grp_totals", mode="upsert", key=["grp"])
    return job


def _write(root: Path) -> dict[str, tuple[int, int]]:
    """The sources; returns the oracle {grp: (distinct blobs, their body bytes)}."""
    first: dict[str, tuple[str, int]] = {}
    for e in range(EPOCHS):
        for p in range(2):
            bids = [f"b{e}-{p}-{i}" for i in range(PER_PARTITION)]
            if e:
                bids[:3] = [f"b{e - 1}-{p}-{i}" for i in range(3)]  # re-sent: the deduplication drops them
            grps = [f"g{(i + e) % 5}" for i in range(PER_PARTITION)]
            bodies = [(f"{e}{p}{i}" * BODY)[: BODY - i] for i in range(PER_PARTITION)]
            for b, g, body in zip(bids, grps, bodies):
                first.setdefault(b, (g, len(body)))
            d = root / "blobs" / f"partition={p}"
            d.mkdir(parents=True, exist_ok=True)
            ts = [T0 + timedelta(seconds=60 * e + 50 * i / PER_PARTITION) for i in range(PER_PARTITION)]
            pq.write_table(pa.table({"bid": bids, "grp": grps, "body": bodies, "_ingest_ts": ts}, schema=BLOBS),
                           d / f"{e:08d}.parquet")
    oracle: dict[str, tuple[int, int]] = {}
    for g, n in first.values():
        c, s = oracle.get(g, (0, 0))
        oracle[g] = (c + 1, s + n)
    return oracle


def _runner(tmp: Path, lines: list[str]) -> JobRunner:
    # one epoch is 40 rows x ~8 KB on 2 tasks = ~160 KB per task: the budget holds two epochs, not three
    cfg = load_config(env={}, source_uri=(tmp / "src").as_uri(), checkpoint_uri=(tmp / "ckpt").as_uri(),
                      sink_uri=(tmp / "sink").as_uri(), epoch_seconds=60, parallelism=2, retained_checkpoints=10,
                      max_task_bytes_per_round=400_000, round_target_seconds=0, clock_now=(T0 + timedelta(hours=1)).isoformat())
    assert cfg.max_epochs_per_round == 8  # the default
    return JobRunner(_job(), cfg, echo=lines.append)


def test_a_catch_up_of_large_rows_is_split_into_rounds_by_bytes_one_checkpoint_per_epoch(tmp_path: Path):
    oracle = _write(tmp_path / "src")
    lines: list[str] = []
    first = _runner(tmp_path, lines).run(3)
    # nothing measured yet: the sampled figure lets two epochs into the first round; the third runs alone (run(3))
    assert [r.tagged_round for r in first.completed] == [(1, 2), (1, 2), ()]
    assert [r.epoch for r in first.completed] == [int(T0.timestamp()) // 60 + e for e in range(3)]
    cut = [m for m in lines if "tagged round cut by bytes" in m]
    assert len(cut) == 1 and "(2 of 3 waiting epochs)" in cut[0] and "3 epochs would hold" in cut[0]

    lines.clear()
    again = _runner(tmp_path, lines)  # a new runner: nothing in memory, the figure from the latest checkpoint
    rest = again.run()
    assert [r.tagged_round for r in rest.completed] == [(4, 5), (4, 5), (6, 7), (6, 7)]
    cut = [m for m in lines if "tagged round cut by bytes" in m]
    assert len(cut) == 1 and "after epoch" in cut[0] and "(2 of 4 waiting epochs)" in cut[0]
    assert "3 epochs would hold" in cut[0] and "over PIPELINE_MAX_TASK_BYTES_PER_ROUND=0.4 MiB" in cut[0]
    assert any("one Spark round, 2 epochs, ~0.3 MiB of input per task" in m for m in lines)

    mds = [c.metadata for c in again.coordinator.store.list()]
    assert [m.checkpoint_id for m in mds] == list(range(1, EPOCHS + 1))
    assert [m.epoch for m in mds] == [int(T0.timestamp()) // 60 + e for e in range(EPOCHS)]
    for m in mds:  # every checkpoint records the figure: the rows' Arrow bytes (body and the rest)
        assert BODY - PER_PARTITION < m.extra[BYTES_PER_ROW_KEY]["blobs"] < BODY + 200
    got = {r["grp"]: (r["n"], r["chars"]) for r in again.table("grp_totals").read().to_pylist()}
    assert got == oracle
