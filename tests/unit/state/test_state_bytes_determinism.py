"""A state snapshot's bytes are a function of the logical state only (pipeline.state.attempts rule 1): the same
input delivered in another order (Spark's shuffle: a retried task, several epochs per round) gives byte-identical
state files, checksums included, on both backends.

* rocksdb (pipeline.state.keyed_store): a key's rows are kept in canonical order in the store, so the first base
  (streamed from the store), the deltas and every later base (merged from the parent chain,
  pipeline.state.store_base) are equal file by file; a base merged from the chain has the bytes of a base
  scanned from the store, and of one scanned after a rebuild from the checkpoint;
* heap: a base is the canonically ordered table, nested columns included (rows equal in their sortable columns).
"""
from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.handles import StateHandle
from pipeline.fileio import LocalFileIO
from pipeline.keygroups import KeyGroupRange
from pipeline.runtime.operators.keyed_stores import KeyedStores
from pipeline.runtime.operators.state_access import StateScope, StateSpec
from pipeline.state import snapshot
from pipeline.state.chain import StateChain
from pipeline.state.changelog import OP_COLUMN, diff
from pipeline.state.keyed_store import KeyedStateStore, StoreLocation, row_keys
from pipeline.state.snapshot import _streamed_parquet, write_state, write_state_changes
from pipeline.state.store_base import merged_base

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("state_cache_dir")]

TS = pa.timestamp("us", tz="UTC")
KGR = KeyGroupRange(0, 7)
ROUNDS = 8


def _schema(key_type: pa.DataType, nested: bool) -> pa.Schema:
    cols = [("k", key_type), ("v", pa.int64()), ("ts", TS), ("note", pa.string()), ("_kg", pa.int32())]
    if nested:
        cols.insert(3, ("tags", pa.list_(pa.int64())))
    return pa.schema(cols)


def _key(key_type: pa.DataType, i: int | None):
    if i is None:
        return None
    return f"key-{i:03d}" if pa.types.is_string(key_type) else i * 7 - 40  # negative int keys too


