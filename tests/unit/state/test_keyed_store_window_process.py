"""The window and ``process`` kernels on keyed stores (PIPELINE_STATE_BACKEND=rocksdb) give what they give on the
whole state, round after round: the window's records are filed in the store's index under their next firing time
(tumbling and sliding windows, allowed lateness, final and update emission, rounds that do not complete their
epoch), so the keys whose windows fire are a range scan; the process operator's state expires by its TTL through
the same index. Each round's snapshot (a delta, or a merged base) restores to the heap state."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from pipeline.checkpoint.handles import StateHandle
from pipeline.fileio import LocalFileIO
from pipeline.operators.process import TOUCHED, process_step
from pipeline.runtime.operators.keyed_stores import KeyedStores
from pipeline.runtime.operators.state_access import StateScope, StateSpec
from pipeline.state import backend
from pipeline.state.backend import read_state
from pipeline.state.keyed_store import row_keys
from pipeline.windows.aggregate import EVENT_US, window_step
from pipeline.windows.assign import next_fire_us
from tests.unit.state.window_rounds import KGR, SEC, count_fn, sorted_rows, window_rounds, window_spec

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_STORE_DIR", str(tmp_path / "stores"))
    monkeypatch.setenv("PIPELINE_STATE_CACHE_MAX_BYTES", "0")
    backend._RECENT.clear()


def _snapshot(root: str, cid: int) -> dict:
    return {"checkpoint_id": cid, "round": 0, "shared": f"{root}/job/shared/op", "materialize": False,
            "incremental": True, "max_deltas": 2, "max_delta_ratio": 10.0, "backend": "rocksdb", "job_root": root}


def _restored(handle: StateHandle, schema: pa.Schema, cid: int) -> list[tuple]:
    backend._RECENT.clear()
    return sorted_rows(read_state(LocalFileIO(), [handle], 0, 7, schema, f"chk-{cid}"))


def test_next_fire_is_the_first_window_end_plus_lateness_above_the_watermark():
    S, D, L = 60, 20, 5  # windows of 60 every 20: t=45 is in [0,60), [20,80), [40,100)
    assert [next_fire_us(45, S, D, L, w) for w in (None, 0, 64, 65, 84, 85, 104)] == [65, 65, 65, 85, 85, 105, 105]
    assert next_fire_us(45, 60, 60, 0, None) == 60  # tumbling: its one window's end


@pytest.mark.parametrize("size,slide,late,emit,seed", [(60, 60, 0, "final", 0), (60, 20, 15, "final", 1),
                                                      (40, 20, 0, "update", 2), (30, 30, 30, "update", 3)])
def test_window_on_a_keyed_store_equals_the_window_on_the_whole_state(tmp_path, size, slide, late, emit, seed):
    root = tmp_path.as_uri()
    w, sschema = window_spec(size, slide, late, emit)
    heap = sschema.empty_table()
    parent: dict[str, list[StateHandle]] = {}
    emitted = fired_by_index = 0
    for r in window_rounds(seed, 12, 9):
        rnd, rows, kw, cutoff = r.rnd, r.rows, r.step_kwargs(), r.cutoff
        want = window_step(w, heap, rows, **kw)  # type: ignore[arg-type]
        stores = KeyedStores(StateScope("w", 0, KGR, "k", f"chk-{rnd}", f"{root}/job/chk-{rnd + 1}",
                                        {"win": StateSpec(sschema, EVENT_US, r.read_index(w, sschema))}, parent,
                                        _snapshot(root, rnd + 1), cutoff), LocalFileIO())
        try:
            keys = stores.touched([rows], cutoff)
            fired_by_index += len(set(keys) - set(row_keys(rows, "k", "_kg"))) > 0
            held = stores.get("win", keys)
            got = window_step(w, held, rows, **kw)  # type: ignore[arg-type]
            emitted += got.output.num_rows
            assert sorted_rows(got.output) == sorted_rows(want.output), (rnd, "output")
            assert sorted_rows(got.late) == sorted_rows(want.late), (rnd, "late")
            stores.stores["win"].index_time = r.write_index(w, sschema)
            h = stores.commit("win", keys, held, got.state, cutoff_us=cutoff, state_prefix=f"{root}/job/chk-{rnd + 1}",
                              snapshot=_snapshot(root, rnd + 1))
            scanned = sorted_rows(pa.Table.from_batches(list(stores.stores["win"].scan()), schema=sschema))
        finally:
            stores.close()
        heap = want.state.select(sschema.names)
        assert scanned == sorted_rows(heap), (rnd, "store")
        assert _restored(h, sschema, rnd + 1) == sorted_rows(heap), (rnd, "snapshot")
        parent = {"win": [h]}
    assert emitted and fired_by_index, (emitted, fired_by_index)  # windows fired, keys found through the index


@pytest.mark.parametrize("seed", range(2))
def test_process_on_a_keyed_store_equals_process_on_the_whole_state(tmp_path, seed):
    rng = random.Random(seed)
    root = tmp_path.as_uri()
    st_schema = pa.schema([("k", pa.string()), ("c", pa.int64())])
    sschema = st_schema.append(pa.field(TOUCHED, pa.int64())).append(pa.field("_kg", pa.int32()))
    heap = sschema.empty_table()
    parent: dict[str, list[StateHandle]] = {}
    ttl = 30 * SEC
    for rnd in range(8):
        n = rng.randrange(0, 10)
        ks = [rng.randrange(12) for _ in range(n)]
        rows = pa.table({"k": [f"k{k}" for k in ks], "_kg": pa.array([k % 8 for k in ks], pa.int32())})
        barrier = (rnd + 1) * 10 * SEC
        kgs = rows.group_by("k").aggregate([("_kg", "min")]).rename_columns(["k", "_kg"])

        def carry(t: pa.Table, kgs: pa.Table = kgs) -> pa.Table:
            return t.join(kgs, keys="k", join_type="inner").select(sschema.names)
        want = process_step("p", "k", count_fn, st_schema, st_schema, heap, rows.select(["k"]), barrier_us=barrier,
                            ttl_us=ttl, carry=carry)
        stores = KeyedStores(StateScope("p", 0, KGR, "k", f"chk-{rnd}", f"{root}/job/chk-{rnd + 1}",
                                        {"proc": StateSpec(sschema, TOUCHED)}, parent, _snapshot(root, rnd + 1),
                                        barrier - ttl), LocalFileIO())
        try:
            keys = stores.touched([rows], barrier - ttl)
            held = stores.get("proc", keys)
            got = process_step("p", "k", count_fn, st_schema, st_schema, held, rows.select(["k"]), barrier_us=barrier,
                               ttl_us=ttl, carry=carry)
            assert sorted_rows(got.output) == sorted_rows(want.output) and got.expired == want.expired, rnd
            h = stores.commit("proc", keys, held, got.state.select(sschema.names).cast(sschema),
                              cutoff_us=barrier - ttl, state_prefix=f"{root}/job/chk-{rnd + 1}",
                              snapshot=_snapshot(root, rnd + 1))
        finally:
            stores.close()
        heap = want.state.select(sschema.names).cast(sschema)
        assert _restored(h, sschema, rnd + 1) == sorted_rows(heap), rnd
        parent = {"proc": [h]}
