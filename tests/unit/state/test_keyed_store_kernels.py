"""The kernels on keyed stores (PIPELINE_STATE_BACKEND=rocksdb) give what they give on the whole state: random
joins (every join type and uniqueness, with TTL expiry found through the TTL index) and dedups, round after
round; each round's snapshot (a delta or a base, written from the changed rows) restores to the heap state."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from pipeline.fileio import LocalFileIO
from pipeline.keygroups import KeyGroupRange
from pipeline.operators.dedup import dedup_step
from pipeline.operators.join import JoinType, Uniqueness, join_step, with_matched
from pipeline.runtime.keyed_stores import KeyedStores
from pipeline.state import backend
from pipeline.state.backend import read_state

pytestmark = pytest.mark.unit

TS = pa.timestamp("us", tz="UTC")
LEFT = pa.schema([("k", pa.string()), ("lv", pa.int64()), ("_ingest_ts", TS), ("_kg", pa.int32())])
RIGHT = pa.schema([("k", pa.string()), ("rv", pa.int64()), ("_ingest_ts", TS), ("_kg", pa.int32())])
OUT = pa.schema([("k", pa.string()), ("lv", pa.int64()), ("rv", pa.int64())])
KGR = KeyGroupRange(0, 7)


@pytest.fixture(autouse=True)
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_STORE_DIR", str(tmp_path / "stores"))
    monkeypatch.setenv("PIPELINE_STATE_CACHE_MAX_BYTES", "0")
    backend._RECENT.clear()


def _rows(rng, schema, val, n, t0):
    ks = [rng.randrange(12) for _ in range(n)]
    return pa.table({"k": [f"k{k}" for k in ks], val: [rng.randrange(5) for _ in range(n)],
                     "_ingest_ts": pa.array([t0 + rng.randrange(10) for _ in range(n)], TS),
                     "_kg": pa.array([k % 8 for k in ks], pa.int32())}, schema=schema)


def _sorted(t: pa.Table) -> list[tuple]:
    return sorted(tuple(str(v) for v in r.values()) for r in t.to_pylist())


def _snapshot(root: str, cid: int) -> dict:
    return {"checkpoint_id": cid, "round": 0, "shared": f"{root}/job/shared/op", "materialize": False,
            "incremental": True, "max_deltas": 3, "max_delta_ratio": 10.0, "backend": "rocksdb", "job_root": root}


def _restored(handle: dict | None, schema: pa.Schema, cid: int) -> list[tuple]:
    backend._RECENT.clear()
    if handle is None:
        return []
    return _sorted(read_state(LocalFileIO(), [{**handle, "kg_start": 0, "kg_end": 7}], 0, 7, schema, f"chk-{cid}"))


@pytest.mark.parametrize("seed", range(4))
def test_join_on_keyed_stores_equals_the_join_on_the_whole_state(tmp_path, seed):
    rng = random.Random(seed)
    how, unique = list(JoinType)[seed % 4], list(Uniqueness)[(seed + 1) % 4]  # every type, every uniqueness
    root = tmp_path.as_uri()
    ls, rs = LEFT.append(pa.field("_matched", pa.bool_())), RIGHT.append(pa.field("_matched", pa.bool_()))
    sl, sr = with_matched(LEFT.empty_table()), with_matched(RIGHT.empty_table())
    parent: dict[str, list] = {}
    for rnd in range(8):
        nl = _rows(rng, LEFT, "lv", rng.randrange(0, 7), rnd * 10)
        nr = _rows(rng, RIGHT, "rv", rng.randrange(0, 7), rnd * 10)
        cutoff_us = rnd * 10 - 15 if rng.random() < 0.7 else None
        cutoff = pa.scalar(cutoff_us, TS) if cutoff_us is not None else None
        heap = join_step(sl, sr, nl, nr, key="k", cutoff=cutoff, how=how, unique=unique, output_schema=OUT)
        stores = KeyedStores(snapshot=_snapshot(root, rnd + 1), uid="j", key="k", kgr=KGR,
                             states={"left": (ls, "_ingest_ts"), "right": (rs, "_ingest_ts")},
                             parent_handles=parent, fileio=LocalFileIO(), checkpoint=f"chk-{rnd}")
        try:
            keys = stores.touched([nl, nr], cutoff_us)
            held = {"left": stores.get("left", keys), "right": stores.get("right", keys)}
            res = join_step(held["left"], held["right"], nl, nr, key="k", cutoff=cutoff, how=how, unique=unique,
                            output_schema=OUT)
            assert _sorted(res.output) == _sorted(heap.output), (seed, rnd)
            handles = {}
            for name, new in (("left", res.left), ("right", res.right)):
                handles[name] = stores.commit(name, keys, held[name], new, cutoff_us=cutoff_us,
                                              state_prefix=f"{root}/job/chk-{rnd + 1}", snapshot=_snapshot(root, rnd + 1))
            scanned = {n: _sorted(pa.Table.from_batches(list(stores.stores[n].scan()), schema=s))
                       for n, s in (("left", ls), ("right", rs))}
        finally:
            stores.close()
        for name, schema, want in (("left", ls, heap.left), ("right", rs, heap.right)):
            assert scanned[name] == _sorted(want.select(schema.names)), (seed, rnd, name)
            assert _restored(handles[name], schema, rnd + 1) == _sorted(want.select(schema.names)), (seed, rnd)
        parent = {n: [{**h, "kg_start": 0, "kg_end": 7}] if h else [] for n, h in handles.items()}
        sl, sr = heap.left, heap.right


@pytest.mark.parametrize("seed", range(2))
def test_dedup_on_a_keyed_store_equals_the_dedup_on_the_whole_state(tmp_path, seed):
    rng = random.Random(seed)
    root = tmp_path.as_uri()
    sschema = pa.schema([("k", pa.string()), ("_ingest_ts", TS), ("_kg", pa.int32())])
    state = sschema.empty_table()
    parent: dict[str, list] = {}
    for rnd in range(8):
        new = _rows(rng, LEFT, "lv", rng.randrange(0, 9), rnd * 10)
        cutoff_us = rnd * 10 - 15 if rng.random() < 0.7 else None
        cutoff = pa.scalar(cutoff_us, TS) if cutoff_us is not None else None
        heap = dedup_step(state, new, key="k", cutoff=cutoff, state_columns=sschema.names)
        stores = KeyedStores(snapshot=_snapshot(root, rnd + 1), uid="d", key="k", kgr=KGR,
                             states={"keys": (sschema, "_ingest_ts")}, parent_handles=parent, fileio=LocalFileIO(),
                             checkpoint=f"chk-{rnd}")
        try:
            keys = stores.touched([new], cutoff_us)
            held = stores.get("keys", keys)
            res = dedup_step(held, new, key="k", cutoff=cutoff, state_columns=sschema.names)
            assert _sorted(res.output) == _sorted(heap.output) and res.dropped == heap.dropped, (seed, rnd)
            h = stores.commit("keys", keys, held, res.state, cutoff_us=cutoff_us,
                              state_prefix=f"{root}/job/chk-{rnd + 1}", snapshot=_snapshot(root, rnd + 1))
        finally:
            stores.close()
        assert _restored(h, sschema, rnd + 1) == _sorted(heap.state.select(sschema.names)), (seed, rnd)
        parent = {"keys": [{**h, "kg_start": 0, "kg_end": 7}] if h else []}
        state = heap.state.select(sschema.names)