def _input(schema: pa.Schema, rnd: int, n: int = 40) -> list[dict]:
    """Round ``rnd``'s input rows (content only, no order): keys new and old, several rows per key (some equal),
    null keys and null values."""
    rng = random.Random(1000 + rnd)
    kt = schema.field("k").type
    rows = []
    for _ in range(n):
        i = rng.choice([None] + list(range(n // 2 + 10 * rnd)))
        v = rng.choice([None, 1, 2, 3, rng.randrange(100)])
        rows.append({"k": _key(kt, i), "v": v, "ts": rng.randrange(5) * 1_000_000, "note": rng.choice(["a", "b", None]),
                     "_kg": (i if i is not None else 0) % 8, **({"tags": [rng.randrange(3)]} if "tags" in schema.names
                                                                 else {})})
    rows += [dict(r) for r in rows[:5]]  # equal rows: a multiset
    return rows


def _table(schema: pa.Schema, rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def _kernel(held: pa.Table, rows: list[dict], rnd: int, rng: random.Random) -> pa.Table:
    """The touched keys' rows now: the held rows (some deleted, by content) plus the input rows, in an order that
    depends on ``rng`` (as an operator's output follows the order its input arrived in)."""
    kept = [r for r in held.to_pylist() if (r["v"] or 0) % 5 != rnd % 5]
    out = kept + rows
    rng.shuffle(out)
    return _table(held.schema, out)


def _snapshot(root: str, cid: int) -> dict:
    return {"checkpoint_id": cid, "round": 0, "shared": f"{root}/job/shared/op", "materialize": False,
            "incremental": True, "max_deltas": 2, "max_delta_ratio": 100.0, "backend": "rocksdb", "job_root": root}


def _run_rocksdb(root: str, schema: pa.Schema, seed: int) -> list[list[tuple[str, int, str]]]:
    """The job's rounds with the input delivered in ``seed``'s order; per round the state's files (name, rows,
    sha256) with the job-root prefix removed."""
    rng = random.Random(seed)
    parent: dict[str, list[StateHandle]] = {}
    out = []
    for rnd in range(ROUNDS):
        rows = _input(schema, rnd)
        rng.shuffle(rows)
        inp = _table(schema, rows)
        stores = KeyedStores(StateScope("op", 0, KGR, "k", f"chk-{rnd}", f"{root}/job/chk-{rnd + 1}",
                                        {"s": StateSpec(schema, None)}, parent, _snapshot(root, rnd + 1)),
                             LocalFileIO())
        try:
            held = stores.read([inp])["s"]
            new = _kernel(held, rows, rnd, rng)
            h = stores.write("s", new)
        finally:
            stores.close()
        chain = StateChain.of(h)
        assert chain is not None
        out.append([(f.uri[len(root):].rsplit(".t", 1)[0], f.rows, f.sha256) for f in chain.files])
        parent = {"s": [h]}
    return out


@pytest.mark.parametrize("key_type", [pa.string(), pa.int64()], ids=["string-key", "int-key"])
@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_rocksdb_state_files_do_not_depend_on_the_order_rows_arrive_in(tmp_path, monkeypatch, key_type, nested):
    schema = _schema(key_type, nested)
    runs = []
    for seed in (1, 2):
        monkeypatch.setenv("PIPELINE_STATE_STORE_DIR", str(tmp_path / f"stores-{seed}"))
        runs.append(_run_rocksdb((tmp_path / f"run-{seed}").as_uri(), schema, seed))
    a, b = runs
    assert a == b
    # what the run did: a first base (scanned from the store), deltas, and (flat) bases merged from the chain
    shapes = [len(files) for files in a]
    assert shapes[0] == 1 and max(shapes) > 1 if not nested else set(shapes) == {1}, shapes
    assert [f[0][0].endswith("base.parquet") for f in a].count(True) >= (3 if not nested else ROUNDS)


def test_a_merged_base_has_the_bytes_of_a_scanned_base_and_of_a_rebuilt_store(tmp_path, monkeypatch):
    """Several row groups; the scan, the merge and the rebuilt store's scan batch the rows differently."""
    monkeypatch.setattr(snapshot, "STREAMED_ROW_GROUP_ROWS", 1000)
    schema = _schema(pa.string(), False)
    root, fio = tmp_path.as_uri(), LocalFileIO()

    def keys(*tables: pa.Table) -> list[bytes]:
        return list(dict.fromkeys(row_keys(pa.concat_tables(tables), "k", "_kg")))

    with KeyedStateStore(StoreLocation("j", "op", "s", 0, 7).path(str(tmp_path / "a")), schema, "k", "_kg",
                         None) as st:
        first = _table(schema, _input(schema, 0, 6000))
        st.apply(keys(first), first, rows=first.num_rows)
        h1, _ = write_state_changes(fio, f"{root}/job/chk-1", "s", 0, 7, first, first.num_rows, [],
                                    _snapshot(root, 1), "chk-1", st.scan, schema)
        old = pa.Table.from_batches(list(st.scan()), schema=schema)
        new = _kernel(old, _input(schema, 1, 3000), 1, random.Random(9))
        delta = diff(old, new)
        assert set(delta[OP_COLUMN].to_pylist()) == {-1, 1}
        st.apply(keys(old, new), new, rows=new.num_rows)
        chain = StateChain.of(h1)
        assert chain is not None and not chain.deltas
        batches = list(merged_base(fio, chain, delta, st, "chk-2"))
        assert len(batches) > 1 and len({b.num_rows for b in batches}) > 1
        merged = _streamed_parquet(schema, iter(batches))
        scanned = _streamed_parquet(schema, st.scan())
        h2, _ = write_state_changes(fio, f"{root}/job/chk-2", "s", 0, 7, delta, new.num_rows, [h1],
                                    _snapshot(root, 2), "chk-2", st.scan, schema)
    c2 = StateChain.of(h2)
    assert c2 is not None and len(c2.deltas) == 1
    with KeyedStateStore(StoreLocation("j", "op", "s", 0, 7).path(str(tmp_path / "b")), schema, "k", "_kg",
                         None) as rebuilt:
        assert rebuilt.rebuild(fio, [h2], "chk-2") == new.num_rows
        restored = _streamed_parquet(schema, rebuilt.scan())
    assert merged == scanned == restored
    assert pq.ParquetFile(pa.BufferReader(merged)).metadata.num_row_groups == -(-new.num_rows // 1000)


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
def test_heap_bases_do_not_depend_on_the_order_rows_arrive_in(tmp_path, nested):
    schema = _schema(pa.string(), nested)
    rows = _input(schema, 3)
    if nested:  # rows equal in every sortable column, different in the nested one
        rows += [dict(rows[0], tags=[7]), dict(rows[0], tags=[8, 9]), dict(rows[0], tags=[])]
    shas = set()
    for seed in range(3):
        random.Random(seed).shuffle(rows)
        h = write_state(LocalFileIO(), f"{tmp_path.as_uri()}/s{seed}", "s", 0, 7, _table(schema, rows), [],
                        {"checkpoint_id": 1, "shared": f"{tmp_path.as_uri()}/s{seed}/shared", "materialize": True},
                        "chk-1")
        assert h.file is not None and h.file.rows == len(rows)
        shas.add(h.file.sha256)
    assert len(shas) == 1
