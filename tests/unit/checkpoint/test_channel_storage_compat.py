"""Channels with ``int`` partitions (:mod:`pipeline.checkpoint.channel`) keep the stored formats byte for byte.

The fixture ``fixtures/pre_channel`` was written by the code before the change (main 2d7bebf, channels as
``(source, partition-as-str)``; see its README): a ``_metadata`` with the restore point and in-flight source ranges of
an unaligned snapshot, a barrier-log round entry, a lagged-read entry and a round plan, over 12 partitions (``"10"``
sorts before ``"2"`` as a string). The same inputs, keyed by :class:`Channel`, must write the same bytes, and the old
checkpoint must restore. No Spark.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.checkpoint.channel import Channel, nest, partition_key, partition_of
from pipeline.checkpoint.handles import ChannelStateHandle, Position
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.exceptions import CheckpointError
from pipeline.fileio import LocalFileIO
from pipeline.runtime.driver.barrier_log import BarrierLog
from pipeline.runtime.driver.cursor import Cursor, cursor_from_metadata
from pipeline.runtime.driver.finalize import restore_point
from pipeline.runtime.driver.input_epochs import InputEpochs
from pipeline.runtime.driver.round_values import RoundPlan
from pipeline.source.planner import Segment

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).parent / "fixtures" / "pre_channel"
P = 12
CHANNELS = [Channel("orders", p) for p in range(P)] + [Channel("payments", p) for p in range(3)]
POS = {ch: Position(ch.partition + 1, 7 * ch.partition + 3) for ch in CHANNELS}
BARRIERS = {"orders": {str(p): Position(p + 2, 0) for p in range(P)},
            "payments": {str(p): (None if p == 1 else Position(p + 2, 0)) for p in range(3)}}
RANGES = ((Channel("orders", 10), Position(11, 73), Position(12, 0)), (Channel("orders", 2), Position(3, 17), None),
          (Channel("payments", 1), Position(2, 10), None))


def _restore_point():
    working = Cursor(positions={"orders": {"3": Position(1, 1), "11": Position(2, 2)}, "payments": {}})
    snap = SimpleNamespace(restore=dict(POS), cut=dict(POS), ranges=RANGES)
    pending = SimpleNamespace(manifest=SimpleNamespace(barriers={"orders": {str(p): Position(p + 1, 0)
                                                                            for p in range(P)}}))
    return restore_point(pending, snap, working, "join", {})  # type: ignore[arg-type]


def _metadata(rp) -> CheckpointMetadata:
    return CheckpointMetadata(
        job="j", checkpoint_id=7, parent_id=6, kind="checkpoint", epoch=41, barrier_time="2024-01-01T10:00:00.000Z",
        checkpoint_mode="exactly_once", alignment="unaligned", max_parallelism=128, parallelism=2,
        positions=rp.positions,
        barriers={s: {p: b for p, b in parts.items() if b is not None} for s, parts in BARRIERS.items()},
        channel_state=tuple(rp.ranges), created_at="2024-01-01T10:00:02.000Z")


def test_the_restore_point_writes_the_metadata_of_before():
    rp = _restore_point()
    assert _metadata(rp).to_json() == (FIXTURE / "_metadata").read_text()
    assert json.dumps(rp.post_barrier) + "\n" == (FIXTURE / "post_barrier.json").read_text()
    assert [c.partition for c in rp.ranges] == [10, 2, 1]


def test_the_barrier_log_writes_the_round_and_lagged_entries_of_before(tmp_path):
    root = (tmp_path / "job").as_uri()
    log = BarrierLog(SimpleNamespace(job=SimpleNamespace(name="j"), ckpt_fio=LocalFileIO(), job_root=root))
    log.log_round(41, 7, 2, {ch: POS[ch] for ch in reversed(CHANNELS)})
    log.log_lagged(41, 7, BARRIERS, {ch: POS[ch] for ch in CHANNELS})
    for rel in ("barriers/rounds/epoch-41-chk-000000000007-r2.json", "barriers/lagged/epoch-41-chk-000000000007.json"):
        assert (tmp_path / "job" / rel).read_bytes() == (FIXTURE / "job" / rel).read_bytes(), rel


def test_the_round_plan_is_written_as_before():
    seg = {s: {ch.partition: Segment(s, ch.partition, Position(0, 0), POS[ch], POS[ch], (), 5, 1)
               for ch in CHANNELS if ch.source == s} for s in ("orders", "payments")}
    plan = RoundPlan(2, 123, {ch: Position(0, 0) for ch in CHANNELS}, seg, dict(POS), {ch: None for ch in CHANNELS},
                     frozenset([Channel("orders", 10), Channel("orders", 2), Channel("payments", 0)]), 0, 40)
    text = json.dumps(plan.to_json({"events": []}), indent=1) + "\n"
    assert text == (FIXTURE / "round_plan.json").read_text()


def test_a_checkpoint_written_before_restores():
    """The old ``_metadata`` reads back to the same bytes; its cursor resumes every channel where the old code would
    (an in-flight range at its start), and the channels read their positions through the one conversion."""
    text = (FIXTURE / "_metadata").read_text()
    md = CheckpointMetadata.from_json(text, "file:///fixture/_metadata")
    assert md.to_json() == text
    ranges = [c for c in md.channel_state if c.source_channel is not None]
    assert [(c.source_channel, c.start, c.end) for c in ranges] == list(RANGES)
    cur = cursor_from_metadata(md)
    assert cur.inflight == {}
    for ch in CHANNELS:
        in_flight = next((a for c, a, _ in RANGES if c == ch), None)
        assert ch.lookup(cur.positions) == (in_flight or POS[ch]), ch
    assert list(cur.positions["orders"]) == list(json.loads(text)["positions"]["orders"])  # the stored order


def test_epoch_of_raises_on_an_unknown_channel():
    current = {"orders": {"0": Position(2, 0), "1": None}}
    ie = InputEpochs.build(5, {4: {"orders": {"0": Position(1, 0), "1": Position(1, 5)}}}, current)
    assert ie.epoch_of(Channel("orders", 0), 0, 9) == 4
    assert ie.epoch_of(Channel("orders", 0), 1, 0) == 5
    assert ie.epoch_of(Channel("orders", 0), 2, 0) == 6     # past barrier n: read ahead
    assert ie.epoch_of(Channel("orders", 1), 1, 5) == 5     # lagging: its records belong to n
    for wrong in (("orders", "0"), Channel("orders", 2), Channel("payments", 0)):
        with pytest.raises(CheckpointError, match="unknown channel") as err:
            ie.epoch_of(wrong, 0, 0)  # type: ignore[arg-type]
        assert repr(wrong) in str(err.value) and "orders/partition=0" in str(err.value)
    with pytest.raises(CheckpointError, match="unknown channel"):
        ie.tag_splits(Channel("orders", 7), [])


def test_the_one_conversion():
    assert partition_of("11") == 11 and partition_of(3) == 3 and partition_key(11) == "11"
    assert Channel.of("s", "10") == Channel("s", 10) and Channel("s", 10).key == "10"
    assert Channel("s", 10).name == "s/partition=10"
    for bad in ("x", "", None, True):
        with pytest.raises(ValueError, match="not a partition number"):
            partition_of(bad)  # type: ignore[arg-type]
    assert list(nest({Channel("s", 2): 1, Channel("r", 0): 0, Channel("s", 10): 2})) == ["r", "s"]
    assert list(nest({Channel("s", 2): 1, Channel("s", 10): 2})["s"]) == ["10", "2"]   # stored (string) order
    h = ChannelStateHandle.from_dict(ChannelStateHandle.source_range("j", 0, Channel("s", 10), Position(1, 2),
                                                                     None).to_dict())
    assert h.partition == 10 and h.to_dict()["partition"] == "10" and h.channel == "s/partition=10"
