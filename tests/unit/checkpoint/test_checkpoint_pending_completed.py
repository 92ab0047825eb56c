"""PendingCheckpoint (acks, guarded transitions, _metadata written last) and CompletedCheckpoint."""
from __future__ import annotations

import pytest

from pipeline.checkpoint.ack import AckResult, TaskMetrics
from pipeline.checkpoint.completed import CompletedCheckpoint
from pipeline.checkpoint.failure import CheckpointFailureReason as R
from pipeline.checkpoint.handles import FileHandle, Position, StateHandle
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.checkpoint.pending import PendingCheckpoint, PendingManifest, PendingState
from pipeline.exceptions import CheckpointDeclinedError, CheckpointError, CheckpointFencedError, CorruptCheckpointError
from pipeline.fileio import LocalFileIO, join_uri, sha256_of

pytestmark = pytest.mark.unit


class RecordingFileIO(LocalFileIO):
    def __init__(self):
        super().__init__()
        self.writes: list[tuple[str, bool]] = []

    def write_bytes(self, uri, data, *, if_none_match=False):
        self.writes.append((uri.rsplit("/", 1)[-1], if_none_match))
        super().write_bytes(uri, data, if_none_match=if_none_match)


def put(fio, uri: str, data: bytes, rows: int = 1) -> FileHandle:
    fio.write_bytes(uri, data)
    return FileHandle(uri=uri, rows=rows, bytes=len(data), sha256=sha256_of(data))


def make_pending(fio, root: str, cid: int = 5, tasks=(("join", 0), ("join", 1)), sink_tables=("out",)):
    location = join_uri(root, "job", "checkpoints", f"chk-{cid}")
    manifest = PendingManifest(job="job", checkpoint_id=cid, parent_id=cid - 1, epoch=10,
                               barrier_time="2024-01-01T00:10:00.000Z", checkpoint_mode="exactly_once",
                               alignment="aligned", max_parallelism=8, parallelism=2, expected_tasks=tasks,
                               positions={"orders": {"0": Position(2, 0)}}, barriers={"orders": {"0": Position(2, 0)}},
                               sink_tables=sink_tables, plan={"segments": [[0, 1]]})
    p = PendingCheckpoint(manifest, location, fio)
    p.write_manifest()
    return p


def ack_all(fio, p: PendingCheckpoint) -> None:
    for uid, s in sorted(p.expected_tasks):
        h = put(fio, join_uri(p.location, "rounds", "0", f"{uid}-{s}.parquet"), f"state {uid} {s}".encode(), rows=s + 1)
        assert p.acknowledge_task(uid, s, [StateHandle(uid, s, s * 4, s * 4 + 3, "left", h)],
                                  metrics=TaskMetrics(sync_ms=s, async_ms=10 * s)) is AckResult.SUCCESS


def test_ack_results(local_root):
    fio = LocalFileIO()
    p = make_pending(fio, local_root)
    assert not p.is_fully_acknowledged
    assert p.acknowledge_task("join", 0) is AckResult.SUCCESS
    assert p.acknowledge_task("join", 0) is AckResult.DUPLICATE
    assert p.acknowledge_task("join", 7) is AckResult.UNKNOWN
    assert p.acknowledge_task("other", 0) is AckResult.UNKNOWN
    assert p.not_yet_acknowledged_tasks == {("join", 1)}
    assert p.acknowledge_task("join", 1) is AckResult.SUCCESS
    assert p.is_fully_acknowledged
    p.abort(R.CHECKPOINT_DECLINED)
    assert p.acknowledge_task("join", 1) is AckResult.DISCARDED


def test_finalize_writes_metadata_last_and_create_only(local_root):
    fio = RecordingFileIO()
    p = make_pending(fio, local_root)
    ack_all(fio, p)
    completed = p.finalize(backlog={"orders": 3}, rounds=2, sinks_full={"out": True})
    assert fio.writes[0] == ("_pending.json", True)
    assert fio.writes[-1] == ("_metadata", True)
    assert p.state is PendingState.COMPLETED
    md = CheckpointMetadata.from_json(fio.read_bytes(completed.metadata_uri))
    assert md == completed.metadata
    assert md.checkpoint_id == 5 and md.parent_id == 4 and md.epoch == 10
    assert [h.subtask for h in md.operators["join"]] == [0, 1]
    assert md.sinks["out"].files == () and md.sinks["out"].full is True
    assert md.stats.acks == 2 and md.stats.expected_acks == 2 and md.stats.rounds == 2
    assert md.stats.rows == 3 and md.stats.async_ms == 10.0 and md.stats.backlog == {"orders": 3}
    assert md.positions["orders"]["0"] == Position(2, 0)
    completed.verify(fio)


