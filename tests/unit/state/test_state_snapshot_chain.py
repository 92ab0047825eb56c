"""Incremental snapshots on real files: chains restore exactly what full snapshots restore, the materialisation
bound holds, warm state is served without storage, rescaled ranges read overlapping chains."""
from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pipeline.checkpoint.handles import StateHandle
from pipeline.exceptions import CorruptCheckpointError
from pipeline.fileio import LocalFileIO
from pipeline.state import backend
from pipeline.state.backend import read_state
from pipeline.state.chain import StateChain
from pipeline.state.snapshot import SnapshotOptions, write_state

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("key", pa.string()), ("n", pa.int64()), ("_kg", pa.int32())])


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "warm"
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(d))
    backend._RECENT.clear()
    yield d
    backend._RECENT.clear()


def _cold(cache_dir: Path) -> None:
    """Forget warm state (a restart / a task on another executor)."""
    backend._RECENT.clear()
    for p in cache_dir.glob("*.arrow"):
        p.unlink()


def _state(epoch: int, per_epoch: int = 200, kg_range=(0, 7)) -> pa.Table:
    """State after ``epoch``: grows by ``per_epoch`` keys per epoch, and the counts of 10 old keys change."""
    n = per_epoch * (epoch + 1)
    keys = [f"k{i:06d}" for i in range(n)]
    counts = [1 + (epoch if i % 97 == 0 else 0) for i in range(n)]
    lo, hi = kg_range
    kgs = [lo + i % (hi - lo + 1) for i in range(n)]
    return pa.table([pa.array(keys), pa.array(counts, pa.int64()), pa.array(kgs, pa.int32())], schema=SCHEMA)


def _opts(root: str, cid: int, **policy) -> dict:
    p = {"incremental": True, "max_deltas": 3, "max_delta_ratio": 10.0, **policy}
    return {"checkpoint_id": cid, "round": 0, "shared": f"{root}/job/shared/op", "materialize": False, **p}


def _run(root: str, epochs: int, **policy) -> list[StateHandle]:
    fio = LocalFileIO()
    handles: list[StateHandle] = []
    parent: list[StateHandle] = []
    for e in range(epochs):
        h = write_state(fio, f"{root}/job/checkpoints/chk-{e + 1}/rounds/0/state/op", "agg", 0, 7, _state(e),
                        parent, _opts(root, e + 1, **policy), f"chk-{e + 1}", uid="op")
        assert h.file is not None and (h.operator_uid, h.kg_start, h.kg_end, h.name) == ("op", 0, 7, "agg")
        handles.append(h)
        parent = [h]
    return handles


def test_chain_restore_equals_full_restore(tmp_path, cache_dir):
    root = tmp_path.as_uri()
    inc = _run(root + "/inc", 9)
    full = _run(root + "/full", 9, incremental=False)
    assert all(not h.deltas for h in full)
    assert any(h.deltas for h in inc), "no delta was ever written"
    fio = LocalFileIO()
    for e, (hi, hf) in enumerate(zip(inc, full)):
        _cold(cache_dir)
        a = read_state(fio, [hi], 0, 7, SCHEMA, f"chk-{e + 1}")
        _cold(cache_dir)
        b = read_state(fio, [hf], 0, 7, SCHEMA, f"chk-{e + 1}")
        assert a.equals(b) and a.num_rows == _state(e).num_rows


def test_materialisation_bound_and_persisted_bytes(tmp_path):
    handles = _run(tmp_path.as_uri(), 12, max_deltas=3)
    lengths = [len(h.deltas) for h in handles]
    assert max(lengths) == 3 and lengths[:5] == [0, 1, 2, 3, 0]  # a new base after 3 deltas
    for h in handles:
        chain = StateChain.of(h)
        assert chain is not None
        if chain.deltas:  # this checkpoint wrote one small delta, and references the rest
            assert h.persisted_bytes == chain.deltas[-1].bytes < chain.bytes
            assert chain.deltas[-1].rows <= 200 + 2 * 25  # the 200 new keys and the changed counts only
        else:
            assert h.persisted_bytes == chain.bytes
    # the byte bound: deltas may not exceed the ratio of the base
    small = _run(tmp_path.as_uri() + "/ratio", 8, max_deltas=100, max_delta_ratio=0.1)
    for h in small:
        chain = StateChain.of(h)
        assert chain is not None and chain.delta_bytes <= 0.1 * chain.base.bytes


