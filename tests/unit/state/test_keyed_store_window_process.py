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
from pipeline.keygroups import KeyGroupRange
from pipeline.operators.process import TOUCHED, process_step
from pipeline.runtime.operators.keyed_stores import KeyedStores
from pipeline.runtime.operators.state_access import StateScope, StateSpec
from pipeline.state import backend
from pipeline.state.backend import read_state
from pipeline.state.keyed_store import row_keys
from pipeline.windows.aggregate import EPOCH, EVENT_US, EmitMode, WindowSpec, state_schema, window_step
from pipeline.windows.assign import PENDING_US, next_fire_us, window_index

pytestmark = pytest.mark.unit

TS = pa.timestamp("us", tz="UTC")
IN = pa.schema([("k", pa.string()), ("et", TS), ("v", pa.int64()), ("_kg", pa.int32())])
KGR = KeyGroupRange(0, 7)
SEC = 1_000_000


@pytest.fixture(autouse=True)
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_STORE_DIR", str(tmp_path / "stores"))
    monkeypatch.setenv("PIPELINE_STATE_CACHE_MAX_BYTES", "0")
    backend._RECENT.clear()


def _snapshot(root: str, cid: int) -> dict:
    return {"checkpoint_id": cid, "round": 0, "shared": f"{root}/job/shared/op", "materialize": False,
            "incremental": True, "max_deltas": 2, "max_delta_ratio": 10.0, "backend": "rocksdb", "job_root": root}


def _sorted(t: pa.Table) -> list[tuple]:
    return sorted(tuple(str(v) for v in r.values()) for r in t.to_pylist())


def _restored(handle: StateHandle, schema: pa.Schema, cid: int) -> list[tuple]:
    backend._RECENT.clear()
    return _sorted(read_state(LocalFileIO(), [handle], 0, 7, schema, f"chk-{cid}"))


def test_next_fire_is_the_first_window_end_plus_lateness_above_the_watermark():
    S, D, L = 60, 20, 5  # windows of 60 every 20: t=45 is in [0,60), [20,80), [40,100)
    assert [next_fire_us(45, S, D, L, w) for w in (None, 0, 64, 65, 84, 85, 104)] == [65, 65, 65, 85, 85, 105, 105]
    assert next_fire_us(45, 60, 60, 0, None) == 60  # tumbling: its one window's end


@pytest.mark.parametrize("size,slide,late,emit,seed", [(60, 60, 0, "final", 0), (60, 20, 15, "final", 1),
                                                      (40, 20, 0, "update", 2), (30, 30, 30, "update", 3)])
