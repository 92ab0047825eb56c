"""Test doubles that ship with Epochal (bytewax ``testing.py`` style): use them in your own job's tests.

* :class:`FakeClock` - a clock tests move by hand; both a :class:`~pipeline.clock.Clock` (``now_us()``) and the
  seconds callable the checkpoint coordinator takes (``clock()``); ``advance(seconds)``.
* :class:`FlakyFileIO` - wraps any FileIO and fails chosen operations with a
  :class:`~pipeline.exceptions.StorageError` naming the URI: writes of objects with a given name
  (``fail_names``, e.g. ``{"_metadata"}``), or the next ``n`` writes (``fail_next_writes(n)``).
"""
from __future__ import annotations

import builtins
from typing import Any

from pipeline.exceptions import StorageError
from pipeline.fileio import FileInfo, FileIO, LocalFileIO

__all__ = ["FakeClock", "FlakyFileIO"]


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
    """A FileIO that fails chosen writes (see module docstring); everything else goes to ``inner``."""

    def __init__(self, inner: FileIO | None = None) -> None:
        self.inner: FileIO = inner if inner is not None else LocalFileIO()
        self.fail_names: set[str] = set()
        self._fail_writes = 0
        self.failures: list[str] = []   # URIs of the operations that failed, in order

    def fail_next_writes(self, n: int = 1) -> None:
        self._fail_writes = n

    def _maybe_fail(self, op: str, uri: str) -> None:
        name = uri.rsplit("/", 1)[-1]
        if name in self.fail_names or self._fail_writes > 0:
            if self._fail_writes > 0:
                self._fail_writes -= 1
            self.failures.append(uri)
            raise StorageError(f"injected failure: {op} {uri}")

    def write_bytes(self, uri: str, data: bytes, *, if_none_match: bool = False) -> None:
        self._maybe_fail("write", uri)
        self.inner.write_bytes(uri, data, if_none_match=if_none_match)

    def open_output(self, uri: str) -> Any:
        self._maybe_fail("write", uri)
        return self.inner.open_output(uri)

    def read_bytes(self, uri: str) -> bytes:
        return self.inner.read_bytes(uri)

    def exists(self, uri: str) -> bool:
        return self.inner.exists(uri)

    def size(self, uri: str) -> int:
        return self.inner.size(uri)

    def list(self, prefix_uri: str, *, recursive: bool = True,
             start_after: str | None = None) -> builtins.list[FileInfo]:
        return self.inner.list(prefix_uri, recursive=recursive, start_after=start_after)

    def list_dirs(self, prefix_uri: str) -> builtins.list[str]:
        return self.inner.list_dirs(prefix_uri)

    def delete(self, uri: str) -> None:
        self.inner.delete(uri)

    def delete_prefix(self, prefix_uri: str) -> int:
        return self.inner.delete_prefix(prefix_uri)

    def open_input(self, uri: str) -> Any:
        return self.inner.open_input(uri)

    def pyarrow_fs(self, uri: str | None = None) -> Any:
        return self.inner.pyarrow_fs(uri)

    def __repr__(self) -> str:
        return f"FlakyFileIO({self.inner!r}, fail_names={sorted(self.fail_names)})"
