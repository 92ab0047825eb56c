"""Failed checkpoints are recorded with their reason (fenced ones included) and shown in the history."""
import pytest
from test_checkpoint_coordinator import coordinator, run_checkpoint, task_rows, trigger

from pipeline.checkpoint.ack import AckResult
from pipeline.checkpoint.failed import FailedCheckpointLog
from pipeline.exceptions import CheckpointFencedError
from pipeline.fileio import LocalFileIO, join_uri
from pipeline.orchestration.history import CheckpointHistory

pytestmark = pytest.mark.unit


def test_fenced_checkpoint_is_recorded_and_listed_as_failed(local_root):
    fio = LocalFileIO()
    run_checkpoint(fio, coordinator(fio, local_root))                   # checkpoint 1 completes
    loser = coordinator(fio, local_root)
    p = trigger(loser, parent_id=1, epoch=2)                            # checkpoint 2 (the loser)
    assert set(loser.receive_acknowledge_reports(p, task_rows(fio, p)).values()) == {AckResult.SUCCESS}
    winner = coordinator(fio, local_root)
    run_checkpoint(fio, winner, parent_id=1, epoch=2)                   # checkpoint 3 (another runner)
    with pytest.raises(CheckpointFencedError):
        loser.complete(p)
    failed = FailedCheckpointLog(fio, join_uri(local_root, "job")).list()
    assert [(d["checkpoint_id"], d["reason"]) for d in failed] == [(2, "CHECKPOINT_FENCED")]
    assert "CheckpointFencedError" in failed[0]["cause"] and failed[0]["epoch"] == 2
    rows = {r.checkpoint_id: r for r in CheckpointHistory(fio, local_root, "job").checkpoints()}
    assert rows[2].status == "FAILED" and "CHECKPOINT_FENCED" in rows[2].problem
    assert rows[1].status == rows[3].status == "COMPLETED"


def test_failed_log_keeps_the_newest(local_root):
    from pipeline.checkpoint.failure import CheckpointFailureReason as R
    fio = LocalFileIO()
    coord = coordinator(fio, local_root, tolerable_failed_checkpoints=10)
    for _ in range(4):
        coord.abort(trigger(coord), R.CHECKPOINT_DECLINED)
    full = FailedCheckpointLog(fio, join_uri(local_root, "job"))
    assert [(d["checkpoint_id"], d["reason"]) for d in full.list()] == [(i, "CHECKPOINT_DECLINED") for i in (4, 3, 2, 1)]
    log = FailedCheckpointLog(fio, join_uri(local_root, "job"), keep=3)
    log.record(trigger(coord), R.CHECKPOINT_EXPIRED, None)
    assert [d["checkpoint_id"] for d in log.list()] == [5, 4, 3]
