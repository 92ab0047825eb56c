"""CheckpointCoordinator: trigger (write-ahead), acks, complete, timeout, tolerable failures, savepoints."""
from __future__ import annotations

import pytest

from pipeline.checkpoint.ack import AckResult
from pipeline.checkpoint.coordinator import CheckpointCoordinator
from pipeline.checkpoint.failure import CheckpointFailureReason as R
from pipeline.checkpoint.handles import FileHandle, Position, StateHandle
from pipeline.checkpoint.pending import PendingManifest
from pipeline.checkpoint.report import TaskReport
from pipeline.exceptions import (
    CheckpointDeclinedError,
    CheckpointError,
    CheckpointFencedError,
    TooManyFailedCheckpointsError,
)
from pipeline.fileio import LocalFileIO, join_uri, sha256_of
from pipeline.testing.doubles import FakeClock, FlakyFileIO

pytestmark = pytest.mark.unit


def coordinator(fio, root, **kw) -> CheckpointCoordinator:
    kw.setdefault("clock", FakeClock())
    return CheckpointCoordinator(fio, root, "job", **kw)


def trigger(coord, parent_id=None, epoch=1, **kw):
    return coord.trigger(epoch=epoch, barrier_time="2024-01-01T00:00:00Z", expected_tasks={"agg": 2},
                         parent_id=parent_id, max_parallelism=8, parallelism=2,
                         positions={"orders": {"0": Position(epoch, 0)}}, sink_tables=["out"], **kw)


def task_rows(fio, pending, tag=""):
    rows = []
    for s in (0, 1):
        uri = join_uri(pending.location, "rounds", "0", f"agg-{s}.parquet")
        data = f"state {s} {tag}".encode()
        fio.write_bytes(uri, data)
        rows.append(TaskReport.of_state(StateHandle("agg", s, 4 * s, 4 * s + 3, "agg",
                                                    FileHandle(uri, 2, len(data), sha256_of(data))),
                                        sync_ms=1.0, async_ms=2.0))
    return rows


def run_checkpoint(fio, coord, parent_id=None, epoch=1):
    p = trigger(coord, parent_id=parent_id, epoch=epoch)
    results = coord.receive_acknowledge_reports(p, task_rows(fio, p))
    assert set(results.values()) == {AckResult.SUCCESS}
    return coord.complete(p)


def test_full_cycle(local_root):
    fio = LocalFileIO()
    coord = coordinator(fio, local_root)
    assert coord.restore_latest() == (None, [])
    p = trigger(coord, plan={"segments": {"orders/0": [0, 0, 1, 0]}})
    assert p.checkpoint_id == 1
    manifest = PendingManifest.from_json(fio.read_bytes(p.pending_uri))  # write-ahead, before any task runs
    assert manifest.expected_tasks == (("agg", 0), ("agg", 1)) and manifest.runner == coord.runner_id
    assert not fio.exists(p.metadata_uri)
    coord.receive_acknowledge_reports(p, task_rows(fio, p))
    completed = coord.complete(p, backlog={"orders": 0})
    assert completed.checkpoint_id == 1 and fio.exists(completed.metadata_uri)
    assert completed.metadata.stats.operators["agg"].acks == 2
    assert completed.metadata.sinks["out"].files == ()
    assert coord.pending_checkpoints == []
    cp, problems = coord.restore_latest()
    assert cp == completed and problems == []


def test_retention_and_ids_across_restarts(local_root):
    fio = LocalFileIO()
    parent = None
    for i in range(5):
        coord = coordinator(fio, local_root, retained_checkpoints=2)  # a new process every round
        latest, _ = coord.restore_latest()
        parent = latest.checkpoint_id if latest else None
        done = run_checkpoint(fio, coord, parent_id=parent, epoch=i)
        assert done.checkpoint_id == i + 1 and done.parent_id == parent
    assert coord.store.ids() == [4, 5]


def test_ack_results_through_coordinator(local_root):
    fio = LocalFileIO()
    coord = coordinator(fio, local_root)
    p = trigger(coord)
    assert coord.acknowledge_task(p, "agg", 0) is AckResult.SUCCESS
    assert coord.acknowledge_task(p.checkpoint_id, "agg", 0) is AckResult.DUPLICATE
    assert coord.acknowledge_task(p, "nope", 0) is AckResult.UNKNOWN
    assert coord.acknowledge_task(999, "agg", 0) is AckResult.UNKNOWN
    with pytest.raises(CheckpointError, match=r"agg\[1\]"):
        coord.complete(p)  # still pending, nothing written
    assert fio.exists(p.pending_uri)
    coord.abort(p, R.CHECKPOINT_COORDINATOR_SHUTDOWN)
    assert coord.acknowledge_task(p.checkpoint_id, "agg", 1) is AckResult.DISCARDED
    assert coord.failure_count == 0  # shutdown does not count


def test_timeout_expires_and_counts(local_root):
    fio = LocalFileIO()
    clock = FakeClock()
    coord = coordinator(fio, local_root, clock=clock, checkpoint_timeout_s=60, tolerable_failed_checkpoints=1)
    p = trigger(coord)
    coord.receive_acknowledge_reports(p, task_rows(fio, p))
    clock.t += 61
    with pytest.raises(CheckpointDeclinedError, match="expired after 61.0s") as err:
        coord.complete(p)
    assert err.value.reason is R.CHECKPOINT_EXPIRED
    assert p.failure_reason is R.CHECKPOINT_EXPIRED
    assert fio.list(p.location) == [] and coord.failure_count == 1
    # a late ack of an expired checkpoint is discarded
    q = trigger(coord)
    clock.t += 100
    with pytest.raises(TooManyFailedCheckpointsError, match="2 consecutive failed checkpoints.*CHECKPOINT_EXPIRED"):
        coord.acknowledge_task(q, "agg", 0)
    assert q.failure_reason is R.CHECKPOINT_EXPIRED


