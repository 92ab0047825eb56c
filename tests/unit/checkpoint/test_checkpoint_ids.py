"""CheckpointIdCounter: strictly increasing, never reused, create-only claims."""
from __future__ import annotations

import threading

import pytest

from pipeline.checkpoint.ids import CheckpointIdCounter
from pipeline.fileio import LocalFileIO, join_uri

pytestmark = pytest.mark.unit


def test_ids_increase_across_restarts_and_old_claims_are_pruned(local_root):
    fio = LocalFileIO()
    job = join_uri(local_root, "job")
    c1 = CheckpointIdCounter(fio, job, keep_claims=2)
    assert [c1.next(), c1.next(), c1.next()] == [1, 2, 3]
    c2 = CheckpointIdCounter(fio, job, keep_claims=2)  # a restarted runner
    assert c2.next() == 4
    claims = [f.uri.rsplit("/", 1)[-1] for f in fio.list(join_uri(job, "ids"))]
    assert claims == ["000000000003", "000000000004"]  # a window of the newest, the max always kept
    assert c2.latest_claimed() == 4
    info = c2.claim_info(4)
    assert info is not None and info.runner == c2.runner_id


def test_a_pruned_id_recreated_from_a_stale_listing_is_not_used(local_root):
    fio = LocalFileIO()
    job = join_uri(local_root, "job")
    c1 = CheckpointIdCounter(fio, job, keep_claims=1)
    for _ in range(5):
        c1.next()
    assert c1._claimed_ids() == [5]
    stale = CheckpointIdCounter(fio, job)
    real = stale._claimed_ids
    calls = {"n": 0}

    def first_listing_is_stale():
        calls["n"] += 1
        return [] if calls["n"] == 1 else real()

    stale._claimed_ids = first_listing_is_stale  # type: ignore[method-assign]
    assert stale.next() == 6  # it could create ids/000000000001 again, but must not use id 1


def test_conflict_moves_upward(local_root):
    fio = LocalFileIO()
    job = join_uri(local_root, "job")
    counter = CheckpointIdCounter(fio, job)
    # another runner grabbed 1 and 2 but our listing is stale: simulate by pre-creating claims after listing
    original_list = counter._claimed_ids
    calls = {"n": 0}

    def stale_then_fresh():
        calls["n"] += 1
        if calls["n"] == 1:
            fio.write_bytes(counter.claim_uri(1), b"{}", if_none_match=True)
            fio.write_bytes(counter.claim_uri(2), b"{}", if_none_match=True)
            return []
        return original_list()

    counter._claimed_ids = stale_then_fresh  # type: ignore[method-assign]
    assert counter.next() == 3


def test_floors_never_reuse_ids(local_root):
    fio = LocalFileIO()
    job = join_uri(local_root, "job")
    # ids/ was lost but checkpoint directories exist
    fio.write_bytes(join_uri(job, "checkpoints", "chk-41", "_metadata"), b"{}")
    assert CheckpointIdCounter(fio, job).next() == 42
    assert CheckpointIdCounter(fio, job).next(at_least=100) == 100
    assert CheckpointIdCounter(fio, job).next() == 101


def test_concurrent_claims_are_distinct(any_root):
    fio, root = any_root
    job = join_uri(root, "job")
    n = 6
    barrier = threading.Barrier(n, timeout=60)
    got: list[int] = []

    def run():
        c = CheckpointIdCounter(fio, job)
        barrier.wait()
        got.extend([c.next(), c.next()])

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert len(got) == 2 * n and len(set(got)) == 2 * n
    assert CheckpointIdCounter(fio, job).latest_claimed() == max(got)
