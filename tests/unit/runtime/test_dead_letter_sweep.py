"""The operator dead-letter sweep (pipeline/runtime/operators/dead_letters.py) on local, S3 (moto) and in-memory storage:
after a checkpoint of epoch m completes, a reader of ``operator=<uid>/epoch-<m>/`` sees each dead record once;
the files the checkpoint counts are never deleted (a failure mid-sweep loses nothing and the next sweep
finishes); the sweep lists this epoch's files only, whatever the history."""
from __future__ import annotations

import pytest

from pipeline.exceptions import InjectedFailure
from pipeline.faults import FAIL_ENV, reset_fault_counts
from pipeline.runtime.operators.dead_letters import (
    DeadLetterFiles,
    attempt_dead_letter_dir,
    epoch_dead_letter_prefix,
    operator_dead_letter_prefix,
    sweep_dead_letters,
)

pytestmark = pytest.mark.unit

JOB, UID = "nulljob", "win"


class CountingIO:
    """A FileIO that counts listings and the entries they return (the sweep's S3 LIST cost)."""

    def __init__(self, inner) -> None:
        self.inner, self.lists, self.listed = inner, [], 0

    def list(self, prefix, **kw):
        out = self.inner.list(prefix, **kw)
        self.lists.append(prefix)
        self.listed += len(out)
        return out

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _write(fio, root: str, epoch: int, cid: int, names: list[str]) -> list[str]:
    d = attempt_dead_letter_dir(operator_dead_letter_prefix(root, JOB, UID), epoch, f"chk-{cid}")
    uris = [f"{d}/{n}" for n in names]
    for u in uris:
        fio.write_bytes(u, b"{}\n")
    return uris


def _present(fio, root: str, epoch: int) -> set[str]:
    return {f.uri for f in fio.list(f"{epoch_dead_letter_prefix(root, JOB, UID, epoch)}/", recursive=True)}


def test_sweep_keeps_exactly_the_completed_checkpoints_files(any_root):
    fio, root = any_root
    for e in range(40):  # history: earlier epochs, one completed checkpoint each, never listed again
        _write(fio, root, e, 100 + e, ["r0-kg-00000-00007.t0.parquet"])
    crashed = _write(fio, root, 40, 141, ["r0-kg-00000-00007.t0.parquet", "r0-kg-00008-00015.t0.parquet"])
    kept = _write(fio, root, 40, 142, ["r0-kg-00000-00004.t0.parquet", "r0-kg-00005-00010.t0.parquet"])
    failed_task = _write(fio, root, 40, 142, ["r0-kg-00000-00004.t1.parquet"])
    other = _write(fio, root, 40, 90, ["r0-kg-00000-00015.t0.parquet"])  # a retained checkpoint (rewound branch)
    cio = CountingIO(fio)
    res = sweep_dead_letters(cio, root, JOB, 142, DeadLetterFiles(40, {UID: tuple(kept)}),
                             is_completed=lambda cid: cid in (90, 142))
    assert (res.deleted_attempts, res.deleted_files, res.listed) == (1, 1, 1)
    assert _present(fio, root, 40) == set(kept) | set(other)
    assert not set(crashed) & _present(fio, root, 40) and not set(failed_task) & _present(fio, root, 40)
    # O(new files): one listing of this epoch's prefix, whatever the 40 epochs of history
    assert cio.lists == [f"{epoch_dead_letter_prefix(root, JOB, UID, 40)}/"] and cio.listed == 6
    assert all(_present(fio, root, e) for e in range(40))
    # idempotent: a second sweep (the next restore) changes nothing
    again = sweep_dead_letters(fio, root, JOB, 142, DeadLetterFiles(40, {UID: tuple(kept)}),
                               is_completed=lambda cid: cid in (90, 142))
    assert (again.deleted_attempts, again.deleted_files) == (0, 0)


