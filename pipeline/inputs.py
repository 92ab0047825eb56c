"""Validation of user inputs, done before a command or an Airflow task has any side effect.

A savepoint, a restore or an export must not claim a checkpoint id, write, or abort a running checkpoint
when its input is wrong: the CLI commands and the Airflow tasks call these checks first. Every failure is a
:class:`~pipeline.exceptions.ConfigError` (a user error: CLI exit code 2; in Airflow the task fails once,
without retries) whose message names the offending value.
"""
from __future__ import annotations

from pipeline.exceptions import ConfigError

__all__ = ["check_uri", "check_savepoint_target", "check_snapshot_ref", "check_parallelism"]

_SCHEMES = ("file://", "s3://")


def check_uri(value: str, *, what: str) -> str:
    """A ``file:///abs/path`` or ``s3://bucket/prefix`` URI (stripped, no trailing slash)."""
    v = str(value).strip()
    lower = v.lower()
    if lower.startswith(("s3a://", "s3n://")):
        raise ConfigError(f"{what} {value!r}: use s3:// (Hadoop S3A is not available)")
    if not lower.startswith(_SCHEMES):
        hint = f" (did you mean file://{v}?)" if v.startswith("/") else ""
        raise ConfigError(f"{what} {value!r}: expected a file:///absolute/path or s3://bucket/prefix URI{hint}")
    rest = v.split("://", 1)[1]
    if lower.startswith("file://") and not rest.startswith("/"):
        raise ConfigError(f"{what} {value!r}: a file:// URI needs an absolute path (file:///...)")
    if lower.startswith("s3://") and not rest.split("/", 1)[0]:
        raise ConfigError(f"{what} {value!r}: an s3:// URI needs a bucket (s3://bucket/prefix)")
    if not rest.strip("/"):
        raise ConfigError(f"{what} {value!r}: the URI has no path")
    return v.rstrip("/")


def check_savepoint_target(target: str | None) -> str | None:
    """``--target`` of a savepoint: None/empty (the job's ``savepoints/`` directory) or a URI."""
    if target is None or not str(target).strip():
        return None
    return check_uri(target, what="savepoint target")


def check_snapshot_ref(ref: str | int | None) -> str:
    """``--from`` of a restore (or ``--checkpoint``): a checkpoint id (>= 1) or a savepoint/checkpoint URI."""
    v = str(ref if ref is not None else "").strip()
    if not v:
        raise ConfigError("expected a checkpoint id (e.g. 12) or a savepoint URI (s3://.../savepoints/sp-...)")
    if v.lstrip("-").isdigit():
        if int(v) < 1:
            raise ConfigError(f"checkpoint id {v}: checkpoint ids start at 1")
        return str(int(v))
    return check_uri(v, what="savepoint/checkpoint URI")


def check_parallelism(parallelism: int | str | None) -> int | None:
    """An optional parallelism: None or an integer >= 1."""
    if parallelism is None or (isinstance(parallelism, str) and not parallelism.strip()):
        return None
    try:
        p = int(parallelism)
    except (TypeError, ValueError):
        raise ConfigError(f"parallelism {parallelism!r}: expected an integer >= 1") from None
    if p < 1:
        raise ConfigError(f"parallelism {p}: expected an integer >= 1")
    return p
