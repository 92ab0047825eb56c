"""Validation of an unaligned checkpoint that completed with pending channel state (docs/batch.md "Prefix").

Under a backlog an unaligned checkpoint's barrier overtakes data: the pre-barrier rows not yet consumed are in
flight (channel-state files) or still in the source log (ranges ``[read position, barrier)``). The checkpoint's
state and committed output hold exactly the rows before its restore positions (``_metadata.positions``), so the
batch plan's prefix is ``[0, positions)`` there, not ``[0, barriers)``: with the barriers, every such checkpoint
failed validation (the plan expected the pairs and totals of rows consumed only by later checkpoints). Job and
data of our own (``unaligned_jobs``): a join into an append sink and an aggregate of it into an upsert sink."""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.insert(0, str(_HERE.parent / "quality"))

from unaligned_jobs import E, build, write_sources  # noqa: E402

from pipeline.batch import consumed_positions, lagging_partitions  # noqa: E402

RECOVERY = {"epochal_recovery_key_groups", "epochal_recovery_totals", "epochal_recovery_conservation"}


@pytest.mark.spark
def test_unaligned_checkpoint_with_pending_ranges_validates_and_a_dropped_state_row_fails(tmp_path, monkeypatch):
    import corrupt

    from pipeline.batch import evaluate, prefix_of
    from pipeline.config import load_config
    from pipeline.quality import validate_job
    from pipeline.runtime.runner import JobRunner

    src = write_sources(tmp_path / "src", epochs=3, clicks=24, views=30, burst=40, burst_epoch=1)
    cfg = load_config(env={}, source_uri=src.as_uri(), checkpoint_uri=(tmp_path / "ckpt").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri(), epoch_seconds=E, parallelism=1,
                      retained_checkpoints=50, max_records_per_epoch=10, unaligned=True)
    r = JobRunner(build(), cfg, echo=lambda m: None)
    r.run(epochs=3)
    # the first checkpoint whose barrier overtook a backlog: source ranges pending, restore positions before
    # the barriers (the backlogged clicks of partition 0)
    md = next(c.metadata for c in r.coordinator.store.list()
              if any(h.file is None and h.end is not None for h in c.metadata.channel_state))
    assert md.positions["clicks"]["0"] < md.barriers["clicks"]["0"]
    assert lagging_partitions(md) == []
    consumed = consumed_positions(md)
    assert consumed is not None and consumed["clicks"][0] == (md.positions["clicks"]["0"].seq, md.positions["clicks"]["0"].row)

    # the barriers' prefix expects pairs of rows the checkpoint has not consumed yet (what validate compared
    # before): the plan over the restore positions expects fewer
    pre = prefix_of(r, md)
    full = evaluate(r, r.job, dataclasses.replace(pre, consumed=None)).sinks["pairs"].count()
    cut = evaluate(r, r.job, pre).sinks["pairs"].count()
    assert cut < full, (cut, full)

    v = validate_job(r, str(md.checkpoint_id), build_docs=False, store_results=False)
    assert v.success, v.summary()
    assert v.figures.get("not_checked") == {}, v.figures.get("not_checked")   # the join state is compared too
    assert {"sink/pairs", "sink/spend", "state/spend/agg", "state/cv/left"} <= set(v.figures["recomputed"])
    assert v.figures["recomputed"]["sink/pairs"] == cut

    # a row dropped from the join's left state (checksums patched, as a buggy writer would leave them) fails
    monkeypatch.setattr(corrupt, "JOB", "ua_spend")
    corrupt.change_state(tmp_path, md.checkpoint_id, "cv", "left", lambda t: t.slice(1), consistent=True)
    v = validate_job(JobRunner(build(), cfg, echo=lambda m: None), str(md.checkpoint_id), build_docs=False,
                     store_results=False)
    assert not v.success
    bad = [e for s in v.suites if s.suite in RECOVERY for e in s.expectations if not e.success]
    ex = [x for e in bad for x in e.examples]
    assert any(x.get("object") == "state/cv/left" and (x["_expected"], x["_actual"]) == (1, 0) for x in ex), \
        v.summary()


def _md(mode: str, channel_state, positions, barriers):
    from pipeline.checkpoint.handles import Position
    from pipeline.checkpoint.metadata import CheckpointMetadata

    def pos(d):
        return {s: {p: Position(*v) for p, v in parts.items()} for s, parts in d.items()}
    return CheckpointMetadata(job="ua", checkpoint_id=4, parent_id=3, epoch=7, barrier_time="2027-01-01T00:00:00Z",
                              checkpoint_mode=mode, alignment="unaligned", max_parallelism=16, parallelism=1,
                              positions=pos(positions), barriers=pos(barriers), channel_state=tuple(channel_state))


def test_prefix_ends_at_the_restore_positions_only_for_pending_exactly_once_channel_state():
    """No Spark: which positions the batch plan's prefix ends at, and which partitions lagged."""
    from pipeline.checkpoint.handles import ChannelStateHandle, Position
    bars = {"a": {"0": (1, 40), "1": (1, 9)}}
    rng = ChannelStateHandle("j", 0, "left", source="a", partition="0", start=Position(0, 30), end=Position(1, 40))
    md = _md("exactly_once", [rng], {"a": {"0": (0, 12), "1": (1, 9)}}, bars)
    assert consumed_positions(md) == {"a": {0: (0, 12), 1: (1, 9)}} and lagging_partitions(md) == []
    # aligned (no channel state) and the at-least-once tracker: the barriers
    assert consumed_positions(_md("exactly_once", [], {"a": {"0": (1, 40), "1": (1, 9)}}, bars)) is None
    assert consumed_positions(_md("at_least_once", [rng], {"a": {"0": (1, 40), "1": (1, 9)}}, bars)) is None
    # a lagging partition: open range, no barrier n; what the checkpoint consumed of it ends at its restore position
    # (docs/batch.md "Lagging partitions"; tests/batch/test_lag_validation.py)
    lag = ChannelStateHandle("j", 0, "right", source="b", partition="2", start=Position(0, 3), end=None)
    md = _md("exactly_once", [rng, lag], {"a": {"0": (0, 12), "1": (1, 9)}, "b": {"2": (0, 3)}}, bars)
    assert lagging_partitions(md) == ["b/partition=2"]
    assert consumed_positions(md) == {"a": {0: (0, 12), 1: (1, 9)}, "b": {2: (0, 3)}}
