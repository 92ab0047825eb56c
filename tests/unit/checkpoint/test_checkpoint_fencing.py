"""Two runners of the same job: at most one commits, the loser fails with CheckpointError, CheckpointFencedError."""
from __future__ import annotations

import threading

import pytest

from pipeline.checkpoint.coordinator import CheckpointCoordinator
from pipeline.checkpoint.failure import CheckpointFailureReason as R
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import TaskReport
from pipeline.checkpoint.store import CheckpointDirStatus
from pipeline.exceptions import CheckpointError, CheckpointFencedError, StorageError
from pipeline.fileio import join_uri, sha256_of

pytestmark = pytest.mark.unit


def runner(fio, root, name):
    return CheckpointCoordinator(fio, root, "job", runner_id=name, checkpoint_timeout_s=300)


def trigger(coord, parent_id=None):
    return coord.trigger(epoch=1, barrier_time="2024-01-01T00:00:00Z", expected_tasks={"agg": 1},
                         parent_id=parent_id, max_parallelism=4, parallelism=1)


def ack(fio, coord, p):
    uri = join_uri(p.location, "rounds", "0", "agg-0.parquet")
    data = f"state by {coord.runner_id}".encode()
    fio.write_bytes(uri, data)
    coord.receive_acknowledge_reports(p, [TaskReport.of_state(StateHandle(
        "agg", 0, 0, 3, "agg", FileHandle(uri, 1, len(data), sha256_of(data))))])


def test_older_claim_loses_to_newer_claim(any_root):
    fio, root = any_root
    a, b = runner(fio, root, "runner-A"), runner(fio, root, "runner-B")
    a.restore_latest(), b.restore_latest()
    pa, pb = trigger(a), trigger(b)
    assert (pa.checkpoint_id, pb.checkpoint_id) == (1, 2)
    ack(fio, a, pa), ack(fio, b, pb)
    with pytest.raises(CheckpointFencedError) as err:
        a.complete(pa)
    msg = str(err.value)
    assert "job 'job'" in msg and "checkpoint 1" in msg and "newer checkpoint id 2" in msg and "runner-B" in msg
    assert pa.failure_reason is R.CHECKPOINT_FENCED and a.failure_count == 0
    assert not fio.exists(pa.metadata_uri) and fio.list(pa.location) == []
    done = b.complete(pb)
    assert [cp.checkpoint_id for cp in b.store.list()] == [done.checkpoint_id] == [2]


def test_runner_that_missed_a_concurrent_completion_is_fenced(any_root):
    fio, root = any_root
    a, b = runner(fio, root, "runner-A"), runner(fio, root, "runner-B")
    a.restore_latest(), b.restore_latest()  # both start from "nothing"
    pa = trigger(a)
    ack(fio, a, pa)
    a.complete(pa)  # A commits checkpoint 1 first
    pb = trigger(b)  # B claims 2 (newest claim), but still from B's stale view
    ack(fio, b, pb)
    with pytest.raises(CheckpointFencedError, match="checkpoint 1 was completed by another runner") as err:
        b.complete(pb)
    assert "checkpoint 2" in str(err.value)
    statuses = {i.checkpoint_id: i.status for i in b.store.inspect()}
    assert statuses == {1: CheckpointDirStatus.COMPLETED}


def test_racing_runners_at_most_one_commits(any_root):
    fio, root = any_root
    n = 4
    coords = [runner(fio, root, f"runner-{i}") for i in range(n)]
    for c in coords:
        c.restore_latest()
    barrier = threading.Barrier(n, timeout=60)
    outcome: dict[str, object] = {}

    def run(c):
        try:
            barrier.wait()
            p = trigger(c)
            barrier.wait()  # everyone has claimed before anyone finalizes
            ack(fio, c, p)
            outcome[c.runner_id] = c.complete(p).checkpoint_id
        except CheckpointError as e:  # fenced, or its claim/trigger lost a race: a clear error, no commit
            outcome[c.runner_id] = e
        except StorageError as e:   # its pending directory was swept by a newer claimant while it wrote its acks:
            outcome[c.runner_id] = e  # the write fails naming the file (seen under load); it never commits

    threads = [threading.Thread(target=run, args=(c,)) for c in coords]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    winners = {k: v for k, v in outcome.items() if isinstance(v, int)}
    losers = {k: v for k, v in outcome.items() if isinstance(v, (CheckpointError, StorageError))}
    assert len(winners) == 1 and len(losers) == n - 1, outcome
    (winner_id,) = winners.values()
    # the newest claim wins; ids are strictly increasing but a claim that lost a listing race is re-taken
    # one higher, so the newest id may exceed n
    assert winner_id == coords[0].counter.latest_claimed() and winner_id >= n
    for e in losers.values():
        if isinstance(e, StorageError):
            assert "/checkpoints/chk-" in str(e), e
            continue
        assert "job 'job'" in str(e)
        if isinstance(e, CheckpointFencedError):
            assert f"newer checkpoint id {winner_id}" in str(e)
    completed = [i.checkpoint_id for i in coords[0].store.inspect() if i.status is CheckpointDirStatus.COMPLETED]
    assert completed == [winner_id]


def trigger_grouped(coord, parent_id):
    return coord.trigger(epoch=1, barrier_time="2024-01-01T00:00:00Z", expected_tasks={"agg": 1},
                         parent_id=parent_id, max_parallelism=4, parallelism=1, grouped=True)


def test_grouped_checkpoints_of_one_round_complete_in_order_despite_their_own_newer_claims(any_root):
    """Several epochs per round: the round's checkpoints are triggered together (consecutive ids, not counted
    against max concurrent checkpoints) and completed in order; their own newer claims do not fence them, a
    garbage cleanup in between spares the pending ones."""
    fio, root = any_root
    a = runner(fio, root, "runner-A")
    a.restore_latest()
    group = []
    for _ in range(3):
        group.append(trigger_grouped(a, group[-1].checkpoint_id if group else None))
    assert [p.checkpoint_id for p in group] == [1, 2, 3]
    with pytest.raises(CheckpointError, match="cannot trigger a checkpoint while 3 is pending"):
        trigger(a, parent_id=3)  # an ungrouped trigger still counts them
    for p in group:
        ack(fio, a, p)
    for p in group:
        a.complete(p)  # cleanup_garbage runs inside: the later pending checkpoints of the round survive it
    assert a.store.ids() == [1, 2, 3]


def test_a_claim_by_another_runner_fences_a_group(any_root):
    fio, root = any_root
    a, b = runner(fio, root, "runner-A"), runner(fio, root, "runner-B")
    a.restore_latest(), b.restore_latest()
    p1 = trigger_grouped(a, None)
    pb = trigger(b)  # B claims 2 between the round's claims
    with pytest.raises(CheckpointFencedError, match="does not follow 1"):
        trigger_grouped(a, p1.checkpoint_id)
    ack(fio, a, p1)
    with pytest.raises(CheckpointFencedError, match="newer checkpoint id"):
        a.complete(p1)  # B's claim is newer than the group's newest own claim
    ack(fio, b, pb)
    with pytest.raises(CheckpointFencedError, match="newer checkpoint id 3"):
        b.complete(pb)  # A's claim 3 (its fenced trigger) is newer: nothing is committed by either
    assert a.store.ids() == []