def test_window_on_a_keyed_store_equals_the_window_on_the_whole_state(tmp_path, size, slide, late, emit, seed):
    rng = random.Random(seed)
    root = tmp_path.as_uri()
    w = WindowSpec("k", "et", size * SEC, slide * SEC, 0, late * SEC,
                   (("n", "count", None), ("s", "sum", "v"), ("mx", "max", "v")), EmitMode(emit))
    sschema = state_schema(w, IN).append(pa.field("_kg", pa.int32()))
    heap = sschema.empty_table()
    parent: dict[str, list[StateHandle]] = {}
    wm: int | None = None
    emitted = fired_by_index = 0
    epoch = 0  # an epoch may take several rounds (a checkpoint spanning rounds): only its last one completes it
    ev, ep = sschema.names.index(EVENT_US), sschema.names.index(EPOCH)
    for rnd in range(12):
        n = rng.randrange(0, 12)
        ks = [rng.randrange(9) for _ in range(n)]
        et = [max(0, epoch * 25 + rng.randrange(-40, 30)) * SEC for _ in range(n)]  # some late
        rows = pa.table({"k": [f"k{k}" for k in ks], "et": pa.array(et, pa.int64()).cast(TS),
                         "v": [rng.randrange(100) for _ in range(n)], "_kg": pa.array([k % 8 for k in ks], pa.int32())},
                        schema=IN)
        complete = rng.random() < 0.6
        fire = max(wm or 0, (epoch * 25 - 10) * SEC) if complete and epoch else None
        kw = dict(epoch=epoch, late_watermark_us=wm, fire_watermark_us=fire, complete=complete, input_schema=IN,
                  carry=("_kg",))
        want = window_step(w, heap, rows, **kw)  # type: ignore[arg-type]
        cutoff = (fire + 1 if fire is not None else PENDING_US + 1) if complete else None  # as the window task
        index = window_index(w.size_us, w.slide_us, w.lateness_us, wm, event_i=ev, epoch_i=ep, pending_epoch=epoch)
        stores = KeyedStores(StateScope("w", 0, KGR, "k", f"chk-{rnd}", f"{root}/job/chk-{rnd + 1}",
                                        {"win": StateSpec(sschema, EVENT_US, index)}, parent,
                                        _snapshot(root, rnd + 1), cutoff), LocalFileIO())
        try:
            keys = stores.touched([rows], cutoff)
            fired_by_index += len(set(keys) - set(row_keys(rows, "k", "_kg"))) > 0
            held = stores.get("win", keys)
            got = window_step(w, held, rows, **kw)  # type: ignore[arg-type]
            emitted += got.output.num_rows
            assert _sorted(got.output) == _sorted(want.output), (rnd, "output")
            assert _sorted(got.late) == _sorted(want.late), (rnd, "late")
            stores.stores["win"].index_time = window_index(
                w.size_us, w.slide_us, w.lateness_us, fire if fire is not None else wm, event_i=ev, epoch_i=ep,
                pending_epoch=None if complete else epoch)
            h = stores.commit("win", keys, held, got.state, cutoff_us=cutoff, state_prefix=f"{root}/job/chk-{rnd + 1}",
                              snapshot=_snapshot(root, rnd + 1))
            scanned = _sorted(pa.Table.from_batches(list(stores.stores["win"].scan()), schema=sschema))
        finally:
            stores.close()
        heap = want.state.select(sschema.names)
        assert scanned == _sorted(heap), (rnd, "store")
        assert _restored(h, sschema, rnd + 1) == _sorted(heap), (rnd, "snapshot")
        parent = {"win": [h]}
        wm = fire if fire is not None else wm
        epoch += 1 if complete else 0
    assert emitted and fired_by_index, (emitted, fired_by_index)  # windows fired, keys found through the index


def _count_fn(rows: pa.Table, state: pa.Table):
    """A running count per key (state ``k``, ``c``) emitting the new counts."""
    have = dict(zip(state["k"].to_pylist(), state["c"].to_pylist()))
    for k in rows["k"].to_pylist():
        have[k] = have.get(k, 0) + 1
    keys = sorted(set(rows["k"].to_pylist()))
    new = pa.table({"k": keys, "c": pa.array([have[k] for k in keys], pa.int64())})
    return new, new


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
        want = process_step("p", "k", _count_fn, st_schema, st_schema, heap, rows.select(["k"]), barrier_us=barrier,
                            ttl_us=ttl, carry=carry)
        stores = KeyedStores(StateScope("p", 0, KGR, "k", f"chk-{rnd}", f"{root}/job/chk-{rnd + 1}",
                                        {"proc": StateSpec(sschema, TOUCHED)}, parent, _snapshot(root, rnd + 1),
                                        barrier - ttl), LocalFileIO())
        try:
            keys = stores.touched([rows], barrier - ttl)
            held = stores.get("proc", keys)
            got = process_step("p", "k", _count_fn, st_schema, st_schema, held, rows.select(["k"]), barrier_us=barrier,
                               ttl_us=ttl, carry=carry)
            assert _sorted(got.output) == _sorted(want.output) and got.expired == want.expired, rnd
            h = stores.commit("proc", keys, held, got.state.select(sschema.names).cast(sschema),
                              cutoff_us=barrier - ttl, state_prefix=f"{root}/job/chk-{rnd + 1}",
                              snapshot=_snapshot(root, rnd + 1))
        finally:
            stores.close()
        heap = want.state.select(sschema.names).cast(sschema)
        assert _restored(h, sschema, rnd + 1) == _sorted(heap), rnd
        parent = {"proc": [h]}
