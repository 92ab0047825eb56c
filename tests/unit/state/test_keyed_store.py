"""The keyed state store (PIPELINE_STATE_BACKEND=rocksdb) on a real RocksDB: key encoding and order, per-key
reads and writes, the TTL index (expiry is a range scan of what expires), rebuild from a checkpoint's chain
(verified, also from the overlapping chains of a rescale), streaming scans."""
from __future__ import annotations

import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pipeline.checkpoint.handles import StateHandle
from pipeline.exceptions import CorruptCheckpointError, IncompatibleStateError
from pipeline.fileio import LocalFileIO
from pipeline.state.backend import read_state
from pipeline.state.chain import StateChain
from pipeline.state.keyed_store import KeyedStateStore, StoreLocation, encode_user_key, row_keys
from pipeline.state.snapshot import parent_chain_version, write_state
from tests.unit.state.keyed_rows import SCHEMA, TS

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("state_cache_dir")]


def _rows(keys, ns, ts, kgs) -> pa.Table:
    return pa.table([pa.array(keys), pa.array(ns, pa.int64()), pa.array(ts, pa.int64()).cast(TS),
                     pa.array(kgs, pa.int32())], schema=SCHEMA)


def _store(tmp_path: Path, kg=(0, 7), name="s") -> KeyedStateStore:
    return KeyedStateStore(StoreLocation("job", "op", name, *kg).path(str(tmp_path / "stores")), SCHEMA, "key",
                           "_kg", "_ingest_ts")


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([(c, "ascending") for c in t.column_names])


def test_key_encoding_is_injective_and_orders_key_groups_first():
    vals = [None, 0, -1, 1, 2**40, "0", "", b"0", 0.0, True, False, -(2**63), 2**63 - 1]
    enc = [encode_user_key(v) for v in vals]
    assert len(set(enc)) == len(enc)  # distinct keys (of different types too) never collide
    ints = [-(2**63), -5, -1, 0, 1, 7, 2**40, 2**63 - 1]
    assert sorted(ints, key=encode_user_key) == ints  # ints keep their order (range-scannable)
    t = _rows(["b", "a", "c"], [1, 2, 3], [0, 0, 0], [5, 2, 300])
    ks = row_keys(t, "key", "_kg")
    assert [struct.unpack(">H", k[:2])[0] for k in sorted(ks)] == [2, 5, 300]  # key group is the major order


def test_apply_get_scan_and_row_count(tmp_path):
    with _store(tmp_path) as st:
        assert st.version is None and st.rows == 0
        t = _rows(["a", "a", "b", "c"], [1, 2, 3, 4], [10, 20, 30, 40], [1, 1, 2, 3])
        keys = list(dict.fromkeys(row_keys(t, "key", "_kg")))
        st.apply(keys, t, rows=4)
        assert _sorted(st.get(row_keys(_rows(["a"], [0], [0], [1]), "key", "_kg"))).equals(_sorted(t.slice(0, 2)))
        assert st.get([]).num_rows == 0 and st.get([struct.pack(">H", 9) + encode_user_key("zz")]).num_rows == 0
        # a round touching a and c: a loses a row, c leaves, b untouched
        st.apply([keys[0], keys[2]], t.slice(1, 1), rows=2)
        st.set_version("v1")
        got = pa.Table.from_batches(list(st.scan(batch_rows=1)), schema=SCHEMA)
        assert _sorted(got).equals(_sorted(_rows(["a", "b"], [2, 3], [20, 30], [1, 2])))
        assert st.rows == 2 and st.version == "v1"
        st.apply([], SCHEMA.empty_table(), rows=2)
        assert st.version is None  # a write clears the version until its snapshot is written


def test_ttl_index_is_a_range_scan_of_what_expires(tmp_path):
    with _store(tmp_path) as st:
        t = _rows([f"k{i}" for i in range(100)], list(range(100)), [i * 10 for i in range(100)], [i % 8 for i in range(100)])
        keys = row_keys(t, "key", "_kg")
        st.apply(keys, t, rows=100)
        exp = st.expiring(250)  # rows with _ingest_ts < 250: k0..k24
        assert sorted(exp) == sorted(keys[:25])
        # the round expires them: their keys are touched and their rows leave; the index below the cutoff goes
        st.apply(exp, SCHEMA.empty_table(), rows=75, expired_below_us=250)
        assert st.expiring(250) == [] and sorted(st.expiring(300)) == sorted(keys[25:30])
        assert st.get(keys[:25]).num_rows == 0 and st.get(keys[25:]).num_rows == 75


