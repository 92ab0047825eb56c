"""The one exceptions module of Epochal.

Hierarchy (every error message names the file, partition or checkpoint involved)::

    EpochalError                      base of everything raised on purpose
    ├── ConfigError                   bad configuration or usage -> CLI exit code 2
    │   ├── IncompatibleSinkSchemaError  a job's sink schema does not fit its existing open-format table
    │   └── BootstrapRefusedError     ``bootstrap`` cannot derive a job's state exactly (names the operator)
    ├── StorageError                  FileIO failures
    │   ├── ObjectNotFoundError       the object/file does not exist
    │   └── ConditionalWriteError     a write-once object already exists (If-None-Match failed)
    ├── SourceError                   problems with source logs
    │   ├── MalformedInputError       malformed file/record when bad-records policy is `fail`
    │   │   └── SourceContractError   a late file or a file changed after it was read (policy `fail`)
    │   └── TypeMismatch              a column cannot be cast to the declared type at all (schema mismatch)
    ├── CheckpointError               checkpoint life cycle problems
    │   ├── CheckpointFencedError     another runner owns/committed this checkpoint id (lost race)
    │   ├── CheckpointDeclinedError   a task or the coordinator declined/aborted a pending checkpoint
    │   ├── CorruptCheckpointError    missing file, bad checksum or unreadable metadata
    │   ├── NoValidCheckpointError    checkpoints exist but none can be restored
    │   ├── TooManyFailedCheckpointsError  tolerable-failed-checkpoints exceeded
    │   └── IncompatibleStateError    restored operators do not match the job (names the uids)
    ├── BarrierError                  barrier handler protocol violations
    │   └── CorruptStreamError        repeated barrier on one channel (names channel + checkpoint)
    ├── SinkError                     sink problems
    │   └── TransactionStateError     illegal 2PC transition (names txn + state)
    ├── ValidationError               a Great Expectations suite failed (names checkpoint/table)
    ├── UserFunctionError             a user's ``Stream.process`` function failed or broke its contract
    └── JobStoppedError               the job was stopped with a savepoint (epoch runs are skipped)

    InjectedFailure (RuntimeError)    a test double's crash: deliberately *not* an EpochalError, so nothing
                                      that handles Epochal's errors catches it (it must act like a crash)
"""
from __future__ import annotations

__all__ = [
    "EpochalError", "ConfigError", "IncompatibleSinkSchemaError", "BootstrapRefusedError", "StorageError", "ObjectNotFoundError",
    "ConditionalWriteError", "SourceError", "LakeSourceError", "MalformedInputError", "SourceContractError", "CheckpointError",
    "CheckpointFencedError",
    "CheckpointDeclinedError", "CorruptCheckpointError", "NoValidCheckpointError", "StateStoreError",
    "TooManyFailedCheckpointsError", "IncompatibleStateError", "BarrierError", "CorruptStreamError",
    "SinkError", "TransactionStateError", "ValidationError", "UserFunctionError", "TypeMismatch",
    "JobStoppedError", "InjectedFailure", "AggregateOverflowError",
]


class EpochalError(Exception):
    """Base class of every error Epochal raises on purpose."""

    exit_code = 1


class ConfigError(EpochalError):
    """Bad configuration or command-line usage (CLI exit code 2)."""

    exit_code = 2


class StorageError(EpochalError):
    """A FileIO operation failed."""


class ObjectNotFoundError(StorageError):
    """The object or file does not exist."""


class ConditionalWriteError(StorageError):
    """A write-once object already exists (S3 ``If-None-Match: *`` precondition failed)."""


class SourceError(EpochalError):
    """A problem with a source log."""


class LakeSourceError(SourceError):
    """A lake table read as a source (pipeline/source/lake.py) changed in a way the source cannot follow (a
    delete, overwrite or restore), lost a version a checkpoint needs (log retention, snapshot expiry), or no longer
    matches the declared schema. The message names the table, the version and, where known, the checkpoint."""


class MalformedInputError(SourceError):
    """Malformed file or record while the bad-records policy is ``fail``."""


class SourceContractError(MalformedInputError):
    """A source broke its contract after Epochal read it (a late file with a lower seq than files already
    read, or a file changed after it was read) while the bad-records policy is ``fail``."""


class CheckpointError(EpochalError):
    """A problem in the checkpoint life cycle."""


class CheckpointFencedError(CheckpointError):
    """Another runner of the same job claimed or committed this checkpoint first."""


class CheckpointDeclinedError(CheckpointError):
    """A pending checkpoint was declined or aborted (see its ``reason``)."""

    def __init__(self, message: str, reason: object | None = None) -> None:
        super().__init__(message)
        self.reason = reason


class CorruptCheckpointError(CheckpointError):
    """A checkpoint is unusable: missing file, checksum mismatch, unreadable metadata."""


class StateStoreError(CheckpointError):
    """An executor-local keyed state store (``PIPELINE_STATE_BACKEND=rocksdb``) cannot be opened or is inconsistent."""


class NoValidCheckpointError(CheckpointError):
    """Checkpoints exist but none of them can be restored; never silently start from scratch."""


class TooManyFailedCheckpointsError(CheckpointError):
    """More consecutive checkpoint failures than ``tolerable failed checkpoints``."""


class IncompatibleStateError(CheckpointError):
    """Operator uids of a checkpoint/savepoint do not match the job."""


class BarrierError(EpochalError):
    """Barrier handler protocol violation."""


class CorruptStreamError(BarrierError):
    """A repeated barrier on one channel: the stream is corrupt."""


class SinkError(EpochalError):
    """A sink problem."""


class IncompatibleSinkSchemaError(ConfigError):
    """The job's output schema for a sink is incompatible with its existing Iceberg/Delta table (names both)."""


class BootstrapRefusedError(ConfigError):
    """``epochal bootstrap`` refuses a job whose state or output the batch plan cannot derive exactly
    (a ``process`` user function, window state, a changelog sink, ...); the message names the operator/table."""


class TransactionStateError(SinkError):
    """An illegal two-phase-commit transition."""


class ValidationError(EpochalError):
    """A data-quality suite failed."""


class UserFunctionError(EpochalError):
    """A user-supplied function (``Stream.process``'s ``fn``) raised or returned rows breaking its contract
    (names the operator uid)."""


class AggregateOverflowError(EpochalError):
    """A running aggregate left its type's range (an int64 ``sum``); names the operator, column and key.
    Never wrapped around silently."""


class TypeMismatch(SourceError):
    """A column's type cannot be cast to the declared type at all (schema mismatch)."""


class JobStoppedError(EpochalError):
    """The job was stopped with a savepoint; epoch runs are skipped until it is restored."""


class InjectedFailure(RuntimeError):
    """A test double's injected failure (:mod:`pipeline.faults` ``EPOCHAL_FAIL_AT``,
    :func:`pipeline.orchestration.tasks.maybe_inject_failure`)."""
