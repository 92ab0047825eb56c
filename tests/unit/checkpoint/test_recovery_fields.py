"""The recovery fields of ``_metadata`` (pipeline.checkpoint.recovery_fields): read typed from the ``extra``
object checkpoints have always written, and written back as the same object."""
from __future__ import annotations

import json

import pytest

from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.checkpoint.recovery_fields import RecoveryFields

pytestmark = pytest.mark.unit

#: the extra object of a checkpoint completed by an unaligned round (as finalize wrote it before the typed fields)
EXTRA = {"records": {"orders": 120, "payments": 7}, "round_records": [{"orders": 100, "payments": 7},
                                                                   {"orders": 20, "payments": 0}],
         "alignment": {"mode_used": "aligned_then_unaligned", "alignment_ms": 12.5, "inflight_bytes": 300},
         "dropped": {"dedup": 3}, "low_epoch": 4, "inflight_low_epoch": 3,
         "dead_letter_files": {"epoch": 5, "files": {"win": ["s3://b/dl/a.parquet"]}},
         "source_bytes_per_row": {"orders": 41.5}, "source_files": {"orders/0": [[1, 2048]]},
         "bootstrap": {"epoch": 5}}


def _md(extra) -> CheckpointMetadata:
    return CheckpointMetadata(job="j", checkpoint_id=6, parent_id=5, epoch=5, barrier_time="2026-01-01T00:05:00Z",
                              checkpoint_mode="exactly_once", alignment="unaligned", max_parallelism=8,
                              parallelism=2, extra=extra)


def _plain(x):
    """As JSON has it (the metadata holds its extra object frozen: tuples for lists)."""
    return json.loads(json.dumps(x))


def test_the_fields_read_typed_and_write_back_the_same_object():
    rec = _md(EXTRA).recovery
    assert (rec.low_epoch, rec.inflight_low_epoch, rec.records, rec.dropped) == (4, 3, EXTRA["records"], {"dedup": 3})
    assert rec.round_records == tuple(EXTRA["round_records"]) and rec.bytes_per_row == {"orders": 41.5}
    assert rec.alignment["mode_used"] == "aligned_then_unaligned" and _plain(rec.source_files) == EXTRA["source_files"]
    assert _plain(rec.dead_letter_files) == EXTRA["dead_letter_files"]
    assert _plain(rec.to_extra()) == {k: v for k, v in EXTRA.items() if k != "bootstrap"}  # other keys are not its own
    again = CheckpointMetadata.from_json(_md({**rec.to_extra(), "bootstrap": {"epoch": 5}}).to_json()).recovery
    assert again == rec


def test_absent_fields_of_an_old_checkpoint_are_none_or_empty():
    rec = _md({}).recovery
    assert rec == RecoveryFields() and rec.low_epoch is None and rec.records is None
    assert rec.low_epoch_or(5) == 5 and _md({"low_epoch": 2}).recovery.low_epoch_or(5) == 2
    assert rec.to_extra() == {"dropped": {}, "source_files": {}}  # what every finalized checkpoint writes
