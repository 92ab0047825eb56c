"""The heap backend of the state-access port (``PIPELINE_STATE_BACKEND=heap``, the default).

The subtask's whole state of its key-group range is restored (:func:`pipeline.state.backend.read_state`: served
warm by the executor when it holds the parent's chains, else read and verified), the kernel runs on all of it,
and each state is snapshotted from the whole new table (:func:`pipeline.state.snapshot.write_state`: a changelog
delta of the touched keys on the parent's chain, or a base).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from pipeline.checkpoint.handles import StateHandle
from pipeline.operators.ttl import ROW_EPOCH
from pipeline.runtime.operators.state_access import AccessGuard, StateScope, register_backend
from pipeline.state.backend import read_state
from pipeline.state.changelog import TouchedKeys
from pipeline.state.snapshot import write_state

__all__ = ["HeapState"]


class HeapState:
    """One subtask's state for one round, held whole in the task (see the module docstring)."""

    def __init__(self, scope: StateScope, fileio) -> None:
        self.scope, self.fileio = scope, fileio
        self.guard = AccessGuard(scope)

    def read(self, inputs: Sequence[pa.Table]) -> dict[str, pa.Table]:
        """Every held row of the key-group range, whatever the inputs (files written before the rows carried their
        own epoch read it as null)."""
        self.guard.reading()
        s = self.scope
        return {name: read_state(self.fileio, s.parent.get(name, ()), s.kgr.start, s.kgr.end, spec.schema,
                                 s.checkpoint, optional=(ROW_EPOCH,) if ROW_EPOCH in spec.schema.names else ())
                for name, spec in s.states.items()}

    def write(self, name: str, new: pa.Table, touched: TouchedKeys | None = None, *,
              index_time: Callable[[Any], Any] | None = None) -> StateHandle:
        """The whole new table of the range (``index_time``: a keyed store's concern, unused here)."""
        self.guard.writing(name)
        s = self.scope
        return write_state(self.fileio, s.state_prefix, name, s.kgr.start, s.kgr.end, new, s.parent.get(name, ()),
                           s.snapshot, s.checkpoint, touched=touched, uid=s.uid, subtask=s.subtask)

    def close(self) -> None:
        self.guard.closing()

    def __enter__(self) -> HeapState:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


register_backend("heap", HeapState)
