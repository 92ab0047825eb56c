"""Garbage collection of executor-local keyed stores (pipeline.state.store_gc): another parallelism's stores of
the same state go, the subtask's own and the other subtasks' stay; a store another process holds open is never
deleted (RocksDB's own lock), and is collected once it is closed; idle stores go after the idle time."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest

from pipeline.state.keyed_store import KeyedStateStore, StoreLocation, row_keys
from pipeline.state.store_gc import collect_idle_stores, collect_replaced_ranges, remove_store

pytestmark = pytest.mark.unit

SCHEMA = pa.schema([("key", pa.string()), ("_kg", pa.int32())])


def _make(root: str, a: int, b: int, name: str = "s") -> str:
    path = StoreLocation("job", "op", name, a, b).path(root)
    with KeyedStateStore(path, SCHEMA, "key", "_kg", None) as st:
        t = pa.table({"key": ["x"], "_kg": pa.array([a], pa.int32())})
        st.apply(row_keys(t, "key", "_kg"), t, rows=1)
        st.set_version("v")
    return path


_HOLD = """
import sys, time
from rocksdict import Options, Rdict
db = Rdict(sys.argv[1], Options(raw_mode=True))
print("open", flush=True)
sys.stdin.readline()
db.close()
"""


def test_replaced_ranges_go_and_live_ones_stay(tmp_path):
    root = str(tmp_path / "stores")
    old = [_make(root, 0, 7), _make(root, 8, 15)]       # parallelism 2
    mine = _make(root, 0, 5)                             # parallelism 3, subtask 0
    other = _make(root, 6, 10)                           # parallelism 3, subtask 1 (overlaps an old one too)
    far = _make(root, 11, 15)
    other_state = _make(root, 0, 7, name="t")
    removed = collect_replaced_ranges(StoreLocation("job", "op", "s", 0, 5), root)
    assert removed == [old[0]]  # only the old range overlapping [0, 5]; never the subtask's own or a neighbour's
    assert all(os.path.isdir(p) for p in (mine, other, far, other_state, old[1]))
    assert collect_replaced_ranges(StoreLocation("job", "op", "s", 6, 10), root) == [old[1]]
    assert not [n for n in os.listdir(os.path.dirname(mine)) if n.startswith(".gc-")]  # no trash left
    with KeyedStateStore(mine, SCHEMA, "key", "_kg", None) as st:
        assert st.version == "v" and st.rows == 1  # the live store is intact


def test_a_store_open_in_another_process_is_never_deleted(tmp_path):
    root = str(tmp_path / "stores")
    stale = _make(root, 0, 7)
    with subprocess.Popen([sys.executable, "-c", _HOLD, stale], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as holder:  # the with closes both pipes
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
            assert not remove_store(stale)
            assert collect_replaced_ranges(StoreLocation("job", "op", "s", 0, 3), root) == []
            assert collect_idle_stores(0, root, now=time.time() + 3600) == []
            assert os.path.isdir(stale)
        finally:
            assert holder.stdin is not None
            holder.stdin.write("\n")
            holder.stdin.flush()
            holder.wait(timeout=30)
    assert holder.returncode == 0
    assert collect_replaced_ranges(StoreLocation("job", "op", "s", 0, 3), root) == [stale]
    assert not os.path.exists(stale)
    # a task opening the path later finds no store: an empty one, whose version matches no checkpoint (rebuilt)
    with KeyedStateStore(stale, SCHEMA, "key", "_kg", None) as st:
        assert st.version is None and st.rows == 0


def test_a_store_open_in_this_process_is_never_deleted(tmp_path):
    root = str(tmp_path / "stores")
    path = _make(root, 0, 7)
    with KeyedStateStore(path, SCHEMA, "key", "_kg", None) as st:
        assert not remove_store(path)
        assert collect_idle_stores(0, root, now=time.time() + 3600) == []
        assert st.version == "v"
    assert collect_idle_stores(0, root, now=time.time() + 3600) == [path]


def test_idle_stores_go_after_the_idle_time(tmp_path):
    root = str(tmp_path / "stores")
    a, b = _make(root, 0, 7), _make(root, 0, 7, name="t")
    assert collect_idle_stores(3600, root) == []  # just written
    assert sorted(collect_idle_stores(3600, root, now=time.time() + 7200)) == sorted([a, b])
    assert not os.path.exists(a) and not os.path.exists(b)
