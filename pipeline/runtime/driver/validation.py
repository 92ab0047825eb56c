"""The port through which the runtime asks for data-quality validation, without importing it.

Imports go one way: :mod:`pipeline.quality` sits above the runtime (it restores checkpoints, reads state and runs
the batch evaluation), so the runtime must not import it. Two runtime steps still validate:

* after every completed checkpoint, when ``PIPELINE_VALIDATE_AFTER_EPOCH=true``, the cheap per-epoch subset;
* after ``restore``, the full suites on the restore point (``validate=False`` skips them).

They call a :class:`RecoveryValidator`. The runner takes one as ``JobRunner(..., validator=...)``; without it,
the process default registered with :func:`set_default_validator` is used. ``import pipeline`` (which every
``import pipeline.<anything>`` runs first) registers :class:`pipeline.quality.QualityValidator`, so the Great
Expectations suites are the default everywhere. A runner that needs a validator and finds none raises
:class:`~pipeline.exceptions.ConfigError`: validation is never skipped silently.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from pipeline import settings
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.exceptions import ConfigError

__all__ = ["RecoveryValidator", "ValidationOutcome", "set_default_validator", "default_validator",
           "RESTORE_VALIDATION", "restore_validation"]

# what ``restore`` validates (docs/quality.md "After a restore"): ``full`` every suite, the recovery comparison with the
# batch evaluation over the source prefix included (about one Spark batch over the prefix); ``cheap`` the metadata,
# state and sink suites (the restored files, checksums, lineage, commits, keys: no source read, no batch plan);
# ``none`` nothing (validate separately, e.g. the restore DAG's own validate task)
RESTORE_VALIDATION = ("full", "cheap", "none")
RESTORE_VALIDATE_ENV = "EPOCHAL_RESTORE_VALIDATE"


@runtime_checkable
class ValidationOutcome(Protocol):
    """What the runtime needs of a validation result."""

    @property
    def success(self) -> bool: ...

    def summary(self) -> str: ...


@runtime_checkable
class RecoveryValidator(Protocol):
    def after_epoch(self, runner: Any, metadata: CheckpointMetadata) -> None:
        """The per-epoch subset on the just-completed checkpoint; raises ValidationError when it fails."""

    def after_restore(self, runner: Any, result: Mapping[str, Any]) -> ValidationOutcome:
        """The full suites on the restore point described by ``result`` (the return value of ``restore``);
        raises ValidationError when a suite fails."""


_DEFAULT: RecoveryValidator | None = None


def set_default_validator(validator: RecoveryValidator | None) -> None:
    """Register the process-wide default (``import pipeline`` registers the quality package's)."""
    global _DEFAULT
    _DEFAULT = validator


def default_validator(why: str) -> RecoveryValidator:
    """The registered default; ``why`` names the step that needs it, for the error."""
    if _DEFAULT is None:
        raise ConfigError(f"{why} needs a validator, and none is registered: pass JobRunner(..., validator=...) or "
                          "import pipeline.quality (pipeline.quality.QualityValidator)")
    return _DEFAULT


def restore_validation(value: bool | str | None = None) -> str:
    """The validation level of a restore: ``True``/None -> ``EPOCHAL_RESTORE_VALIDATE`` (default ``full``),
    ``False`` -> ``none``, or one of :data:`RESTORE_VALIDATION`."""
    if value is None or value is True:
        value = (settings.raw(RESTORE_VALIDATE_ENV) or "").strip() or "full"
    elif value is False:
        value = "none"
    level = str(value).strip().lower()
    if level not in RESTORE_VALIDATION:
        raise ConfigError(f"restore validation {value!r}: use one of {', '.join(RESTORE_VALIDATION)} "
                          f"({RESTORE_VALIDATE_ENV} or --validate)")
    return level
