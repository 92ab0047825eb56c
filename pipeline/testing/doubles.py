"""Test doubles that ship with Epochal (bytewax ``testing.py`` style): use them in your own job's tests.

* :class:`FakeClock` - a clock tests move by hand; both a :class:`~pipeline.clock.Clock` (``now_us()``) and the
  seconds callable the checkpoint coordinator takes (``clock()``); ``advance(seconds)``.
* :class:`FlakyFileIO` - wraps any FileIO and fails chosen operations with a
  :class:`~pipeline.exceptions.StorageError` naming the URI, as a lost S3 request would: any operation for which
  a predicate ``fail(op, uri)`` holds, writes of objects with a given name (``fail_names``, e.g.
  ``{"_metadata"}``), or the next ``n`` writes (``fail_next_writes(n)``). ``lose_answer=True`` performs a failing
  write first (the PUT landed, its answer was lost). For real HTTP faults in front of S3 see
  :mod:`pipeline.testing.s3_faults`.
* :class:`FailingSink` - the sink refuses to commit checkpoint n's output after its ``_metadata`` is written
  (the window two-phase commit exists for); :class:`AbortingSource` - reading the sources aborts at the n-th
  round. Both raise :class:`~pipeline.exceptions.InjectedFailure` through :mod:`pipeline.faults`
  (``EPOCHAL_FAIL_AT``), in this process (``with double.active(): ...``) or in a child job process
  (``env=double.env()``, :mod:`pipeline.testing.jobproc`). The next run must recover exactly-once.
"""
from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pipeline.exceptions import StorageError
from pipeline.faults import FAIL_ENV, FAULT_POINTS, reset_fault_counts
from pipeline.fileio import FileIO, LocalFileIO

__all__ = ["FakeClock", "FlakyFileIO", "FailingSink", "AbortingSource"]

_WRITES = ("write_bytes", "open_output")


class FakeClock:
    """A hand-moved clock in seconds since the Unix epoch (see module docstring)."""

    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = float(t)

    def __call__(self) -> float:
        return self.t

    def now_us(self) -> int:
        return int(round(self.t * 1_000_000))

    def advance(self, seconds: float) -> float:
        self.t += seconds
        return self.t


class FlakyFileIO:
    """A FileIO that fails chosen operations (see module docstring); everything else goes to ``inner``.

    ``fail(op, uri)``: ``op`` is the FileIO method name (``write_bytes``, ``read_bytes``, ``list``, ``delete``...).
    ``failures`` lists ``(op, uri)`` of every injected failure, in order."""

    def __init__(self, inner: FileIO | None = None, fail: Callable[[str, str], bool] | None = None, *,
                 lose_answer: bool = False) -> None:
        self.inner: FileIO = inner if inner is not None else LocalFileIO()
        self.fail = fail
        self.lose_answer = lose_answer
        self.fail_names: set[str] = set()
        self._fail_writes = 0
        self.failures: builtins.list[tuple[str, str]] = []

    def fail_next_writes(self, n: int = 1) -> None:
        self._fail_writes = n

    def _should_fail(self, op: str, uri: str) -> bool:
        if self.fail is not None and self.fail(op, uri):
            return True
        if op in _WRITES and (uri.rsplit("/", 1)[-1] in self.fail_names or self._fail_writes > 0):
            if self._fail_writes > 0:
                self._fail_writes -= 1
            return True
        return False

    def __getattr__(self, op: str) -> Any:
        target = getattr(self.inner, op)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            uri = str(args[0]) if args else str(kwargs.get("uri", kwargs.get("prefix_uri", "")))
            if self._should_fail(op, uri):
                self.failures.append((op, uri))
                if self.lose_answer and op == "write_bytes":
                    target(*args, **kwargs)
                raise StorageError(f"injected failure: {op} {uri}")
            return target(*args, **kwargs)
        return call

    def __repr__(self) -> str:
        return f"FlakyFileIO({self.inner!r}, fail_names={sorted(self.fail_names)})"


@dataclass(frozen=True, slots=True)
class _InjectedFailureDouble:
    point: str
    hit: int = 1

    def __post_init__(self) -> None:
        if self.point not in FAULT_POINTS:
            raise ValueError(f"unknown fault point {self.point!r} (have {FAULT_POINTS})")
        if self.hit < 1:
            raise ValueError(f"hit must be >= 1, got {self.hit}")

    def env(self) -> dict[str, str]:
        """The environment of a child job process (:func:`pipeline.testing.jobproc.run_job_process`)."""
        return {FAIL_ENV: f"{self.point}:{self.hit}"}

    @contextmanager
    def active(self) -> Iterator[None]:
        """In this process: the ``hit``-th time the point is reached from now raises InjectedFailure."""
        old = os.environ.get(FAIL_ENV)
        os.environ[FAIL_ENV] = self.env()[FAIL_ENV]
        reset_fault_counts()
        try:
            yield
        finally:
            if old is None:
                os.environ.pop(FAIL_ENV, None)
            else:
                os.environ[FAIL_ENV] = old
            reset_fault_counts()


@dataclass(frozen=True, slots=True)
class FailingSink(_InjectedFailureDouble):
    """The sink commit of the ``hit``-th checkpoint fails after its ``_metadata`` is written.

    ``point="after_commit_log_before_table_commit"`` fails an Iceberg/Delta sink between Epochal's commit log
    entry and the open table's commit instead."""

    point: str = "after_metadata_before_commit"


@dataclass(frozen=True, slots=True)
class AbortingSource(_InjectedFailureDouble):
    """Reading the sources aborts in the ``hit``-th round (planned on the driver; the checkpoint is aborted)."""

    point: str = "reading"
