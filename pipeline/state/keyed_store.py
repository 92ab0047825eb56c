"""The keyed state store of the ``rocksdb`` state backend: one executor-local RocksDB per (job, operator, state,
key-group range), read and written per key, so a round costs what its input touches, not the whole state.

Layout of one store (all keys are bytes, RocksDB orders them bytewise):

* ``d`` + key group (2 bytes, big-endian) + encoded user key -> every state row of that user key, serialized
  (a pickled list of row tuples; temporal columns as their integer storage), **in canonical order**
  (:func:`within_key_order`: by the other sortable columns in schema order, nulls last, whatever order the rows
  arrived in). So a key-group range is a range scan, the rows of a round's keys are one multi-get, and a scan
  gives the same rows in the same order for the same logical state: a base written from the store has the same
  bytes whatever order Spark's shuffle delivered the rows in (a retried task, several epochs per round).
* ``t`` + time (8 bytes, order-preserving) + the ``d`` key's suffix -> empty: the **TTL index**. Rows whose time
  column is below a cutoff are found by a range scan of ``t`` up to the cutoff, never by scanning the state.
  Entries may be stale (their rows left for another reason); a stale entry only makes its key touched once more.
* ``m:version`` -> the digest of the state chain (:mod:`pipeline.state.chain`) the store holds, with the row
  layout it was written in (columns and types by position, key, time column: a store of another layout is never
  used, so a job upgraded with a different state schema rebuilds it); ``m:rows`` -> the
  number of state rows. A round deletes ``m:version`` in the write batch that applies its changes and sets it
  after its snapshot files are written: a store whose version is not the parent checkpoint's chain digest (a
  crash, a failed checkpoint, a restore, a rescale, a task moved to another executor) is rebuilt from the
  checkpoint's chain in bounded batches (:meth:`KeyedStateStore.rebuild`), every file checksum-verified.

The store is opened per task and closed at its end (RocksDB allows one process per store, and Spark hands a
subtask's next round to any Python worker). Settings (executors' environment): ``PIPELINE_STATE_STORE_DIR``
(default ``<PIPELINE_STATE_CACHE_DIR or tmp>/keyed``); its memory (caches, memtables, open files):
:mod:`pipeline.state.store_memory`.

Lazy imports: ``rocksdict`` is imported when a store is opened or written, so jobs on the heap backend never
load RocksDB into their workers.

Over 400 lines: one class, the RocksDB store and its TTL index: read, write, rebuild and commit share the handle and
its invariants.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import struct
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import settings
from pipeline.checkpoint.handles import StateHandle
from pipeline.exceptions import CorruptCheckpointError, IncompatibleStateError, StateStoreError
from pipeline.fileio import FileIO
from pipeline.layout import key_group_name
from pipeline.state.attempts import sortable_type
from pipeline.state.backend import read_verified
from pipeline.state.chain import StateChain
from pipeline.state.changelog import OP_COLUMN
from pipeline.state.store_memory import store_options

if TYPE_CHECKING:
    from rocksdict import WriteBatch

__all__ = ["KeyedStateStore", "StoreLocation", "encode_user_key", "open_here", "order_compatible_key", "row_keys",
           "storage_columns", "storage_type",
           "slice_rows", "store_root", "within_key_order"]

_DATA = b"d"
_DATA_END = b"e"
_TTL = b"t"
_VERSION = b"m:version"
_ROWS = b"m:rows"
_BATCH = 16_384  # at most this many rows per scan / rebuild / write slice ...
_BATCH_BYTES = 4 << 20  # ... and about this many bytes (wide rows: a slice is decoded into Python objects, pickled
#                         and held in a write batch at once, so a few copies of it are alive)
_SIGN = 1 << 63
_NULL_TIME = -(1 << 63)
_OPEN: dict[str, Any] = {}  # path -> the open RocksDB handle of this process


def store_root() -> str:
    """Where the executor keeps its stores (``PIPELINE_STATE_STORE_DIR``)."""
    explicit = settings.raw("PIPELINE_STATE_STORE_DIR")
    if explicit:
        return explicit
    cache = settings.raw("PIPELINE_STATE_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "epochal-state-cache")
    return os.path.join(cache, "keyed")


def open_here(path: str) -> bool:
    """Whether this process has the store at ``path`` open."""
    path = os.path.abspath(path)
    return any(os.path.abspath(p) == path for p in _OPEN)


@dataclass(frozen=True, slots=True)
class StoreLocation:
    """Which store: a job's operator state over one key-group range."""

    job: str
    uid: str
    name: str
    kg_start: int
    kg_end: int

    def path(self, root: str | None = None) -> str:
        jid = hashlib.sha256(f"{self.job}\0{self.uid}".encode()).hexdigest()[:16]
        return os.path.join(root or store_root(), jid, self.name, key_group_name(self.kg_start, self.kg_end))


