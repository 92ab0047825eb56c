"""TwoPhaseCommitSink: Flink's ``TwoPhaseCommitSinkFunction`` over a :class:`CommittedTable`.

    begin_transaction(n)   -> staging prefix ``data/txn-<n>/`` (tasks write ``part-<subtask>.parquet`` there)
    pre_commit(txn, files) -> files are final; their handles go into checkpoint n's ``_metadata``
    commit(txn)            -> after ``_metadata`` of n exists: write the commit entry (visible to readers)
    abort(txn)             -> delete the staged files
    recover_and_commit(md) -> on restore from checkpoint n: commit n's sink section again (idempotent:
                              an existing identical entry is DUPLICATE, not an error)

``notify_checkpoint_complete(n)`` commits every pre-committed transaction with id <= n, oldest first,
like Flink. Commit entries carry the checkpoint's ``parent_id``, which is what makes readers ignore
output of losing or rewound branches (see :mod:`pipeline.sink.table`).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from pipeline.checkpoint.ack import AckResult
from pipeline.checkpoint.handles import FileHandle
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.exceptions import ObjectNotFoundError, SinkError, StorageError, TransactionStateError
from pipeline.sink.table import SINK_MODES, CommitEntry, CommittedTable
from pipeline.sink.transaction import SinkTransaction, TransactionState

__all__ = ["TwoPhaseCommitSink"]

log = logging.getLogger(__name__)


class TwoPhaseCommitSink:
    """Exactly-once sink for one table (append or upsert by ``key``)."""

    def __init__(self, table: CommittedTable, *, mode: str = "append", key: Sequence[str] = ()) -> None:
        if mode not in SINK_MODES:
            raise ValueError(f"table {table.table}: sink mode must be one of {SINK_MODES}, got {mode!r}")
        if mode == "upsert" and not key:
            raise ValueError(f"table {table.table}: an upsert sink needs a key")
        self.table = table
        self.mode = mode
        self.key = tuple(key)
        self._txns: dict[int, SinkTransaction] = {}

    @property
    def name(self) -> str:
        return self.table.table

    def transaction(self, checkpoint_id: int) -> SinkTransaction | None:
        return self._txns.get(checkpoint_id)

    @property
    def transactions(self) -> list[SinkTransaction]:
        return [self._txns[i] for i in sorted(self._txns)]

    # -- phase 0/1 ---------------------------------------------------------------------------------
    def begin_transaction(self, checkpoint_id: int, parent_id: int | None = None) -> SinkTransaction:
        """Open the transaction of checkpoint ``checkpoint_id``; tasks stage into ``txn.staging_uri``."""
        existing = self._txns.get(checkpoint_id)
        if existing is not None:
            raise TransactionStateError(
                f"sink transaction {existing.txn_id} was already begun (state {existing.state.name})")
        txn = SinkTransaction(self.name, checkpoint_id, self.table.staging_uri(checkpoint_id), parent_id=parent_id)
        self._txns[checkpoint_id] = txn
        return txn

    def pre_commit(self, txn: SinkTransaction, files: Iterable[FileHandle] = (), *, full: bool = False,
                   verify: bool = False) -> None:
        """Phase 1: the staged files are final (``verify``: check that each exists with its size)."""
        files = list(files)
        if verify:
            self._check_files(files, f"transaction {txn.txn_id}")
        txn.pre_commit(files, full=full)

    # -- phase 2 -----------------------------------------------------------------------------------
    def commit(self, txn: SinkTransaction) -> AckResult:
        """Phase 2: write the commit entry (SUCCESS, or DUPLICATE if it was already committed)."""
        if txn.state is not TransactionState.PRE_COMMITTED:
            raise TransactionStateError(
                f"sink transaction {txn.txn_id}: cannot commit in state {txn.state.name} (pre-commit first)")
        entry = CommitEntry(table=self.name, checkpoint_id=txn.checkpoint_id, parent_id=txn.parent_id,
                            files=txn.files, full=txn.full, mode=self.mode, key=self.key)
        result = self.table.commit(entry)
        txn.commit()
        self._remove_other_attempts(entry)
        return result

    def _remove_other_attempts(self, entry: CommitEntry) -> None:
        """Files of task attempts Spark did not keep (a failed attempt before its retry, the losing speculative
        copy) sit beside the committed ones in ``txn-<n>/`` and nothing references them: removed once n is
        committed (issue 34, item 5). Garbage only: a failure is logged, the commit stands."""
        try:
            self.table.remove_other_attempts(entry)
        except StorageError as e:
            log.warning("table %s: could not remove the files of other task attempts of checkpoint %d: %s",
                        self.name, entry.checkpoint_id, e)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> dict[int, AckResult]:
        """Commit every pre-committed transaction with id <= ``checkpoint_id``, oldest first."""
        results = {}
        for txn in self.transactions:
            if txn.checkpoint_id <= checkpoint_id and txn.state is TransactionState.PRE_COMMITTED:
                results[txn.checkpoint_id] = self.commit(txn)
        return results

    def abort(self, txn: SinkTransaction) -> int:
        """Abort: delete the staged files; returns how many were deleted."""
        if txn.state.is_terminal:
            raise TransactionStateError(f"sink transaction {txn.txn_id}: cannot abort in state {txn.state.name}")
        if self.table.entry(txn.checkpoint_id) is not None:
            raise TransactionStateError(
                f"sink transaction {txn.txn_id}: cannot abort, checkpoint {txn.checkpoint_id} is already "
                f"committed in {self.table.commit_uri(txn.checkpoint_id)}")
        n = self.table.fileio.delete_prefix(txn.staging_uri)
        txn.abort()
        log.info("aborted sink transaction %s (%d staged files deleted)", txn.txn_id, n)
        return n

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        txn = self._txns.get(checkpoint_id)
        if txn is not None and not txn.state.is_terminal:
            self.abort(txn)

    # -- recovery ----------------------------------------------------------------------------------
    def _check_files(self, files: Iterable[FileHandle], what: str) -> None:
        for f in files:
            try:
                size = self.table.fileio.size(f.uri)
            except ObjectNotFoundError as e:
                raise SinkError(f"table {self.name}: {what}: staged file {f.uri} is missing") from e
            except StorageError as e:
                raise SinkError(f"table {self.name}: {what}: staged file {f.uri} is unreadable: {e}") from e
            if size != f.bytes:
                raise SinkError(f"table {self.name}: {what}: staged file {f.uri} has {size} bytes, "
                                f"expected {f.bytes}")

    def recover_and_commit(self, metadata: CheckpointMetadata, *, restoring: bool = True) -> AckResult | None:
        """Commit the sink section of a restored checkpoint again (idempotent).

        Returns SUCCESS (it had not been committed: crash between ``_metadata`` and commit), DUPLICATE
        (already committed), or None if the checkpoint has no section for this table.
        """
        handle = metadata.sinks.get(self.name)
        if handle is None:
            return None
        what = f"recovering checkpoint {metadata.checkpoint_id} of job '{metadata.job}'"
        entry = CommitEntry(table=self.name, checkpoint_id=metadata.checkpoint_id, parent_id=metadata.parent_id,
                            files=handle.files, full=handle.full, mode=self.mode, key=self.key,
                            savepoint=metadata.is_savepoint)
        existing = self.table.entry(metadata.checkpoint_id)
        if existing is None:
            self._check_files(handle.files, what)
        result = self.table.commit(entry)
        txn = self._txns.get(metadata.checkpoint_id)
        if txn is not None and txn.state is TransactionState.PRE_COMMITTED:
            txn.commit()
        self._remove_other_attempts(entry)
        if result is AckResult.SUCCESS:
            if restoring:  # only a restore re-commits; the normal path is notifyCheckpointComplete
                log.info("table %s: re-committed checkpoint %d on restore", self.name, metadata.checkpoint_id)
            else:
                log.info("table %s: committed checkpoint %d", self.name, metadata.checkpoint_id)
        return result

    def cleanup(self, *, protect: Iterable[int] = (), protect_from_id: int | None = None) -> int:
        """Delete staged output no commit references (see ``CommittedTable.garbage``), sparing open txns."""
        open_ids = {t.checkpoint_id for t in self._txns.values() if not t.state.is_terminal}
        return self.table.cleanup(protect=set(protect) | open_ids, protect_from_id=protect_from_id)
