"""CompletedCheckpointStore: fallback restore, retention/subsumption, garbage cleanup."""
from __future__ import annotations

import pytest

from pipeline.checkpoint.completed import CompletedCheckpoint
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.checkpoint.store import CheckpointDirStatus, CompletedCheckpointStore
from pipeline.exceptions import CheckpointError, CorruptCheckpointError, NoValidCheckpointError, ObjectNotFoundError
from pipeline.fileio import LocalFileIO, join_uri, sha256_of

pytestmark = pytest.mark.unit


def put(fio, uri, data: bytes) -> FileHandle:
    fio.write_bytes(uri, data)
    return FileHandle(uri, 1, len(data), sha256_of(data))


def write_checkpoint(fio, job_root: str, cid: int, *, extra_files=(), kind="checkpoint", location=None):
    location = location or join_uri(job_root, "checkpoints", f"chk-{cid}")
    own = put(fio, join_uri(location, "rounds", "0", "agg-0.parquet"), f"state of {cid}".encode())
    handles = [StateHandle("agg", 0, 0, 7, "agg", own)]
    handles += [StateHandle("agg", 0, 0, 7, f"shared{i}", f) for i, f in enumerate(extra_files)]
    md = CheckpointMetadata(job="job", checkpoint_id=cid, parent_id=cid - 1 if cid > 1 else None, kind=kind,
                            epoch=cid, barrier_time="t", checkpoint_mode="exactly_once", alignment="aligned",
                            max_parallelism=8, parallelism=1, operators={"agg": tuple(handles)})
    fio.write_bytes(join_uri(location, "_metadata"), md.to_bytes(), if_none_match=True)
    return CompletedCheckpoint(md, location)


@pytest.fixture
def env(local_root):
    fio = LocalFileIO()
    job_root = join_uri(local_root, "job")
    return fio, job_root, CompletedCheckpointStore(fio, job_root, retain=3)


def test_empty_store_is_a_legitimate_fresh_start(env):
    _fio, _root, store = env
    assert store.list() == [] and store.latest() is None
    assert store.latest_valid() == (None, [])


def test_list_and_inspect(env):
    fio, root, store = env
    for cid in (1, 2, 10):
        write_checkpoint(fio, root, cid)
    fio.write_bytes(join_uri(store.location_of(11), "_pending.json"), b"{}")  # in progress / crashed
    fio.write_bytes(join_uri(store.location_of(12), "_metadata"), b"garbage")  # unreadable
    assert store.ids() == [1, 2, 10]
    statuses = {i.checkpoint_id: i.status for i in store.inspect()}
    assert statuses == {1: CheckpointDirStatus.COMPLETED, 2: CheckpointDirStatus.COMPLETED,
                        10: CheckpointDirStatus.COMPLETED, 11: CheckpointDirStatus.PENDING,
                        12: CheckpointDirStatus.CORRUPT}
    assert store.latest().checkpoint_id == 10
    assert store.get(2).checkpoint_id == 2
    with pytest.raises(ObjectNotFoundError, match="checkpoint 11 of job 'job' is not completed"):
        store.get(11)
    with pytest.raises(CorruptCheckpointError, match="checkpoint 12"):
        store.get(12)


def test_latest_valid_falls_back_with_clear_messages(env):
    fio, root, store = env
    write_checkpoint(fio, root, 1)
    write_checkpoint(fio, root, 2)
    cp3 = write_checkpoint(fio, root, 3)
    fio.write_bytes(join_uri(store.location_of(4), "_metadata"), b"{\"format\": 2}")
    missing = cp3.metadata.operators["agg"][0].file.uri
    fio.delete(missing)
    cp, problems = store.latest_valid()
    assert cp.checkpoint_id == 2
    assert len(problems) == 2
    assert "checkpoint 4" in problems[0] and "format 2" in problems[0]
    assert "checkpoint 3" in problems[1] and missing in problems[1] and "missing" in problems[1]
    # without verification the newest parseable one is taken
    cp, problems = store.latest_valid(verify=False)
    assert cp.checkpoint_id == 3 and len(problems) == 1


