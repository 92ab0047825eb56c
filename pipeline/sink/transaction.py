"""Sink transactions: :class:`TransactionState` and the guarded :class:`SinkTransaction` state machine.

One transaction per (table, checkpoint), as in Flink's ``TwoPhaseCommitSinkFunction``::

    OPEN --pre_commit(files)--> PRE_COMMITTED --commit()--> COMMITTED
      \\                             \\
       `--abort()--> ABORTED          `--abort()--> ABORTED

Any other transition raises :class:`~pipeline.exceptions.TransactionStateError` naming the transaction
and its state. This class only tracks state; :class:`~pipeline.sink.two_phase.TwoPhaseCommitSink`
does the I/O (staging prefix, commit entry, deleting staged files).
"""
from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from pipeline.checkpoint.handles import FileHandle
from pipeline.exceptions import SinkError, TransactionStateError
from pipeline.layout import sink_txn_name

__all__ = ["TransactionState", "SinkTransaction"]


class TransactionState(Enum):
    OPEN = "open"
    PRE_COMMITTED = "pre_committed"
    COMMITTED = "committed"
    ABORTED = "aborted"

    @property
    def is_terminal(self) -> bool:
        return self in (TransactionState.COMMITTED, TransactionState.ABORTED)


_ALLOWED: dict[TransactionState, frozenset[TransactionState]] = {
    TransactionState.OPEN: frozenset({TransactionState.PRE_COMMITTED, TransactionState.ABORTED}),
    TransactionState.PRE_COMMITTED: frozenset({TransactionState.COMMITTED, TransactionState.ABORTED}),
    TransactionState.COMMITTED: frozenset(),
    TransactionState.ABORTED: frozenset(),
}


class SinkTransaction:
    """The output of one checkpoint for one sink table, staged under ``staging_uri``."""

    __slots__ = ("table", "checkpoint_id", "parent_id", "staging_uri", "_state", "_files", "_full")

    def __init__(self, table: str, checkpoint_id: int, staging_uri: str, *, parent_id: int | None = None) -> None:
        self.table = table
        self.checkpoint_id = checkpoint_id
        self.parent_id = parent_id
        self.staging_uri = staging_uri.rstrip("/")
        self._state = TransactionState.OPEN
        self._files: list[FileHandle] = []
        self._full = False

    @property
    def txn_id(self) -> str:
        return f"{self.table}/{sink_txn_name(self.checkpoint_id)}"

    @property
    def state(self) -> TransactionState:
        return self._state

    @property
    def files(self) -> tuple[FileHandle, ...]:
        return tuple(self._files)

    @property
    def full(self) -> bool:
        return self._full

    def __repr__(self) -> str:
        return f"SinkTransaction({self.txn_id}, state={self._state.name}, files={len(self._files)})"

    def _transition(self, target: TransactionState, action: str) -> None:
        if target not in _ALLOWED[self._state]:
            raise TransactionStateError(
                f"sink transaction {self.txn_id}: cannot {action} in state {self._state.name} "
                f"(allowed from {self._state.name}: {sorted(s.name for s in _ALLOWED[self._state]) or 'none'})")
        self._state = target

    def _check_files(self, files: Iterable[FileHandle]) -> list[FileHandle]:
        out = list(files)
        prefix = self.staging_uri + "/"
        for f in out:
            if not f.uri.startswith(prefix):
                raise SinkError(f"sink transaction {self.txn_id}: file {f.uri} is outside its staging "
                                f"prefix {prefix}")
        return out

    def add_files(self, files: Iterable[FileHandle]) -> None:
        """Record staged files while the transaction is OPEN."""
        if self._state is not TransactionState.OPEN:
            raise TransactionStateError(
                f"sink transaction {self.txn_id}: cannot add files in state {self._state.name}")
        self._files.extend(self._check_files(files))

    def pre_commit(self, files: Iterable[FileHandle] = (), *, full: bool = False) -> None:
        """OPEN -> PRE_COMMITTED: the staged files are final (phase 1)."""
        checked = self._check_files(files)
        self._transition(TransactionState.PRE_COMMITTED, "pre-commit")
        self._files.extend(checked)
        self._full = bool(full)

    def commit(self) -> None:
        """PRE_COMMITTED -> COMMITTED (phase 2, after the checkpoint completed)."""
        self._transition(TransactionState.COMMITTED, "commit")

    def abort(self) -> None:
        """OPEN or PRE_COMMITTED -> ABORTED."""
        self._transition(TransactionState.ABORTED, "abort")

    @classmethod
    def recovered(cls, table: str, checkpoint_id: int, staging_uri: str, files: Iterable[FileHandle], *,
                  parent_id: int | None = None, full: bool = False) -> SinkTransaction:
        """A PRE_COMMITTED transaction rebuilt from checkpoint metadata (Flink ``recoverAndCommit``)."""
        txn = cls(table, checkpoint_id, staging_uri, parent_id=parent_id)
        txn.pre_commit(files, full=full)
        return txn
