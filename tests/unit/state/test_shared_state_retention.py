"""Retention with incremental checkpoints: a shared state file is deleted only when no retained checkpoint and
no savepoint references it; unreferenced ones are collected; SIGKILLs during retention leave no referenced file
missing, and the next pass collects what they left behind."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pipeline.checkpoint.completed import CompletedCheckpoint
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.checkpoint.store import CompletedCheckpointStore
from pipeline.fileio import LocalFileIO, join_uri, sha256_of
from pipeline.layout import JobLayout, shared_state_uri

pytestmark = pytest.mark.unit


def shared_file(fio, job_root: str, cid: int, kind: str, tag: str = "", state: str = "agg") -> FileHandle:
    uri = shared_state_uri(JobLayout(job_root).shared("op"), state, 0, 7, cid, 0, kind)
    if tag:
        uri = uri.replace(".parquet", f".{tag}.parquet")
    data = f"{uri} bytes".encode()
    fio.write_bytes(uri, data)
    return FileHandle(uri, 1, len(data), sha256_of(data))


def checkpoint(fio, job_root: str, cid: int, chains: dict[str, list[FileHandle]], *, location=None,
               kind="checkpoint") -> CompletedCheckpoint:
    location = location or JobLayout(job_root).checkpoint(cid)
    hs = tuple(StateHandle("op", 0, 0, 7, name, files[0], deltas=tuple(files[1:]), state_rows=1)
               for name, files in sorted(chains.items()))
    md = CheckpointMetadata(job="job", checkpoint_id=cid, parent_id=cid - 1 if cid > 1 else None, kind=kind,
                            epoch=cid, barrier_time="t", checkpoint_mode="exactly_once", alignment="aligned",
                            max_parallelism=8, parallelism=1, operators={"op": hs})
    fio.write_bytes(join_uri(location, "_metadata"), md.to_bytes(), if_none_match=True)
    return CompletedCheckpoint(md, location)


def _exists(f: FileHandle) -> bool:
    return Path(f.uri[len("file://"):]).exists()


def test_retention_keeps_referenced_shared_files_and_collects_the_rest(local_root):
    fio = LocalFileIO()
    job_root = join_uri(local_root, "job")
    b1 = shared_file(fio, job_root, 1, "base")
    d2 = shared_file(fio, job_root, 2, "delta")
    d3 = shared_file(fio, job_root, 3, "delta")
    b4 = shared_file(fio, job_root, 4, "base")
    d5 = shared_file(fio, job_root, 5, "delta")
    orphan = shared_file(fio, job_root, 2, "delta", tag="t99")      # a failed task attempt's file
    kept_by_sp = shared_file(fio, job_root, 3, "base", state="other")
    pending = shared_file(fio, job_root, 6, "delta")                # checkpoint 6 is still running
    store = CompletedCheckpointStore(fio, job_root, retain=2)
    cps = [checkpoint(fio, job_root, 1, {"agg": [b1]}), checkpoint(fio, job_root, 2, {"agg": [b1, d2]}),
           checkpoint(fio, job_root, 3, {"agg": [b1, d2, d3], "other": [kept_by_sp]}),
           checkpoint(fio, job_root, 4, {"agg": [b4]}), checkpoint(fio, job_root, 5, {"agg": [b4, d5]})]
    # a savepoint that (unusually) references a shared file: it protects it
    checkpoint(fio, job_root, 3, {"other": [kept_by_sp]}, location=JobLayout(job_root).savepoint(3, "x"),
               kind="savepoint")
    assert store.add(cps[-1]) == [1, 2, 3]
    assert all(_exists(f) for f in (b4, d5, kept_by_sp, pending))
    assert not any(_exists(f) for f in (b1, d2, d3, orphan))
    # a checkpoint that is still being written (id >= the newest claim) keeps its files until it is garbage
    assert store.cleanup_garbage(protect_from_id=6) == [] and _exists(pending)
    store.cleanup_garbage(protect_from_id=7)
    assert not _exists(pending) and _exists(d5)


_RETENTION = textwrap.dedent("""
    import sys
    from pipeline.checkpoint.store import CompletedCheckpointStore
    from pipeline.fileio import LocalFileIO
    store = CompletedCheckpointStore(LocalFileIO(), sys.argv[1], retain=1)
    store.add(store.get(int(sys.argv[2])))
""")


def _prepare(fio, job_root: str, n: int, files_per: int) -> None:
    base = [shared_file(fio, job_root, 1, "base", state=f"s{j}") for j in range(files_per)]
    chains = {f"s{j}": [base[j]] for j in range(files_per)}
    for cid in range(1, n + 1):
        if cid > 1:
            if cid % 3 == 1:  # materialised again: new bases
                chains = {f"s{j}": [shared_file(fio, job_root, cid, "base", state=f"s{j}")] for j in range(files_per)}
            else:
                chains = {k: v + [shared_file(fio, job_root, cid, "delta", state=k)] for k, v in chains.items()}
        checkpoint(fio, job_root, cid, chains)


def _referenced_all_exist(fio, job_root: str) -> set[str]:
    store = CompletedCheckpointStore(fio, job_root)
    refs = store.referenced_uris(store.list())
    missing = [u for u in refs if not Path(u[len("file://"):]).exists()]
    assert not missing, f"referenced files missing after a kill: {missing[:3]}"
    return refs


def test_sigkill_during_retention_leaves_no_referenced_file_missing_and_no_orphan_after_the_next_pass(tmp_path):
    fio = LocalFileIO()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    rng = random.Random(5)
    durations = []
    for trial in range(6):
        job_root = (tmp_path / f"t{trial}" / "job").as_uri()
        _prepare(fio, job_root, 8, 60)
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-c", _RETENTION, job_root, "8"], env=env)
        if trial == 0:  # the undisturbed run tells how long retention takes
            assert p.wait(60) == 0
            durations.append(time.perf_counter() - t0)
        else:
            time.sleep(rng.uniform(0.5, 1.0) * durations[0])
            p.send_signal(signal.SIGKILL)
            p.wait(60)
        refs = _referenced_all_exist(fio, job_root)
        # the next pass (the next checkpoint's retention / cleanup) collects every orphan
        CompletedCheckpointStore(fio, job_root, retain=1).cleanup_garbage(protect_from_id=9)
        shared = {fi.uri for fi in fio.list(JobLayout(job_root).shared())}
        assert shared == refs, f"orphans left: {sorted(shared - refs)[:3]}"
        _referenced_all_exist(fio, job_root)