def encode_user_key(v: Any) -> bytes:
    """A user key as bytes: equal keys give equal bytes, keys of different types never collide."""
    if v is None:
        return b"n"
    if isinstance(v, bool):
        return b"?" + (b"\1" if v else b"\0")
    if isinstance(v, int):
        if -_SIGN <= v < _SIGN:
            return b"i" + struct.pack(">Q", v + _SIGN)
        return b"I" + str(v).encode()
    if isinstance(v, str):
        return b"s" + v.encode("utf-8")
    if isinstance(v, (bytes, bytearray)):
        return b"b" + bytes(v)
    if isinstance(v, float):
        return b"f" + struct.pack(">d", v)
    return b"o" + repr(v).encode("utf-8")


def order_compatible_key(t: pa.DataType) -> bool:
    """Whether Arrow's sort order on a key column of type ``t`` is the store's order of its encoded keys
    (:func:`encode_user_key`: integers below 2**63, strings and binary bytewise, booleans, temporal values as
    their integers; nulls last, except for strings, where the null key comes first). Floats and decimals are not
    (their encodings are not order-preserving)."""
    return (pa.types.is_signed_integer(t) or pa.types.is_uint8(t) or pa.types.is_uint16(t) or pa.types.is_uint32(t)
            or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_boolean(t) or pa.types.is_temporal(t))


def null_key_first(t: pa.DataType) -> bool:
    """Whether the null key sorts before the other keys of type ``t`` in the store (``n`` < ``s``: strings)."""
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def within_key_order(schema: pa.Schema, key: str, kg_column: str) -> Callable[[tuple], Any]:
    """The sort key of a key's rows in the store (a row: a tuple in ``schema`` order, temporal columns as their
    integers): the sortable columns other than the key and the key group, in schema order, nulls last and NaN
    before them (Arrow's canonical order, :func:`~pipeline.state.attempts.canonical_order`, restricted to one
    key); rows equal in all of those are ordered by the ``repr`` of their other (nested) columns, so the order
    is total on distinct rows."""
    cols = [i for i, f in enumerate(schema) if f.name not in (key, kg_column) and sortable_type(f.type)]
    rest = [i for i, f in enumerate(schema) if f.name not in (key, kg_column) and not sortable_type(f.type)]

    def one(v: Any) -> tuple:
        if v is None:
            return (2, 0)
        if v != v:  # NaN
            return (1, 0)
        return (0, v)

    if rest:
        return lambda r: (tuple(one(r[i]) for i in cols), tuple(repr(r[i]) for i in rest))
    if len(cols) == 1:
        c = cols[0]
        return lambda r: one(r[c])
    return lambda r: tuple(one(r[i]) for i in cols)


def _time_bytes(us: int | None) -> bytes:
    return struct.pack(">Q", (_NULL_TIME if us is None else us) + _SIGN)


def storage_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_time64(t) or pa.types.is_date64(t):
        return pa.int64()
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    return t


def storage_columns(table: pa.Table, schema: pa.Schema) -> list[list]:
    """The columns of ``table`` in ``schema`` order as Python lists, temporal values as their integers (the form
    a row tuple takes in the store and in an ``index_time`` function)."""
    return [table[f.name].cast(f.type).cast(storage_type(f.type)).to_pylist() for f in schema]


def _table(rows: Sequence[tuple], schema: pa.Schema) -> pa.Table:
    if not rows:
        return schema.empty_table()
    cols = list(zip(*rows))
    return pa.table([pa.array(c, storage_type(f.type)).cast(f.type) for c, f in zip(cols, schema)], schema=schema)