def test_a_failure_mid_sweep_loses_nothing_and_the_next_sweep_finishes(local_root, monkeypatch):
    from pipeline.fileio import LocalFileIO
    fio, root = LocalFileIO(), local_root
    stale = [_write(fio, root, 3, cid, ["a.jsonl"]) for cid in (7, 8, 9)]
    kept = _write(fio, root, 3, 10, ["left-r0-00000.jsonl", "left-r0-00001.jsonl"])
    files = DeadLetterFiles(3, {UID: tuple(kept)})
    monkeypatch.setenv(FAIL_ENV, "dead_letter_sweep:2")
    reset_fault_counts()
    with pytest.raises(InjectedFailure):
        sweep_dead_letters(fio, root, JOB, 10, files, is_completed=lambda cid: cid == 10)
    left = _present(fio, root, 3)
    assert set(kept) <= left and len(left) == len(kept) + 1  # two stale attempts gone, the counted files kept
    monkeypatch.delenv(FAIL_ENV)
    sweep_dead_letters(fio, root, JOB, 10, files, is_completed=lambda cid: cid == 10)
    assert _present(fio, root, 3) == set(kept)
    assert not any(s[0] in _present(fio, root, 3) for s in stale)
    # no empty attempt directory is left for a reader to list (local file system)
    epoch_dir = epoch_dead_letter_prefix(root, JOB, UID, 3)[len("file://"):]
    import os
    assert sorted(os.listdir(epoch_dir)) == ["chk-10"]


def test_metadata_round_trip():
    d = DeadLetterFiles(5, {"b": ("x",), "a": ("y", "z")})
    assert DeadLetterFiles.from_extra({"dead_letter_files": d.to_dict()}, 0) == d
    assert DeadLetterFiles.from_extra({}, 4) == DeadLetterFiles(4, {})


def test_retention_removes_a_rewound_branchs_dead_letters_once_a_newer_branch_completed_the_epoch(local_root):
    """Main line: checkpoints 1-3 (epochs 1-3). A rewind to checkpoint 1 re-completes epochs 2 and 3 as checkpoints
    4 and 5. While checkpoints 2 and 3 are retained their dead letters stay (a restore may come back to them);
    when retention discards them, the epoch is swept again for the newer checkpoint, so each epoch's location
    holds one checkpoint's dead letters. Epoch 1 (main line, never re-completed) keeps its files."""
    from pipeline.checkpoint.completed import CompletedCheckpoint
    from pipeline.checkpoint.metadata import CheckpointMetadata
    from pipeline.checkpoint.store import CompletedCheckpointStore
    from pipeline.exceptions import ObjectNotFoundError
    from pipeline.fileio import LocalFileIO, join_uri
    from pipeline.runtime.operators.dead_letters import superseding_checkpoints

    fio, root = LocalFileIO(), local_root
    job_root = join_uri(root, "checkpoints-root", JOB)
    store = CompletedCheckpointStore(fio, job_root, retain=2)

    def complete(cid: int, parent: int | None, epoch: int, dead: bool) -> CompletedCheckpoint:
        files = _write(fio, root, epoch, cid, ["r0-kg-00000-00007.t0.parquet"]) if dead else []
        extra = {"dead_letter_files": DeadLetterFiles(epoch, {UID: tuple(files)}).to_dict()} if dead else {}
        md = CheckpointMetadata(job=JOB, checkpoint_id=cid, parent_id=parent, kind="checkpoint", epoch=epoch,
                                barrier_time="t", checkpoint_mode="exactly_once", alignment="aligned",
                                max_parallelism=8, parallelism=1, operators={}, extra=extra)
        fio.write_bytes(join_uri(store.location_of(cid), "_metadata"), md.to_bytes(), if_none_match=True)
        return CompletedCheckpoint(md, store.location_of(cid))

    def completed(cid: int) -> bool:
        try:
            store.get(cid)
            return True
        except ObjectNotFoundError:
            return False

    swept: list[int] = []

    def on_discarded(discarded, retained) -> None:
        for z in superseding_checkpoints(discarded, retained):
            swept.append(z.checkpoint_id)
            sweep_dead_letters(fio, root, JOB, z.checkpoint_id,
                               DeadLetterFiles.from_extra(z.metadata.extra, z.epoch), completed)

    def dirs(epoch: int) -> set[str]:
        prefix = epoch_dead_letter_prefix(root, JOB, UID, epoch)
        return {u[len(prefix):].strip("/").split("/")[0] for u in _present(fio, root, epoch)}

    for cid, parent, epoch in ((1, None, 1), (2, 1, 2), (3, 2, 3), (4, 1, 2), (5, 4, 3)):
        store.add(complete(cid, parent, epoch, True), on_discarded=on_discarded)
        if cid == 4:  # checkpoints 3 and 4 retained; 2 (epoch 2, rewound branch) discarded and superseded by 4
            assert swept == [4] and dirs(2) == {"chk-4"} and dirs(3) == {"chk-3"} and dirs(1) == {"chk-1"}
    store.add(complete(6, 5, 4, False), on_discarded=on_discarded)
    assert swept == [4, 5]
    assert (dirs(1), dirs(2), dirs(3)) == ({"chk-1"}, {"chk-4"}, {"chk-5"})
