"""The join's state on keyed stores (``PIPELINE_STATE_BACKEND=rocksdb``, :mod:`pipeline.state.keyed_store`).

Per round and subtask, instead of restoring both sides' whole state:

1. open the left and right stores of the subtask's key-group range; a store whose version is not the parent
   checkpoint's chain digest is rebuilt from that chain (verified, in bounded batches; after a rescale from the
   overlapping old chains);
2. the **touched keys**: the keys of this round's new rows of both sides, plus the keys with TTL index entries
   below the round's cutoff (a range scan of what expires);
3. read those keys' rows of both sides (multi-gets) and run the unchanged vectorised kernel
   (:func:`pipeline.operators.join.join_step`) on (new rows, touched state): a new row only meets held rows of its
   own key, and a row only expires, flips its matched flag or leaves for a touched key, so the output and the new
   state of the touched keys are what the kernel gives on the whole state;
4. the difference between the touched keys' old and new rows **is** the changelog delta; it is written back to
   the store (one write batch) and snapshotted as the same delta / base files as the heap backend, so
   ``_metadata``, restore, rescale, savepoints and retention do not change.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import pyarrow as pa

from pipeline.keygroups import KeyGroupRange
from pipeline.operators.join import JoinResult
from pipeline.operators.ttl import ROW_EPOCH
from pipeline.state.backend import KG_COLUMN
from pipeline.state.changelog import OP_COLUMN, diff
from pipeline.state.keyed_store import KeyedStateStore, StoreLocation, row_keys
from pipeline.state.snapshot import parent_chain_version, write_state_changes

__all__ = ["JoinStores", "TouchedState"]

SIDES = ("left", "right")


@dataclass(frozen=True, slots=True)
class TouchedState:
    """The held rows of one round's touched keys (both sides, as stored), and the keys."""

    left: pa.Table
    right: pa.Table
    keys: tuple[bytes, ...]


class JoinStores:
    """The two keyed stores of one join subtask for one round (open from construction to :meth:`close`)."""

    def __init__(self, *, job: str, uid: str, key: str, kgr: KeyGroupRange, schemas: Mapping[str, pa.Schema],
                 parent_handles: Mapping[str, list], fileio, checkpoint: str) -> None:
        self.kgr, self.key, self.checkpoint, self.fileio = kgr, key, checkpoint, fileio
        self.schemas = dict(schemas)
        self.parent = {s: list(parent_handles.get(s, [])) for s in SIDES}
        self.stores: dict[str, KeyedStateStore] = {}
        self.rebuilt: dict[str, int] = {}
        try:
            for side in SIDES:
                loc = StoreLocation(job, uid, side, kgr.start, kgr.end)
                st = KeyedStateStore(loc.path(), self.schemas[side], key, KG_COLUMN, "_ingest_ts")
                self.stores[side] = st
                want = parent_chain_version(self.parent[side], kgr.start, kgr.end)
                if want is None or st.version != want:
                    self.rebuilt[side] = st.rebuild(fileio, self.parent[side], checkpoint, optional=(ROW_EPOCH,))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for st in self.stores.values():
            st.close()
        self.stores.clear()

    def touched(self, new_left: pa.Table, new_right: pa.Table, cutoff_us: int | None) -> TouchedState:
        """The held rows of the keys of the new rows and of the keys with rows expiring below ``cutoff_us``."""
        keys = row_keys(new_left, self.key, KG_COLUMN) + row_keys(new_right, self.key, KG_COLUMN)
        if cutoff_us is not None:
            for side in SIDES:
                keys += self.stores[side].expiring(cutoff_us)
        uniq = tuple(dict.fromkeys(keys))
        return TouchedState(self.stores["left"].get(uniq), self.stores["right"].get(uniq), uniq)

    def commit(self, held: TouchedState, res: JoinResult, *, cutoff_us: int | None, state_prefix: str,
               snapshot: Mapping | None) -> list[tuple[str, str, dict | None]]:
        """Write the round's changes to the stores and snapshot them; the state handle rows."""
        out = []
        for side, old, new in (("left", held.left, res.left), ("right", held.right, res.right)):
            schema = self.schemas[side]
            new = new.select(schema.names).cast(schema)
            delta = diff(old.select(schema.names).cast(schema), new)
            net = (sum(1 if o > 0 else -1 for o in delta[OP_COLUMN].to_pylist()) if delta.num_rows else 0)
            st = self.stores[side]
            rows = st.rows + net
            st.apply(held.keys, new, rows=rows, expired_below_us=cutoff_us)
            fh, version = write_state_changes(
                self.fileio, state_prefix, side, self.kgr.start, self.kgr.end, delta, rows, self.parent[side],
                snapshot, self.checkpoint, st.scan, schema)
            st.set_version(version)
            out.append(("state", side, fh))
        return out