def _chain_handles(root: str, epochs: int, kg=(0, 7)) -> list[StateHandle]:
    """A heap backend's chains of a growing state with updates and deletes (base + deltas)."""
    fio = LocalFileIO()
    parent: list[StateHandle] = []
    out = []
    for e in range(epochs):
        n = 50 * (e + 1)
        keys = [f"k{i:04d}" for i in range(n) if not (e >= 2 and i % 11 == 0)]  # some keys deleted
        t = _rows(keys, [e if i % 7 == 0 else 1 for i, _ in enumerate(keys)], [i for i, _ in enumerate(keys)],
                  [kg[0] + i % (kg[1] - kg[0] + 1) for i, _ in enumerate(keys)])
        opts = {"checkpoint_id": e + 1, "round": 0, "shared": f"{root}/job/shared/op", "materialize": False,
                "incremental": True, "max_deltas": 5, "max_delta_ratio": 10.0}
        h = write_state(fio, f"{root}/job/chk-{e + 1}", "s", kg[0], kg[1], t, parent, opts, f"chk-{e + 1}")
        assert h.file is not None and (h.kg_start, h.kg_end) == kg
        parent = [h]
        out.append(h)
    return out


def test_rebuild_from_a_chain_equals_the_restored_table_and_is_verified(tmp_path):
    root = tmp_path.as_uri()
    h = _chain_handles(root, 5)[-1]
    chain = StateChain.of(h)
    assert chain is not None and chain.deltas
    expected = read_state(LocalFileIO(), [h], 0, 7, SCHEMA, "chk-5")
    with _store(tmp_path) as st:
        assert st.rebuild(LocalFileIO(), [h], "chk-5", batch_rows=37) == expected.num_rows == st.rows
        got = pa.Table.from_batches(list(st.scan(batch_rows=64)), schema=SCHEMA)
        assert all(b.num_rows <= 64 + 50 for b in st.scan(batch_rows=64))
        assert _sorted(got).equals(_sorted(expected))
        assert parent_chain_version([h], 0, 7) == chain.digest
        assert parent_chain_version([], 0, 7) == "empty" and parent_chain_version([h], 0, 3) is None
        delta = Path(chain.deltas[-1].uri[len("file://"):])
        delta.write_bytes(delta.read_bytes()[:-3] + b"xyz")
        with pytest.raises(CorruptCheckpointError, match="chk-5.*checksum"):
            st.rebuild(LocalFileIO(), [h], "chk-5")


def test_rebuild_after_a_rescale_reads_the_overlapping_chains(tmp_path):
    root = tmp_path.as_uri()
    a = _chain_handles(root + "/a", 4, kg=(0, 3))[-1]
    b = _chain_handles(root + "/b", 3, kg=(4, 7))[-1]
    fio = LocalFileIO()
    expected = read_state(fio, [a, b], 2, 5, SCHEMA, "chk-4")
    assert set(pc.unique(expected["_kg"]).to_pylist()) == {2, 3, 4, 5}
    with _store(tmp_path, kg=(2, 5)) as st:
        assert st.rebuild(fio, [a, b], "chk-4", batch_rows=20) == expected.num_rows
        got = pa.Table.from_batches(list(st.scan()), schema=SCHEMA)
        assert _sorted(got).equals(_sorted(expected))


def test_apply_writes_wide_rounds_in_slices_without_splitting_a_key(tmp_path, monkeypatch):
    from pipeline.state import keyed_store
    monkeypatch.setattr(keyed_store, "_BATCH", 3)
    keys = ["a"] * 5 + ["b", "c"] + [None] * 4 + ["d"] * 3
    t = _rows(keys, list(range(len(keys))), list(range(len(keys))), [1] * len(keys))
    ks = list(dict.fromkeys(row_keys(t, "key", "_kg")))
    with _store(tmp_path) as st:
        st.apply(ks, t, rows=t.num_rows)
        for k in ("a", "b", None, "d"):
            want = t.filter(pc.is_null(t["key"])) if k is None else t.filter(pc.equal(t["key"], k))
            got = st.get(row_keys(want.slice(0, 1), "key", "_kg"))
            assert _sorted(got).equals(_sorted(want))