def test_no_valid_checkpoint_never_starts_from_scratch(env):
    fio, root, store = env
    cp = write_checkpoint(fio, root, 1)
    fio.delete(cp.metadata.operators["agg"][0].file.uri)
    with pytest.raises(NoValidCheckpointError) as err:
        store.latest_valid()
    assert "job 'job'" in str(err.value) and "refusing to start from scratch" in str(err.value)


def test_checkpoint_in_wrong_directory_is_not_trusted(env):
    fio, root, store = env
    write_checkpoint(fio, root, 1)
    write_checkpoint(fio, root, 3, location=store.location_of(2))
    infos = {i.checkpoint_id: i for i in store.inspect()}
    assert infos[2].status is CheckpointDirStatus.CORRUPT and "holds checkpoint id 3" in infos[2].problem
    cp, problems = store.latest_valid()
    assert cp.checkpoint_id == 1 and "holds checkpoint id 3" in problems[0]


def test_retention_keeps_newest_and_protects_referenced_files(env):
    fio, root, store = env
    cps = [write_checkpoint(fio, root, 1)]
    shared = cps[0].metadata.operators["agg"][0].file  # chk-1's file, referenced by chk-4 (incremental)
    for cid in (2, 3):
        cps.append(write_checkpoint(fio, root, cid))
    sp = write_checkpoint(fio, root, 2, kind="savepoint", location=join_uri(root, "savepoints", "sp-2-x"),
                          extra_files=[cps[1].metadata.operators["agg"][0].file])
    for cid in (1, 2, 3):
        assert store.add(cps[cid - 1]) == []
    for name in ("chk-1", "chk-3", "sp-2"):  # data-quality results of checkpoints and of the savepoint
        fio.write_bytes(join_uri(root, "validation", name, "summary.json"), b"{}")
    cp4 = write_checkpoint(fio, root, 4, extra_files=[shared])
    assert store.add(cp4) == [1]
    assert not fio.exists(join_uri(root, "validation", "chk-1", "summary.json"))  # went with chk-1
    assert fio.exists(join_uri(root, "validation", "chk-3", "summary.json"))
    assert fio.exists(join_uri(root, "validation", "sp-2", "summary.json"))
    cp5 = write_checkpoint(fio, root, 5)
    assert store.add(cp5) == [2]
    assert store.ids() == [3, 4, 5]
    assert fio.exists(shared.uri)  # still referenced by retained chk-4
    assert fio.exists(cps[1].metadata.operators["agg"][0].file.uri)  # referenced by a savepoint
    assert not fio.exists(join_uri(store.location_of(1), "_metadata"))
    assert fio.exists(sp.metadata_uri)  # savepoints are never touched
    cp4.verify(fio)
    with pytest.raises(CheckpointError, match="savepoints are not kept"):
        store.add(sp)


def test_cleanup_garbage(env):
    fio, root, store = env
    write_checkpoint(fio, root, 1)
    for cid in (2, 3, 5, 6):
        fio.write_bytes(join_uri(store.location_of(cid), "rounds", "0", "x.parquet"), b"partial")
    fio.write_bytes(join_uri(store.location_of(4), "_metadata"), b"unreadable")
    sp = write_checkpoint(fio, root, 9, kind="savepoint", location=join_uri(root, "savepoints", "sp-9"))
    deleted = store.cleanup_garbage(keep={3}, protect_from_id=6)
    assert deleted == [2, 5]
    remaining = {i.checkpoint_id: i.status for i in store.inspect()}
    assert remaining == {1: CheckpointDirStatus.COMPLETED, 3: CheckpointDirStatus.PENDING,
                         4: CheckpointDirStatus.CORRUPT, 6: CheckpointDirStatus.PENDING}
    assert fio.exists(sp.metadata_uri)
    assert store.cleanup_garbage() == [3, 6]
