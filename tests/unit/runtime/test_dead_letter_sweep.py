"""The operator dead-letter sweep (pipeline/runtime/dead_letters.py) on local, S3 (moto) and in-memory storage:
after a checkpoint of epoch m completes, a reader of ``operator=<uid>/epoch-<m>/`` sees each dead record once;
the files the checkpoint counts are never deleted (a failure mid-sweep loses nothing and the next sweep
finishes); the sweep lists this epoch's files only, whatever the history."""
from __future__ import annotations

import pytest

from pipeline.exceptions import InjectedFailure
from pipeline.faults import FAIL_ENV, reset_fault_counts
from pipeline.runtime.dead_letters import (
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
