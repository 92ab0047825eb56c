"""Materialising a keyed store's base by merging (pipeline.state.store_base): the parent chain's base, filtered of
the changed keys, plus the changed keys' rows now (from the deltas, or from the store) equals a full scan of the
store (on a chain with updates, deletes and keys holding several rows; above the memory budget it is the scan),
and the merge's row count is checked against the store's."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from pipeline.checkpoint.handles import StateHandle
from pipeline.exceptions import StateStoreError
from pipeline.fileio import LocalFileIO
from pipeline.state.chain import StateChain
from pipeline.state.changelog import OP_COLUMN, diff
from pipeline.state.keyed_store import KeyedStateStore, StoreLocation, row_keys
from pipeline.state.snapshot import write_state
from pipeline.state.store_base import merged_base
from tests.unit.state.keyed_rows import SCHEMA, TS

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("state_cache_dir")]


def _state(e: int) -> pa.Table:
    """Epoch ``e``'s state: a growing key set, some keys deleted, some updated, keys ``m*`` with several rows."""
    keys = [f"k{i:04d}" for i in range(60 * (e + 1)) if not (e >= 2 and i % 11 == 0)]
    keys += [f"m{i}" for i in range(5) for _ in range(1 + (i + e) % 3)]
    return pa.table([pa.array(keys), pa.array([e if i % 7 == 0 else 1 for i in range(len(keys))], pa.int64()),
                     pa.array(list(range(len(keys))), pa.int64()).cast(TS),
                     pa.array([i % 8 for i in range(len(keys))], pa.int32())], schema=SCHEMA)


def _sorted(t: pa.Table) -> list[tuple]:
    return sorted(tuple(str(v) for v in r.values()) for r in t.to_pylist())


def _chain(root: str, epochs: int) -> StateHandle:
    fio = LocalFileIO()
    parent: list[StateHandle] = []
    for e in range(epochs):
        opts = {"checkpoint_id": e + 1, "round": 0, "shared": f"{root}/job/shared/op", "materialize": False,
                "incremental": True, "max_deltas": 10, "max_delta_ratio": 100.0}
        h = write_state(fio, f"{root}/job/chk-{e + 1}", "s", 0, 7, _state(e), parent, opts, f"chk-{e + 1}")
        assert h.file is not None
        parent = [h]
    return parent[0]


@pytest.mark.parametrize("memory_bytes", [None, 0], ids=["merged", "scan-above-the-budget"])
def test_merged_base_equals_a_full_scan_of_the_store(tmp_path, memory_bytes):
    h = _chain(tmp_path.as_uri(), 5)
    chain = StateChain.of(h)
    assert chain is not None and len(chain.deltas) == 4
    old, new = _state(4), _state(5)
    round_delta = diff(old, new)
    assert round_delta.num_rows and set(round_delta[OP_COLUMN].to_pylist()) == {-1, 1}
    path = StoreLocation("job", "op", "s", 0, 7).path(str(tmp_path / "stores"))
    with KeyedStateStore(path, SCHEMA, "key", "_kg", "_ingest_ts") as st:
        st.rebuild(LocalFileIO(), [h], "chk-5")
        touched = list(dict.fromkeys(row_keys(pa.concat_tables([old, new]), "key", "_kg")))
        st.apply(touched, new, rows=new.num_rows)
        scanned = pa.Table.from_batches(list(st.scan()), schema=SCHEMA)
        merged = pa.Table.from_batches(list(merged_base(LocalFileIO(), chain, round_delta, st, "chk-6",
                                                        memory_bytes=memory_bytes)), schema=SCHEMA)
        assert _sorted(merged) == _sorted(scanned) == _sorted(new)
        # a store whose row count disagrees with what the chain and the delta give is refused, naming the store
        st.apply([], new.schema.empty_table(), rows=new.num_rows + 1)
        if memory_bytes is None:
            with pytest.raises(StateStoreError, match="merging chain.*chk-6"):
                list(merged_base(LocalFileIO(), chain, round_delta, st, "chk-6", memory_bytes=memory_bytes))


def test_merged_base_of_a_chain_without_deltas_and_an_empty_round(tmp_path):
    h = _chain(tmp_path.as_uri(), 1)
    chain = StateChain.of(h)
    assert chain is not None and not chain.deltas
    path = Path(StoreLocation("job", "op", "s", 0, 7).path(str(tmp_path / "stores")))
    with KeyedStateStore(str(path), SCHEMA, "key", "_kg", "_ingest_ts") as st:
        st.rebuild(LocalFileIO(), [h], "chk-1")
        empty = SCHEMA.append(pa.field(OP_COLUMN, pa.int8())).empty_table()
        merged = pa.Table.from_batches(list(merged_base(LocalFileIO(), chain, empty, st, "chk-2")), schema=SCHEMA)
        assert _sorted(merged) == _sorted(_state(0))