def slice_rows(row_bytes: float, limit: int = _BATCH) -> int:
    """Rows per slice for rows of ``row_bytes`` each: about :data:`_BATCH_BYTES` per slice, at most ``limit``
    rows (and at least 64, if ``limit`` allows)."""
    return max(min(64, limit), min(limit, int(_BATCH_BYTES // max(1.0, row_bytes))))


def row_keys(table: pa.Table, key: str, kg_column: str, key_type: pa.DataType | None = None) -> list[bytes]:
    """Per row of ``table``: the suffix of its ``d`` key (key group + encoded user key), encoded as the store
    encodes its rows' keys (:meth:`KeyedStateStore._group`): cast to the state's ``key_type`` (when given), temporal
    values as their integers."""
    col = table[key]
    if key_type is not None and col.type != key_type:
        col = col.cast(key_type)
    if storage_type(col.type) != col.type:
        col = col.cast(storage_type(col.type))
    return [struct.pack(">H", kg) + encode_user_key(k)
            for kg, k in zip(table[kg_column].to_pylist(), col.to_pylist())]


class KeyedStateStore:
    """One keyed store (see the module docstring). ``schema``: the state rows' columns (the user key and the key
    group among them); ``time_column``: the timestamp column of the TTL index (None: no index); ``index_time``:
    maps a row (a tuple in ``schema`` order, temporal columns as integers) to the time its index entry is filed
    under (default: its ``time_column`` value; a window files a record under its next window's firing time, which
    depends on the watermark, so the operator sets it per round: :attr:`index_time`)."""

    def __init__(self, path: str, schema: pa.Schema, key: str, kg_column: str, time_column: str | None,
                 *, lock_timeout_s: float = 120.0, index_time: Callable[[Any], Any] | None = None) -> None:
        from rocksdict import Rdict
        self.path, self.schema, self.key, self.kg_column, self.time_column = path, schema, key, kg_column, time_column
        self._names = schema.names
        self._key_i = self._names.index(key)
        self._kg_i = self._names.index(kg_column)
        self._time_i = self._names.index(time_column) if time_column else None
        self.index_time = index_time
        self._order = within_key_order(schema, key, kg_column)
        # the row layout the stored values are written in (columns by position, key, time index)
        self._layout = hashlib.sha256(repr(([(f.name, str(f.type)) for f in schema], key, kg_column,
                                            time_column)).encode()).hexdigest()[:16]
        self._opts = opts = store_options()  # memory bounds: pipeline.state.store_memory
        os.makedirs(path, exist_ok=True)
        stale = _OPEN.pop(path, None)
        if stale is not None:  # left open by a failed task of this worker (a worker runs one task at a time)
            stale.close()
        deadline = time.monotonic() + lock_timeout_s
        while True:
            try:
                self._db = Rdict(path, opts)
                break
            except Exception as e:  # noqa: BLE001 - RocksDB's lock: another worker still holds this store
                if "lock" not in str(e).lower() or time.monotonic() > deadline:
                    raise StateStoreError(f"keyed state store {path}: cannot open: {e}") from e
                time.sleep(0.05)
        _OPEN[path] = self._db

    # -- lifecycle ---------------------------------------------------------------------------------------------
    def close(self) -> None:
        if _OPEN.get(self.path) is self._db:
            del _OPEN[self.path]
        self._db.close()

    def __enter__(self) -> KeyedStateStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def version(self) -> str | None:
        """The chain digest the store holds, or None: none, or rows written in another row layout (a job upgraded
        with a different state schema: the rows are decoded by position, so such a store is rebuilt)."""
        v = self._db.get(_VERSION)
        if v is None:
            return None
        digest, _, layout = bytes(v).decode().rpartition("@")
        return digest if layout == self._layout else None

    @property
    def rows(self) -> int:
        v = self._db.get(_ROWS)
        return 0 if v is None else int(bytes(v))

    def set_version(self, version: str) -> None:
        self._db.put(_VERSION, f"{version}@{self._layout}".encode())

    def clear(self) -> None:
        """Forget everything (before a rebuild)."""
        from rocksdict import Rdict
        _OPEN.pop(self.path, None)
        self._db.close()
        Rdict.destroy(self.path, self._opts)
        shutil.rmtree(self.path, ignore_errors=True)
        os.makedirs(self.path, exist_ok=True)
        self._db = Rdict(self.path, self._opts)
        _OPEN[self.path] = self._db

    # -- reads -------------------------------------------------------------------------------------------------
    def get(self, suffixes: Sequence[bytes]) -> pa.Table:
        """Every state row of the given keys (one multi-get)."""
        if not suffixes:
            return self.schema.empty_table()
        vals: list = self._db[[_DATA + s for s in suffixes]] or []
        rows: list[tuple] = []
        for v in vals:
            if v is not None:
                rows.extend(pickle.loads(v))
        return _table(rows, self.schema)

    def expiring(self, cutoff_us: int) -> list[bytes]:
        """Keys (``d`` suffixes) with a TTL index entry below ``cutoff_us`` (a range scan of what expires)."""
        out: list[bytes] = []
        end = _TTL + _time_bytes(cutoff_us)
        it = self._db.iter()
        it.seek(_TTL)
        while it.valid():
            k = bytes(it.key())
            if k >= end:
                break
            out.append(k[9:])
            it.next()
        return list(dict.fromkeys(out))

    def scan(self, batch_rows: int = _BATCH) -> Iterator[pa.RecordBatch]:
        """Every state row, in key order, in batches of at most ``batch_rows`` rows and about
        :data:`_BATCH_BYTES` of values (bounded memory, also for wide rows)."""
        from rocksdict import ReadOptions
        ro = ReadOptions()
        ro.set_iterate_upper_bound(_DATA_END)
        rows: list[tuple] = []
        size = 0
        loads = pickle.loads
        for v in self._db.values(from_key=_DATA, read_opt=ro):
            rows.extend(loads(v))
            size += len(v)
            if len(rows) >= batch_rows or size >= _BATCH_BYTES:
                yield from _table(rows, self.schema).to_batches()
                rows, size = [], 0
        if rows:
            yield from _table(rows, self.schema).to_batches()

    # -- writes ------------------------------------------------------------------------------------------------
    def _group(self, table: pa.Table) -> dict[bytes, list[tuple]]:
        cols = storage_columns(table, self.schema)
        groups: dict[bytes, list[tuple]] = {}
        for row in zip(*cols):
            s = struct.pack(">H", row[self._kg_i]) + encode_user_key(row[self._key_i])
            groups.setdefault(s, []).append(row)
        return groups

    def _index(self, wb: WriteBatch, suffix: bytes, rows: Iterable[tuple]) -> None:
        if self._time_i is None:
            return
        f = self.index_time
        for t in {r[self._time_i] if f is None else f(r) for r in rows}:
            wb.put(_TTL + _time_bytes(t) + suffix, b"")

    def apply(self, touched: Sequence[bytes], new_rows: pa.Table, *, rows: int,
              expired_below_us: int | None = None) -> None:
        """Replace the rows of the ``touched`` keys by ``new_rows`` (keys absent from it are deleted), drop the TTL
        index entries below ``expired_below_us`` and record ``rows`` as the state's row count. The version is
        cleared first (until :meth:`set_version`), so a store interrupted in between is rebuilt, never used; the
        rows are written in slices of keys (bounded memory)."""
        from rocksdict import WriteBatch
        # first: a store interrupted below is never taken for any version (RocksDB's WAL recovers a prefix of
        # the writes, so no fsync is needed for that order; a lost version only costs a rebuild)
        self._db.delete(_VERSION)
        remaining = set(touched)
        # in slices of keys (bounded memory for wide rows): all rows of a key are in one slice
        order = pc.sort_indices(new_rows, sort_keys=[(self.kg_column, "ascending"), (self.key, "ascending")]) \
            if new_rows.num_rows else None
        start = 0
        step = slice_rows(new_rows.nbytes / max(1, new_rows.num_rows))
        key_cols = new_rows.select([self.kg_column, self.key])  # to find where a key ends (no payload copied)
        while order is not None and start < new_rows.num_rows:
            end = min(new_rows.num_rows, start + step)
            part = new_rows.take(order[start:end])
            groups = self._group(part)
            del part
            last = next(reversed(groups))
            while end < new_rows.num_rows:  # the last key may continue in the next slice: complete it
                nxt = row_keys(key_cols.take(order[end:end + step]), self.key, self.kg_column,
                               self.schema.field(self.key).type)
                same = next((i for i, k in enumerate(nxt) if k != last), len(nxt))
                if same == 0:
                    break
                groups[last].extend(self._group(new_rows.take(order[end:end + same]))[last])
                end += same
            wb = WriteBatch(raw_mode=True)
            for s, g in groups.items():
                if s not in remaining:
                    raise StateStoreError(f"keyed state store {self.path}: rows of a key the round did not touch")
                remaining.discard(s)
                if len(g) > 1:
                    g.sort(key=self._order)
                wb.put(_DATA + s, pickle.dumps(g, protocol=pickle.HIGHEST_PROTOCOL))
                self._index(wb, s, g)
            self._db.write(wb)
            start = end
        wb = WriteBatch(raw_mode=True)
        for s in remaining:
            wb.delete(_DATA + s)
        if expired_below_us is not None and self._time_i is not None:
            wb.delete_range(_TTL, _TTL + _time_bytes(expired_below_us))
        wb.put(_ROWS, str(rows).encode())
        self._db.write(wb)

    def _add(self, table: pa.Table, sign: int | None = None) -> int:
        """Add rows (``sign`` None: all +1; else per-row ``_op`` +1 / -1) to the store; the net row change."""
        from rocksdict import WriteBatch
        ops = table[OP_COLUMN].to_pylist() if sign is not None else None
        data = table.select(self._names) if ops is not None else table
        cols = storage_columns(data, self.schema)
        by_key: dict[bytes, list[tuple[int, tuple]]] = {}
        for i, row in enumerate(zip(*cols)):
            s = struct.pack(">H", row[self._kg_i]) + encode_user_key(row[self._key_i])
            by_key.setdefault(s, []).append((1 if ops is None else int(ops[i]), row))
        keys = list(by_key)
        old: list = self._db[[_DATA + s for s in keys]] or []
        wb = WriteBatch(raw_mode=True)
        net = 0
        for s, cur in zip(keys, old):
            held: list[tuple] = list(pickle.loads(cur)) if cur is not None else []
            for op, row in by_key[s]:
                if op > 0:
                    held.append(row)
                    net += 1
                else:
                    try:
                        held.remove(row)
                    except ValueError:
                        raise CorruptCheckpointError(
                            f"keyed state store {self.path}: the changelog deletes a row its base does not hold "
                            f"(key {row[self._key_i]!r})") from None
                    net -= 1
            if held:
                if len(held) > 1:
                    held.sort(key=self._order)
                wb.put(_DATA + s, pickle.dumps(held, protocol=pickle.HIGHEST_PROTOCOL))
                self._index(wb, s, held)
            else:
                wb.delete(_DATA + s)
        self._db.write(wb)
        return net

    def rebuild(self, fileio: FileIO, handles: Iterable[StateHandle], checkpoint: str, *,
                optional: Sequence[str] = (), batch_rows: int = _BATCH) -> int:
        """Forget the store and load the key groups of its range from the chains of ``handles`` (the parent
        checkpoint's state of this operator; several overlapping chains after a rescale): each file read and
        checksum-verified, the base streamed in batches, then each delta applied per key. Returns the rows."""
        self.clear()
        kg_lo, kg_hi = _range_of(self.path)
        rows = 0
        for h in handles:
            chain = StateChain.of(h)
            if chain is None or h.kg_end < kg_lo or h.kg_start > kg_hi:
                continue
            whole = kg_lo <= h.kg_start and h.kg_end <= kg_hi
            n = 0
            for i, fh in enumerate(chain.files):
                pf = pq.ParquetFile(pa.BufferReader(read_verified(fileio, fh, checkpoint)))
                md = pf.metadata
                decoded = sum(md.row_group(g).total_byte_size for g in range(md.num_row_groups))
                for b in pf.iter_batches(batch_size=slice_rows(decoded / max(1, md.num_rows), batch_rows)):
                    t = pa.Table.from_batches([b])
                    if not whole:
                        kg = t[self.kg_column]
                        t = t.filter(pc.and_(pc.greater_equal(kg, kg_lo), pc.less_equal(kg, kg_hi)))
                    for name in optional:
                        if name not in t.column_names:
                            t = t.append_column(name, pa.nulls(t.num_rows, self.schema.field(name).type))
                    missing = [f.name for f in self.schema if f.name not in t.column_names]
                    if missing:
                        raise IncompatibleStateError(
                            f"checkpoint {checkpoint}: state file {fh.uri} has no column(s) {missing} of the "
                            f"operator's state now: it was written by another version of the job (a state schema "
                            f"change); start from a savepoint `epochal bootstrap` builds for this job")
                    if t.num_rows:
                        n += self._add(t, sign=1 if i else None)
            if whole and n != chain.rows:
                raise CorruptCheckpointError(f"checkpoint {checkpoint}: state chain {chain.base.uri} "
                                             f"(+{len(chain.deltas)} deltas) holds {n} rows, the handle says "
                                             f"{chain.rows}")
            rows += n
        self._db.put(_ROWS, str(rows).encode())
        return rows


def _range_of(path: str) -> tuple[int, int]:
    a, b = os.path.basename(path.rstrip("/"))[3:].split("-")
    return int(a), int(b)