def test_finalize_needs_every_ack(local_root):
    fio = LocalFileIO()
    p = make_pending(fio, local_root)
    p.acknowledge_task("join", 0)
    with pytest.raises(CheckpointError, match=r"1 of 2 tasks have not acknowledged: join\[1\]"):
        p.finalize()
    assert not fio.exists(p.metadata_uri)
    assert p.state is PendingState.PENDING


def test_guarded_transitions(local_root):
    fio = LocalFileIO()
    p = make_pending(fio, local_root)
    assert p.abort(R.CHECKPOINT_EXPIRED) is True
    assert p.abort(R.CHECKPOINT_EXPIRED) is False  # already aborted: no-op
    assert p.failure_reason is R.CHECKPOINT_EXPIRED
    assert fio.list(p.location) == []  # its directory is deleted
    with pytest.raises(CheckpointDeclinedError, match="CHECKPOINT_EXPIRED") as err:
        p.finalize()
    assert err.value.reason is R.CHECKPOINT_EXPIRED

    q = make_pending(fio, local_root, cid=6)
    ack_all(fio, q)
    q.finalize()
    with pytest.raises(CheckpointError, match="already completed"):
        q.abort(R.CHECKPOINT_DECLINED)
    with pytest.raises(CheckpointError, match="already completed"):
        q.finalize()


def test_existing_metadata_means_fenced(local_root):
    fio = LocalFileIO()
    p = make_pending(fio, local_root)
    ack_all(fio, p)
    fio.write_bytes(p.metadata_uri, b"someone else's")
    with pytest.raises(CheckpointFencedError, match="chk-5/_metadata already exists"):
        p.finalize()
    assert fio.read_bytes(p.metadata_uri) == b"someone else's"


def test_manifest_is_write_ahead_and_reloadable(local_root):
    fio = LocalFileIO()
    p = make_pending(fio, local_root)
    with pytest.raises(CheckpointFencedError, match="_pending.json already exists"):
        p.write_manifest()
    again = PendingCheckpoint.load(fio, p.location)
    assert again.manifest == p.manifest
    assert again.acknowledged_tasks == frozenset()
    assert again.manifest.plan["segments"] == ((0, 1),)


def completed_checkpoint(fio, root):
    p = make_pending(fio, root)
    ack_all(fio, p)
    return p.finalize()


def test_verify_names_the_missing_file_and_the_checkpoint(local_root):
    fio = LocalFileIO()
    cp = completed_checkpoint(fio, local_root)
    victim = cp.metadata.operators["join"][1].file.uri
    fio.delete(victim)
    with pytest.raises(CorruptCheckpointError) as err:
        cp.verify(fio)
    msg = str(err.value)
    assert victim in msg and "is missing" in msg and "checkpoint 5 of job 'job'" in msg


def test_verify_detects_size_and_checksum_changes(local_root):
    fio = LocalFileIO()
    cp = completed_checkpoint(fio, local_root)
    f0 = cp.metadata.operators["join"][0].file
    fio.write_bytes(f0.uri, fio.read_bytes(f0.uri) + b"!")
    with pytest.raises(CorruptCheckpointError, match="bytes, expected"):
        cp.verify(fio)
    data = bytearray(fio.read_bytes(f0.uri)[:-1])
    data[0] ^= 0xFF  # same size, different content
    fio.write_bytes(f0.uri, bytes(data))
    with pytest.raises(CorruptCheckpointError, match="sha256"):
        cp.verify(fio)
    cp.verify(fio, checksums=False)  # size-only verification passes


def test_load_and_discard(local_root):
    fio = LocalFileIO()
    cp = completed_checkpoint(fio, local_root)
    loaded = CompletedCheckpoint.load(fio, cp.location)
    assert loaded == cp
    keep = cp.metadata.operators["join"][0].file.uri
    cp.discard(fio, keep={keep})
    assert [f.uri for f in fio.list(cp.location)] == [keep]
    savepoint = CompletedCheckpoint(
        CheckpointMetadata.from_dict({**cp.metadata.to_dict(), "kind": "savepoint"}), cp.location)
    with pytest.raises(CheckpointError, match="savepoints are owned by the user"):
        savepoint.discard(fio)