def test_warm_state_is_served_without_storage_and_reloaded_verified_on_a_miss(tmp_path, cache_dir):
    root = tmp_path.as_uri()
    handles = _run(root, 3)
    chain = StateChain.of(handles[-1])
    assert chain is not None and chain.deltas
    fio = LocalFileIO()
    expected = read_state(fio, handles[-1:], 0, 7, SCHEMA, "chk-3")
    for f in chain.files:  # storage gone: the executor still has it warm (another worker: the IPC cache)
        Path(f.uri[len("file://"):]).rename(Path(f.uri[len("file://"):] + ".away"))
    backend._RECENT.clear()
    assert list(cache_dir.glob("*.arrow"))
    assert read_state(fio, handles[-1:], 0, 7, SCHEMA, "chk-3").equals(expected)
    _cold(cache_dir)
    with pytest.raises(CorruptCheckpointError, match="chk-3.*unreadable"):
        read_state(fio, handles[-1:], 0, 7, SCHEMA, "chk-3")
    for f in chain.files:
        Path(f.uri[len("file://"):] + ".away").rename(Path(f.uri[len("file://"):]))
    delta = Path(chain.deltas[-1].uri[len("file://"):])
    delta.write_bytes(delta.read_bytes()[:-1] + b"x")  # corrupt: detected by checksum on the reload
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        read_state(fio, handles[-1:], 0, 7, SCHEMA, "chk-3")


def test_rescale_reads_overlapping_chains_and_writes_a_new_base(tmp_path, cache_dir):
    root = tmp_path.as_uri()
    fio = LocalFileIO()
    halves = []
    for lo, hi in ((0, 3), (4, 7)):
        parent: list[StateHandle] = []
        for e in range(3):
            h = write_state(fio, f"{root}/s", "agg", lo, hi, _state(e, kg_range=(lo, hi)), parent,
                            _opts(root, e + 1), f"chk-{e + 1}")
            parent = [h]
        halves.append(parent[0])
    assert all(h.deltas for h in halves)
    _cold(cache_dir)
    got = read_state(fio, halves, 2, 5, SCHEMA, "chk-3")
    every = pa.concat_tables([_state(2, kg_range=(0, 3)), _state(2, kg_range=(4, 7))])
    want = every.filter(pc.and_(pc.greater_equal(every["_kg"], 2), pc.less_equal(every["_kg"], 5)))
    assert got.sort_by([("key", "ascending"), ("_kg", "ascending")]).equals(
        want.sort_by([("key", "ascending"), ("_kg", "ascending")]))
    # the new subtask's range [2, 5] matches no parent chain: a base, not a delta
    h = write_state(fio, f"{root}/s", "agg", 2, 5, got, halves, _opts(root, 4), "chk-4")
    assert h.file is not None and not h.deltas and "-base" in h.file.uri


def test_savepoint_and_restore_options_write_bases_only(tmp_path):
    root = tmp_path.as_uri()
    fio = LocalFileIO()
    parent = [_run(root, 2)[-1]]
    sp = SnapshotOptions(checkpoint_id=9, shared=None, materialize=True).to_params()
    h = write_state(fio, f"{root}/job/savepoints/sp-9-x/rounds/0/state/op", "agg", 0, 7, _state(2), parent, sp,
                    "sp-9")
    assert h.file is not None and not h.deltas and h.file.uri.startswith(f"{root}/job/savepoints/sp-9-x/")
    restore = {**_opts(root, 10), "materialize": True}
    h = write_state(fio, f"{root}/x", "agg", 0, 7, _state(2), parent, restore, "chk-10")
    assert h.file is not None and not h.deltas and "c000000000010-r0-base" in h.file.uri
    assert StateHandle.from_dict(json.loads(json.dumps(h.to_dict()))) == h  # the checkpoint's own codec
