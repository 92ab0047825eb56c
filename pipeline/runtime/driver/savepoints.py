"""Savepoint targets: containment and clean failure.

A savepoint is user-owned, but Epochal writes it, so where it may write is configuration, not a
command-line whim. ``PIPELINE_SAVEPOINT_PREFIXES`` is a comma-separated list of ``file://`` / ``s3://``
URI prefixes a ``--target`` must lie under; empty (the default) allows only the job's own savepoints
directory ``<checkpoint root>/<job>/savepoints/``. Targets are normalised first (``..`` segments of a
``file://`` path are resolved; an ``s3://`` key with ``.``/``..`` segments is refused), so
``file:///<root>/../../elsewhere`` and ``s3://other-bucket/x`` are refused unless configured. A ``file://``
target is also checked after resolving symlinks (of the target and of the prefixes): a symlink inside an allowed
prefix that points outside it is refused like the path it points to. The check runs before any side effect: no checkpoint id is claimed, nothing is written, nothing pending is aborted.

A savepoint that fails after its trigger is aborted at once (:func:`abort_pending`): only the files it
wrote are deleted (see :class:`~pipeline.checkpoint.pending.PendingCheckpoint`), never what the target
held before.
"""
from __future__ import annotations

import os
import posixpath
from urllib.parse import unquote, urlsplit

from pipeline.checkpoint.failure import CheckpointFailureReason
from pipeline.exceptions import ConfigError, EpochalError
from pipeline.layout import JobLayout

__all__ = ["allowed_prefixes", "check_target", "abort_pending"]


def _normalise(uri: str, what: str) -> str:
    """Canonical form of a file:// or s3:// directory URI (no trailing slash)."""
    uri = str(uri).strip()
    parts = urlsplit(uri)
    if parts.scheme == "file":
        path = unquote(parts.path)
        if parts.netloc not in ("", "localhost") or not path.startswith("/"):
            raise ConfigError(f"{what} {uri!r}: a file:// URI needs an absolute path (file:///abs/dir)")
        return "file://" + posixpath.normpath(path).rstrip("/")
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ConfigError(f"{what} {uri!r}: an s3:// URI needs a bucket (s3://bucket/prefix)")
        segs = [s for s in parts.path.split("/") if s]
        if any(s in (".", "..") for s in segs):
            raise ConfigError(f"{what} {uri!r}: '.' and '..' are not allowed in an s3:// key")
        return "s3://" + "/".join([parts.netloc, *segs])
    raise ConfigError(f"{what} {uri!r}: must be a file:// or s3:// URI")


def allowed_prefixes(config, job: str) -> list[str]:
    """The configured savepoint prefixes, or ``<checkpoint root>/<job>/savepoints`` by default."""
    raw = [p for p in (s.strip() for s in (config.savepoint_prefixes or "").split(",")) if p]
    if not raw:
        raw = [JobLayout.of(config.checkpoint_uri, job).savepoints()]
    return [_normalise(p, "PIPELINE_SAVEPOINT_PREFIXES entry") for p in raw]


def check_target(target: str, config, job: str) -> str:
    """The normalised ``target`` if it lies under an allowed prefix; ConfigError (exit 2) otherwise."""
    norm = _normalise(target, "savepoint target")
    if norm.split(":", 1)[0] != str(config.checkpoint_uri).split(":", 1)[0]:
        raise ConfigError(f"savepoint target {target!r}: must be on the same storage ({config.checkpoint_uri.split(':')[0]}://)"
                          f" as the checkpoint root {config.checkpoint_uri}")
    prefixes = allowed_prefixes(config, job)
    for p in prefixes:
        if norm == p or norm.startswith(p + "/"):
            if norm == p:
                raise ConfigError(f"savepoint target {target!r} is the savepoint prefix itself; "
                                  f"choose a sub-directory of {p}")
            _check_resolved(target, norm, prefixes)
            return norm
    raise ConfigError(f"savepoint target {target!r} (normalised {norm}) is outside the allowed savepoint "
                      f"prefixes {prefixes}; set PIPELINE_SAVEPOINT_PREFIXES to allow it")


def _resolved(uri: str) -> str:
    """A file:// URI with every symlink of its existing part resolved (the rest kept as it is)."""
    return "file://" + os.path.realpath(uri[len("file://"):]).rstrip("/")


def _check_resolved(target: str, norm: str, prefixes: list[str]) -> None:
    """A file:// target whose real path (symlinks resolved) is not under a prefix's real path is refused: a
    symlink inside an allowed prefix must not carry the savepoint outside it."""
    if not norm.startswith("file://"):
        return  # s3:// has no symlinks
    real = _resolved(norm)
    for p in prefixes:
        if p.startswith("file://"):
            rp = _resolved(p)
            if real.startswith(rp + "/"):
                return
    raise ConfigError(f"savepoint target {target!r} resolves (following symlinks) to {real}, outside the allowed "
                      f"savepoint prefixes {prefixes}; set PIPELINE_SAVEPOINT_PREFIXES to allow it")


def abort_pending(coordinator, cause: BaseException) -> None:
    """Abort every checkpoint/savepoint this coordinator still holds pending after a failure (deleting only
    what each wrote); errors while aborting are not allowed to hide ``cause``."""
    for p in coordinator.pending_checkpoints:
        try:
            coordinator.abort(p, CheckpointFailureReason.CHECKPOINT_DECLINED, cause=cause)
        except EpochalError:
            pass
