"""The heap backend runs the kernels on the round's touched keys only (the keys of the input rows and those with
rows due below the cutoff), found by vectorised filters over the held table and, for a window, through the key
index kept warm beside the state: round after round the output and each snapshot equal the kernel on the whole
state, the kernel is handed only the touched keys' rows once the index is warm, a window fires for keys without
input through the index, and without the index (a cold executor) a round reads the whole range and is still exact."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from pipeline.checkpoint.handles import StateHandle
from pipeline.fileio import LocalFileIO
from pipeline.operators.process import TOUCHED, process_step
from pipeline.runtime.operators import heap_state
from pipeline.runtime.operators.heap_state import HeapState
from pipeline.runtime.operators.state_access import StateScope, StateSpec
from pipeline.state import backend
from pipeline.state.backend import read_state
from pipeline.windows.aggregate import EVENT_US, window_step
from tests.unit.state.window_rounds import KGR, SEC, count_fn, sorted_rows, window_rounds, window_spec

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE_STATE_CACHE_DIR", str(tmp_path / "cache"))
    backend._RECENT.clear()


@pytest.fixture
def narrow(monkeypatch):
    """Rounds narrow to their touched keys even on these small states (a round is wide only with more input rows
    than 20x the held rows)."""
    monkeypatch.setattr(heap_state, "WIDE", 0.05)


def _snapshot(root: str, cid: int) -> dict:
    return {"checkpoint_id": cid, "round": 0, "shared": f"{root}/job/shared/op", "materialize": False,
            "incremental": True, "max_deltas": 3, "max_delta_ratio": 10.0, "backend": "heap", "job_root": root}


def _restored(handle: StateHandle, schema: pa.Schema, cid: int) -> list[tuple]:
    return sorted_rows(read_state(LocalFileIO(), [handle], 0, 7, schema, f"chk-{cid}"))


def _forget_warm_state(tmp_path) -> None:
    """A cold executor: nothing of the state or its key index is held here."""
    import shutil
    backend.flush_cache_writes()
    backend._RECENT.clear()
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)


@pytest.mark.parametrize("size,slide,late,emit,seed", [(60, 60, 0, "final", 0), (60, 20, 15, "final", 1),
                                                      (40, 20, 0, "update", 2), (30, 30, 30, "update", 3)])
def test_window_on_touched_keys_equals_the_window_on_the_whole_state(tmp_path, narrow, size, slide, late, emit,
                                                                    seed):
    root = tmp_path.as_uri()
    w, sschema = window_spec(size, slide, late, emit)
    heap = sschema.empty_table()
    parent: dict[str, list[StateHandle]] = {}
    narrowed = fired_without_input = 0
    for r in window_rounds(seed, 14, 40):
        rnd, rows, kw = r.rnd, r.rows, r.step_kwargs()
        if rnd == 9:
            _forget_warm_state(tmp_path)  # the next round computes the key index from the held rows
        want = window_step(w, heap, rows, **kw)  # type: ignore[arg-type]
        with HeapState(StateScope("w", 0, KGR, "k", f"chk-{rnd}", f"{root}/job/chk-{rnd + 1}",
                                  {"win": StateSpec(sschema, EVENT_US, r.read_index(w, sschema))}, parent,
                                  _snapshot(root, rnd + 1), r.cutoff), LocalFileIO()) as access:
            held = access.read([rows])["win"]
            narrowed += held.num_rows < heap.num_rows
            got = window_step(w, held, rows, **kw)  # type: ignore[arg-type]
            assert sorted_rows(got.output) == sorted_rows(want.output), (rnd, "output")
            assert sorted_rows(got.late) == sorted_rows(want.late), (rnd, "late")
            fired_keys = set(got.output["k"].to_pylist()) if "k" in got.output.column_names else set()
            fired_without_input += bool(fired_keys - set(rows["k"].to_pylist()))
            h = access.write("win", got.state, index_time=r.write_index(w, sschema))
        heap = want.state.select(sschema.names)
        assert _restored(h, sschema, rnd + 1) == sorted_rows(heap), (rnd, "snapshot")
        parent = {"win": [h]}
    assert narrowed >= 5 and fired_without_input, (narrowed, fired_without_input)


@pytest.mark.parametrize("seed", range(2))
def test_process_on_touched_keys_expires_by_its_time_column(tmp_path, narrow, seed):
    rng = random.Random(seed)
    root = tmp_path.as_uri()
    st_schema = pa.schema([("k", pa.string()), ("c", pa.int64())])
    sschema = st_schema.append(pa.field(TOUCHED, pa.int64())).append(pa.field("_kg", pa.int32()))
    heap = sschema.empty_table()
    parent: dict[str, list[StateHandle]] = {}
    ttl = 30 * SEC
    narrowed = expired = 0
    for rnd in range(10):
        n = rng.randrange(0, 10)
        ks = [rng.randrange(30) for _ in range(n)]
        rows = pa.table({"k": [f"k{k}" for k in ks], "_kg": pa.array([k % 8 for k in ks], pa.int32())})
        barrier = (rnd + 1) * 10 * SEC
        kgs = rows.group_by("k").aggregate([("_kg", "min")]).rename_columns(["k", "_kg"])

        def carry(t: pa.Table, kgs: pa.Table = kgs) -> pa.Table:
            return t.join(kgs, keys="k", join_type="inner").select(sschema.names)
        want = process_step("p", "k", count_fn, st_schema, st_schema, heap, rows.select(["k"]), barrier_us=barrier,
                            ttl_us=ttl, carry=carry)
        with HeapState(StateScope("p", 0, KGR, "k", f"chk-{rnd}", f"{root}/job/chk-{rnd + 1}",
                                  {"proc": StateSpec(sschema, TOUCHED)}, parent, _snapshot(root, rnd + 1),
                                  barrier - ttl), LocalFileIO()) as access:
            held = access.read([rows])["proc"]
            narrowed += held.num_rows < heap.num_rows
            got = process_step("p", "k", count_fn, st_schema, st_schema, held, rows.select(["k"]),
                               barrier_us=barrier, ttl_us=ttl, carry=carry)
            assert sorted_rows(got.output) == sorted_rows(want.output) and got.expired == want.expired, rnd
            expired += got.expired
            h = access.write("proc", got.state.select(sschema.names).cast(sschema))
        heap = want.state.select(sschema.names).cast(sschema)
        assert _restored(h, sschema, rnd + 1) == sorted_rows(heap), rnd
        parent = {"proc": [h]}
    assert narrowed >= 3 and expired, (narrowed, expired)


def test_a_kernel_writing_a_key_the_round_did_not_touch_is_refused(tmp_path, narrow):
    from pipeline.exceptions import StateStoreError
    root = tmp_path.as_uri()
    schema = pa.schema([("k", pa.string()), ("c", pa.int64()), ("_kg", pa.int32())])
    first = pa.table({"k": ["a", "b"], "c": [1, 1], "_kg": pa.array([0, 1], pa.int32())}, schema=schema)
    with HeapState(StateScope("a", 0, KGR, "k", "chk-0", f"{root}/job/chk-1", {"agg": StateSpec(schema)}, {},
                              _snapshot(root, 1)), LocalFileIO()) as access:
        access.read([first])
        h = access.write("agg", first)
    with HeapState(StateScope("a", 0, KGR, "k", "chk-1", f"{root}/job/chk-2", {"agg": StateSpec(schema)},
                              {"agg": [h]}, _snapshot(root, 2)), LocalFileIO()) as access:
        held = access.read([first.slice(0, 1)])["agg"]
        assert held["k"].to_pylist() == ["a"]  # only the input's key
        with pytest.raises(StateStoreError, match="did not touch"):
            access.write("agg", pa.table({"k": ["a", "z"], "c": [2, 1], "_kg": pa.array([0, 2], pa.int32())},
                                         schema=schema))


def test_a_round_with_many_input_keys_runs_the_kernel_on_the_whole_range(tmp_path):
    root = tmp_path.as_uri()
    schema = pa.schema([("k", pa.string()), ("c", pa.int64()), ("_kg", pa.int32())])

    def rows(keys: list[str]) -> pa.Table:
        return pa.table({"k": keys, "c": [1] * len(keys), "_kg": pa.array([len(k) % 8 for k in keys], pa.int32())},
                        schema=schema)
    first = rows([f"k{i}" for i in range(100)])
    with HeapState(StateScope("a", 0, KGR, "k", "chk-0", f"{root}/job/chk-1", {"agg": StateSpec(schema)}, {},
                              _snapshot(root, 1)), LocalFileIO()) as access:
        assert access.read([first])["agg"].num_rows == 0
        h = access.write("agg", first)
    for n_keys, held_rows in ((30, 100), (20, 20)):  # 30 keys > 100 / 4: wide; 20: narrow
        scope = StateScope("a", 0, KGR, "k", "chk-1", f"{root}/job/chk-2", {"agg": StateSpec(schema)}, {"agg": [h]},
                           _snapshot(root, 2))
        with HeapState(scope, LocalFileIO()) as access:
            assert access.read([rows([f"k{i}" for i in range(n_keys)])])["agg"].num_rows == held_rows
