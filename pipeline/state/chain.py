"""State chain: what one subtask's snapshot of one state table is made of.

A snapshot is a *materialised base* (a Parquet file holding every row, with the ``_kg`` column) followed by
zero or more *delta* files (changelogs, :mod:`pipeline.state.changelog`), oldest first. A checkpoint's state
handle names the whole chain, so it references files written by earlier checkpoints (incremental
checkpoints, Flink's shared state). Restore reads the base, applies the deltas; every file is verified by size
and SHA-256.

In the handle rows operator tasks yield (and the handle dicts the runtime carries between rounds) a chain is
flat: ``uri``/``rows``/``bytes``/``sha256`` describe the base, ``deltas`` the delta files (a JSON list of
``{uri, rows, bytes, sha256}``, or null), ``state_rows`` the rows of the state the chain represents.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping

from pipeline.checkpoint.handles import FileHandle

__all__ = ["StateChain"]


def _deltas_of(raw: Any) -> tuple[FileHandle, ...]:
    if raw is None or raw == "":
        return ()
    items = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    return tuple(f if isinstance(f, FileHandle) else FileHandle.from_dict(f) for f in items)


@dataclass(frozen=True, slots=True)
class StateChain:
    """A base file plus delta files, and the rows of the state they represent."""

    base: FileHandle
    deltas: tuple[FileHandle, ...] = ()
    rows: int = 0

    @property
    def files(self) -> tuple[FileHandle, ...]:
        return (self.base, *self.deltas)

    @property
    def bytes(self) -> int:
        """Stored bytes of the whole chain (the full state size this snapshot represents)."""
        return self.base.bytes + self.delta_bytes

    @property
    def delta_bytes(self) -> int:
        return sum(f.bytes for f in self.deltas)

    @property
    def digest(self) -> str:
        """Identity of the state this chain represents (the SHA-256 of its files' SHA-256s, in order)."""
        if not self.deltas:
            return self.base.sha256
        return hashlib.sha256("|".join(f.sha256 for f in self.files).encode()).hexdigest()

    def extended(self, delta: FileHandle, rows: int) -> "StateChain":
        return StateChain(self.base, (*self.deltas, delta), rows)

    @classmethod
    def from_handle(cls, h: Mapping[str, Any]) -> "StateChain | None":
        """The chain of a handle dict (None: the state was empty)."""
        if not h.get("uri"):
            return None
        base = FileHandle(uri=str(h["uri"]), rows=int(h.get("rows") or 0), bytes=int(h.get("bytes") or 0),
                          sha256=str(h.get("sha256") or ""))
        deltas = _deltas_of(h.get("deltas"))
        rows = h.get("state_rows")
        return cls(base, deltas, int(rows) if rows is not None else base.rows)

    def handle_fields(self) -> dict[str, Any]:
        """The flat fields of a handle row / dict (see the module docstring)."""
        return {"uri": self.base.uri, "rows": self.base.rows, "bytes": self.base.bytes,
                "sha256": self.base.sha256,
                "deltas": json.dumps([f.to_dict() for f in self.deltas]) if self.deltas else None,
                "state_rows": self.rows}