def test_a_timestamp_key_is_encoded_as_the_store_encodes_its_rows(tmp_path):
    """A state keyed by a timestamp (a top-N per window is keyed by ``window_start``): the touched keys of the input
    (another unit, no time zone) and the keys of the rows the store files match, so ``apply`` takes the rows and a
    ``get`` finds them (it raised "rows of a key the round did not touch" when input keys were encoded as datetimes)."""
    schema = pa.schema([("ws", pa.timestamp("us", tz="UTC")), ("n", pa.int64()), ("_kg", pa.int32())])
    st = KeyedStateStore(StoreLocation("job", "top", "rank", 0, 7).path(str(tmp_path / "stores")), schema, "ws",
                         "_kg", None)
    with st:
        rows = pa.table([pa.array([60_000, 60_000, 120_000], pa.int64()).cast(pa.timestamp("ms")),
                         pa.array([3, 1, 2], pa.int64()), pa.array([1, 1, 4], pa.int32())],
                        names=["ws", "n", "_kg"])
        keys = list(dict.fromkeys(row_keys(rows, "ws", "_kg", schema.field("ws").type)))
        assert len(keys) == 2
        st.apply(keys, rows.cast(schema), rows=3)
        got = st.get(keys[:1])
        assert sorted(got["n"].to_pylist()) == [1, 3] and got.schema.field("ws").type == schema.field("ws").type


def test_a_store_written_in_another_row_layout_is_never_taken_for_its_version(tmp_path):
    """Rows are stored by position: a job upgraded with another state schema (a column added, a type changed) finds
    the store of the same chain digest but must rebuild it, not decode the old rows with the new columns."""
    path = StoreLocation("job", "op", "s", 0, 7).path(str(tmp_path / "stores"))
    with KeyedStateStore(path, SCHEMA, "key", "_kg", "_ingest_ts") as st:
        st.set_version("v1")
        assert st.version == "v1"
    with KeyedStateStore(path, SCHEMA, "key", "_kg", "_ingest_ts") as st:
        assert st.version == "v1"  # the same layout: warm
    wider = pa.schema([*SCHEMA, pa.field("extra", pa.string())])
    with KeyedStateStore(path, wider, "key", "_kg", "_ingest_ts") as st:
        assert st.version is None  # another layout: rebuilt from the chain
    retyped = pa.schema([SCHEMA.field(0), pa.field(SCHEMA.field(1).name, pa.float64()), *list(SCHEMA)[2:]])
    with KeyedStateStore(path, retyped, "key", "_kg", "_ingest_ts") as st:
        assert st.version is None
    with KeyedStateStore(path, SCHEMA, "key", "_kg", None) as st:  # no time index now
        assert st.version is None


def test_a_rebuild_from_files_without_a_column_of_the_state_is_refused_naming_the_file(tmp_path):
    """A store rebuilt for a state schema with a column its checkpoint's files lack (the job changed its state) is
    refused with IncompatibleStateError naming the checkpoint, the file and the column, never filled in."""
    h = _chain_handles(tmp_path.as_uri(), 2)[-1]
    wider = pa.schema([*SCHEMA, pa.field("extra", pa.string())])
    path = StoreLocation("job", "op", "s", 0, 7).path(str(tmp_path / "stores"))
    with KeyedStateStore(path, wider, "key", "_kg", "_ingest_ts") as st:
        with pytest.raises(IncompatibleStateError, match=r"chk-2: state file .*\.parquet has no column\(s\) \['extra'\]"):
            st.rebuild(LocalFileIO(), [h], "chk-2")
        # a column the operator declares optional (filled with nulls) is not refused
        assert st.rebuild(LocalFileIO(), [h], "chk-2", optional=("extra",)) == h.state_rows or h.file.rows