def test_tolerable_failures_reset_by_success(local_root):
    fio = LocalFileIO()
    coord = coordinator(fio, local_root, tolerable_failed_checkpoints=1)
    p = trigger(coord)
    coord.decline(p, "agg", 1, cause=RuntimeError("disk full"))
    assert p.failure_reason is R.CHECKPOINT_DECLINED and coord.failure_count == 1
    run_checkpoint(fio, coord)
    assert coord.failure_count == 0
    coord.abort(trigger(coord), R.CHECKPOINT_DECLINED)
    with pytest.raises(TooManyFailedCheckpointsError, match="job 'job'.*tolerable number \\(1\\)"):
        coord.abort(trigger(coord), R.CHECKPOINT_ASYNC_EXCEPTION)


def test_zero_tolerance_is_flinks_default(local_root):
    fio = LocalFileIO()
    coord = coordinator(fio, local_root)
    with pytest.raises(TooManyFailedCheckpointsError):
        coord.abort(trigger(coord), R.CHECKPOINT_DECLINED)
    unlimited = coordinator(fio, local_root, tolerable_failed_checkpoints=None)
    for _ in range(3):
        unlimited.abort(trigger(unlimited), R.CHECKPOINT_DECLINED)
    assert unlimited.failure_count == 3


def test_pre_flight_rejections_are_not_counted(local_root):
    fio = LocalFileIO()
    clock = FakeClock()
    coord = coordinator(fio, local_root, clock=clock, min_pause_between_checkpoints_s=30)
    p = trigger(coord)
    with pytest.raises(CheckpointDeclinedError) as err:
        trigger(coord)
    assert err.value.reason is R.TOO_MANY_CHECKPOINT_REQUESTS
    coord.receive_acknowledge_reports(p, task_rows(fio, p))
    coord.complete(p)
    with pytest.raises(CheckpointDeclinedError) as err:
        trigger(coord)
    assert err.value.reason is R.MINIMUM_TIME_BETWEEN_CHECKPOINTS
    clock.t += 31
    assert trigger(coord).checkpoint_id == 2
    assert coord.failure_count == 0


def test_finalize_failure_aborts_and_counts(local_root):
    fio = FlakyFileIO()
    coord = coordinator(fio, local_root, tolerable_failed_checkpoints=5)
    p = trigger(coord)
    coord.receive_acknowledge_reports(p, task_rows(fio, p))
    fio.fail_names.add("_metadata")
    with pytest.raises(CheckpointDeclinedError, match="could not write .*chk-1/_metadata") as err:
        coord.complete(p)
    assert err.value.reason is R.FINALIZE_CHECKPOINT_FAILURE
    assert coord.failure_count == 1 and fio.list(p.location) == []
    assert coord.store.list() == []


def test_trigger_failure_is_reported(local_root):
    fio = FlakyFileIO()
    fio.fail_names.add("_pending.json")
    coord = coordinator(fio, local_root, tolerable_failed_checkpoints=5)
    with pytest.raises(CheckpointDeclinedError, match="_pending.json") as err:
        trigger(coord)
    assert err.value.reason is R.TRIGGER_CHECKPOINT_FAILURE and coord.failure_count == 1
    fio.fail_names.clear()
    assert trigger(coord).checkpoint_id == 2  # ids are never reused


def test_resume_a_checkpoint_that_spans_rounds(local_root):
    fio = LocalFileIO()
    first = coordinator(fio, local_root)
    p = trigger(first)
    first.release(p)  # round 1 ends with a backlog; the process exits
    second = coordinator(fio, local_root)
    again = second.resume(p.checkpoint_id)
    assert again.manifest == p.manifest and again.acknowledged_tasks == frozenset()
    second.receive_acknowledge_reports(again, task_rows(fio, again, tag="round 2"))
    done = second.complete(again, rounds=2)
    assert done.metadata.stats.rounds == 2
    with pytest.raises(CheckpointError, match="already completed"):
        coordinator(fio, local_root).resume(p.checkpoint_id)


def test_resume_is_fenced_by_a_newer_claim(local_root):
    fio = LocalFileIO()
    first = coordinator(fio, local_root)
    p = trigger(first)
    first.release(p)
    coordinator(fio, local_root).counter.next()
    with pytest.raises(CheckpointFencedError, match="newer checkpoint id 2"):
        coordinator(fio, local_root).resume(p.checkpoint_id)


def test_savepoint_goes_to_savepoints_and_survives_retention(local_root):
    fio = LocalFileIO()
    coord = coordinator(fio, local_root, retained_checkpoints=1)
    run_checkpoint(fio, coord)
    sp = trigger(coord, parent_id=1, kind="savepoint")
    assert "/job/savepoints/sp-2-" in sp.location
    coord.receive_acknowledge_reports(sp, task_rows(fio, sp))
    done = coord.complete(sp)
    assert done.is_savepoint
    for _ in range(2):
        run_checkpoint(fio, coord, parent_id=2)
    assert coord.store.ids() == [4]
    done.verify(fio)
    assert coord.store.savepoints() == [done]


def test_garbage_of_crashed_runs_is_cleaned_but_own_pending_kept(local_root):
    fio = LocalFileIO()
    crashed = coordinator(fio, local_root)
    dead = trigger(crashed)
    fio.write_bytes(join_uri(dead.location, "rounds", "0", "agg-0.parquet"), b"half written")
    coord = coordinator(fio, local_root)
    mine = trigger(coord)
    assert coord.cleanup_garbage() == [dead.checkpoint_id]
    assert fio.exists(mine.pending_uri)
