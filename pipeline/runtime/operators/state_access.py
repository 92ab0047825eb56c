"""The state-access port of a keyed operator task: one subtask's keyed state for one round.

A keyed operator task (join, aggregate, deduplicate, window, process) has one code path whatever ``PIPELINE_STATE_BACKEND`` says:

1. :func:`open_state` ``(scope, fileio)`` opens the subtask's state of the round (:class:`StateScope`: operator, subtask,
   key-group range, the parent checkpoint's state handles, the round's snapshot options and TTL cutoff);
2. :meth:`StateAccess.read` with the round's input rows gives, per state name, the held rows the kernel needs:
   every row of the key-group range (heap, :mod:`pipeline.runtime.operators.heap_state`), or only the rows of the round's
   keys plus the keys with rows expiring below the cutoff (rocksdb, :mod:`pipeline.runtime.operators.keyed_stores`; the
   kernels are keyed, so both give the same output and the same new state of those keys);
3. :meth:`StateAccess.write` per state name with the kernel's new rows (of those keys) snapshots it: the change is
   written to the store (rocksdb) and a base or a changelog delta on the parent's chain, and the typed
   :class:`~pipeline.checkpoint.handles.StateHandle` the task reports comes back;
4. closing (the context manager) releases the stores.

The port is a guarded state machine (after quix-streams' ``PartitionTransaction``): read once, then write each
state at most once, nothing after close. Backends register by name (:func:`register_backend`, as pyiceberg's
FileIO schemes); the built-in ones register when their modules are imported (the operator tasks import them).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

import pyarrow as pa

from pipeline.checkpoint.handles import StateHandle
from pipeline.exceptions import ConfigError
from pipeline.keygroups import KeyGroupRange
from pipeline.state.changelog import TouchedKeys

__all__ = ["StateSpec", "StateScope", "StateAccess", "AccessStatus", "AccessGuard", "backend_of", "open_state",
           "register_backend"]


def backend_of(snapshot: Mapping | None) -> str:
    """The backend the round's snapshot options (the ``snapshot`` round field) select (default heap)."""
    return str((snapshot or {}).get("backend") or "heap")


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One named state of an operator: its row schema (with ``_kg``) and the time column its TTL expires by."""

    schema: pa.Schema
    time_column: str | None = None
    index_time: Callable[[Any], Any] | None = None   # rocksdb: what the TTL index files a row's time under


@dataclass(frozen=True, slots=True)
class StateScope:
    """Whose state, which round: everything a backend needs to open one subtask's state."""

    uid: str
    subtask: int
    kgr: KeyGroupRange
    key: str
    checkpoint: str                                   # "chk-7" (for messages)
    state_prefix: str                                 # <chk dir>/rounds/<k>/state/<uid> (legacy / savepoint bases)
    states: Mapping[str, StateSpec]
    parent: Mapping[str, Sequence[StateHandle]] = field(default_factory=dict)  # the parent checkpoint's handles
    snapshot: Mapping | None = None                   # SnapshotOptions.to_params() of the round
    cutoff_us: int | None = None                      # rows with a time below it expire this round

    @property
    def backend(self) -> str:
        return backend_of(self.snapshot)


class StateAccess(Protocol):
    """One subtask's keyed state for one round (see the module docstring)."""

    def read(self, inputs: Sequence[pa.Table]) -> dict[str, pa.Table]:
        """Per state name, the held rows the round's ``inputs`` (rows with the key and ``_kg``) touch."""
        ...

    def write(self, name: str, new: pa.Table, touched: TouchedKeys | None = None, *,
              index_time: Callable[[Any], Any] | None = None) -> StateHandle:
        """State ``name``'s rows of the round's keys are now ``new``: snapshot it; its handle. ``touched``: the
        keys the kernel touched (a heap diff compares only those); ``index_time``: rocksdb files the rows written
        back under it in the TTL index (a window's next firing time)."""
        ...

    def close(self) -> None:
        ...

    def __enter__(self) -> StateAccess:
        ...

    def __exit__(self, *exc: object) -> None:
        ...


class AccessStatus(Enum):
    OPEN = "open"        # opened, nothing read yet
    READ = "read"        # read: states may be written
    CLOSED = "closed"


class AccessGuard:
    """The status of one :class:`StateAccess` and its guard (misuse is a bug in an operator task)."""

    def __init__(self, scope: StateScope) -> None:
        self.scope = scope
        self.status = AccessStatus.OPEN
        self.written: set[str] = set()

    def _fail(self, what: str) -> None:
        s = self.scope
        raise RuntimeError(f"state of {s.uid}[{s.subtask}] ({s.checkpoint}): {what} while {self.status.value}")

    def reading(self) -> None:
        if self.status is not AccessStatus.OPEN:
            self._fail("read")
        self.status = AccessStatus.READ

    def writing(self, name: str) -> None:
        if self.status is not AccessStatus.READ:
            self._fail(f"write of {name!r}")
        if name in self.written or name not in self.scope.states:
            self._fail(f"write of {name!r} (twice, or not one of {sorted(self.scope.states)})")
        self.written.add(name)

    def closing(self) -> bool:
        """Whether this close is the first."""
        first = self.status is not AccessStatus.CLOSED
        self.status = AccessStatus.CLOSED
        return first


_BACKENDS: dict[str, Callable[[StateScope, object], StateAccess]] = {}


def register_backend(name: str, factory: Callable[[StateScope, object], StateAccess]) -> None:
    """Make ``PIPELINE_STATE_BACKEND=<name>`` open its state with ``factory(scope, fileio)``."""
    _BACKENDS[name] = factory


def open_state(scope: StateScope, fileio) -> StateAccess:
    """The state of ``scope`` on the backend the round's snapshot options name (use it as a context manager)."""
    factory = _BACKENDS.get(scope.backend)
    if factory is None:
        raise ConfigError(f"operator {scope.uid} ({scope.checkpoint}): unknown state backend {scope.backend!r} "
                          f"(known: {sorted(_BACKENDS)})")
    return factory(scope, fileio)
