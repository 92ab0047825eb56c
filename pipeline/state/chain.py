"""State chain: what one subtask's snapshot of one state table is made of.

A snapshot is a *materialised base* (a Parquet file holding every row, with the ``_kg`` column) followed by
zero or more *delta* files (changelogs, :mod:`pipeline.state.changelog`), oldest first. A checkpoint's state
handle names the whole chain, so it references files written by earlier checkpoints (incremental
checkpoints, Flink's shared state). Restore reads the base, applies the deltas; every file is verified by size
and SHA-256.

A :class:`~pipeline.checkpoint.handles.StateHandle` names a chain: ``file`` is the base, ``deltas`` the delta
files, ``state_rows`` the rows of the state the chain represents (:meth:`StateChain.of`, :meth:`StateChain.handle`).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from pipeline.checkpoint.handles import FileHandle, StateHandle

__all__ = ["StateChain"]


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

    def extended(self, delta: FileHandle, rows: int) -> StateChain:
        return StateChain(self.base, (*self.deltas, delta), rows)

    @classmethod
    def of(cls, handle: StateHandle) -> StateChain | None:
        """The chain of a state handle (None: the state was empty)."""
        if handle.file is None:
            return None
        return cls(handle.file, handle.deltas, handle.rows)

    def handle(self, operator_uid: str, subtask: int, name: str, kg_start: int, kg_end: int, *,
               persisted_bytes: int | None = None) -> StateHandle:
        """The state handle of subtask ``subtask``'s snapshot of state ``name`` that this chain is."""
        return StateHandle(operator_uid=operator_uid, subtask=subtask, kg_start=kg_start, kg_end=kg_end, name=name,
                           file=self.base, deltas=self.deltas, state_rows=self.rows, persisted_bytes=persisted_bytes)
