"""The kernels through the state-access port give what they give on the whole state, on both backends (one suite
parametrised over heap and rocksdb, as a port's contract): random joins (every join type and uniqueness, with TTL
expiry found through the TTL index on rocksdb) and dedups, round after round; each round's snapshot (a delta or a
base, written from the changed rows) restores to the whole-state result."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from pipeline.checkpoint.handles import StateHandle
from pipeline.fileio import LocalFileIO
from pipeline.keygroups import KeyGroupRange
from pipeline.operators.dedup import dedup_step
from pipeline.operators.join import JoinType, Uniqueness, join_step, with_matched
from pipeline.runtime.operators.keyed_stores import KeyedStores
from pipeline.runtime.operators.state_access import StateScope, StateSpec, open_state
from pipeline.runtime.operators.task import HANDLE_DDL  # noqa: F401  (registers the backends, as a task does)
from pipeline.state import backend
from pipeline.state.backend import read_state
from pipeline.state.changelog import TouchedKeys

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


def _snapshot(root: str, cid: int, backend: str = "rocksdb") -> dict:
    return {"checkpoint_id": cid, "round": 0, "shared": f"{root}/job/shared/op", "materialize": False,
            "incremental": True, "max_deltas": 3, "max_delta_ratio": 10.0, "backend": backend, "job_root": root}


BACKENDS = pytest.mark.parametrize("backend_name", ["heap", "rocksdb"])


def _restored(handle: StateHandle, schema: pa.Schema, cid: int) -> list[tuple]:
    backend._RECENT.clear()
    return _sorted(read_state(LocalFileIO(), [handle], 0, 7, schema, f"chk-{cid}"))


@BACKENDS
@pytest.mark.parametrize("seed", range(4))
def test_join_through_the_port_equals_the_join_on_the_whole_state(tmp_path, seed, backend_name):
    rng = random.Random(seed)
    how, unique = list(JoinType)[seed % 4], list(Uniqueness)[(seed + 1) % 4]  # every type, every uniqueness
    root = tmp_path.as_uri()
    ls, rs = LEFT.append(pa.field("_matched", pa.bool_())), RIGHT.append(pa.field("_matched", pa.bool_()))
    sl, sr = with_matched(LEFT.empty_table()), with_matched(RIGHT.empty_table())
    parent: dict[str, list[StateHandle]] = {}
    for rnd in range(8):
        nl = _rows(rng, LEFT, "lv", rng.randrange(0, 7), rnd * 10)
        nr = _rows(rng, RIGHT, "rv", rng.randrange(0, 7), rnd * 10)
        cutoff_us = rnd * 10 - 15 if rng.random() < 0.7 else None
        cutoff = pa.scalar(cutoff_us, TS) if cutoff_us is not None else None
        heap = join_step(sl, sr, nl, nr, key="k", cutoff=cutoff, how=how, unique=unique, output_schema=OUT)
        scope = StateScope("j", 0, KGR, "k", f"chk-{rnd}", f"{root}/job/chk-{rnd + 1}",
                           {"left": StateSpec(ls, "_ingest_ts"), "right": StateSpec(rs, "_ingest_ts")}, parent,
                           _snapshot(root, rnd + 1, backend_name), cutoff_us)
        with open_state(scope, LocalFileIO()) as access:
            held = access.read([nl, nr])
            res = join_step(held["left"], held["right"], nl, nr, key="k", cutoff=cutoff, how=how, unique=unique,
                            output_schema=OUT)
            assert _sorted(res.output) == _sorted(heap.output), (seed, rnd)
            handles = {name: access.write(name, new, TouchedKeys("k", res.touched))
                       for name, new in (("left", res.left), ("right", res.right))}
            scanned = ({n: _sorted(pa.Table.from_batches(list(access.stores[n].scan()), schema=s))
                        for n, s in (("left", ls), ("right", rs))} if isinstance(access, KeyedStores) else None)
        for name, schema, want in (("left", ls, heap.left), ("right", rs, heap.right)):
            assert scanned is None or scanned[name] == _sorted(want.select(schema.names)), (seed, rnd, name)
            assert _restored(handles[name], schema, rnd + 1) == _sorted(want.select(schema.names)), (seed, rnd)
            assert (handles[name].operator_uid, handles[name].name, handles[name].kg_end) == ("j", name, 7)
        parent = {n: [h] for n, h in handles.items()}
        sl, sr = heap.left, heap.right


@BACKENDS
@pytest.mark.parametrize("seed", range(2))
def test_dedup_through_the_port_equals_the_dedup_on_the_whole_state(tmp_path, seed, backend_name):
    rng = random.Random(seed)
    root = tmp_path.as_uri()
    sschema = pa.schema([("k", pa.string()), ("_ingest_ts", TS), ("_kg", pa.int32())])
    state = sschema.empty_table()
    parent: dict[str, list[StateHandle]] = {}
    for rnd in range(8):
        new = _rows(rng, LEFT, "lv", rng.randrange(0, 9), rnd * 10)
        cutoff_us = rnd * 10 - 15 if rng.random() < 0.7 else None
        cutoff = pa.scalar(cutoff_us, TS) if cutoff_us is not None else None
        heap = dedup_step(state, new, key="k", cutoff=cutoff, state_columns=sschema.names)
        scope = StateScope("d", 0, KGR, "k", f"chk-{rnd}", f"{root}/job/chk-{rnd + 1}",
                           {"keys": StateSpec(sschema, "_ingest_ts")}, parent, _snapshot(root, rnd + 1, backend_name),
                           cutoff_us)
        with open_state(scope, LocalFileIO()) as access:
            held = access.read([new])["keys"]
            res = dedup_step(held, new, key="k", cutoff=cutoff, state_columns=sschema.names)
            assert _sorted(res.output) == _sorted(heap.output) and res.dropped == heap.dropped, (seed, rnd)
            touched = (new["k"],) + ((res.expired_keys,) if res.expired_keys is not None else ())
            h = access.write("keys", res.state, TouchedKeys("k", touched))
        assert _restored(h, sschema, rnd + 1) == _sorted(heap.state.select(sschema.names)), (seed, rnd)
        parent = {"keys": [h]}
        state = heap.state.select(sschema.names)


def test_the_port_is_guarded_and_an_unknown_backend_is_named(tmp_path):
    sschema = pa.schema([("k", pa.string()), ("_ingest_ts", TS), ("_kg", pa.int32())])
    scope = StateScope("d", 0, KGR, "k", "chk-1", f"{tmp_path.as_uri()}/s", {"keys": StateSpec(sschema)},
                       snapshot=_snapshot(tmp_path.as_uri(), 1, "heap"))
    with open_state(scope, LocalFileIO()) as access:
        with pytest.raises(RuntimeError, match=r"d\[0\] \(chk-1\): write of 'keys' while open"):
            access.write("keys", sschema.empty_table())
        access.read([])
        access.write("keys", sschema.empty_table())
        with pytest.raises(RuntimeError, match="twice"):
            access.write("keys", sschema.empty_table())
    from pipeline.exceptions import ConfigError
    bad = StateScope("d", 0, KGR, "k", "chk-1", "x", {"keys": StateSpec(sschema)}, snapshot={"backend": "lsm"})
    with pytest.raises(ConfigError, match="chk-1.*unknown state backend 'lsm'"):
        open_state(bad, LocalFileIO())
