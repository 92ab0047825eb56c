"""A FileIO wrapper that fails chosen operations (a test double shipped with the package).

``FaultyFileIO(inner, fail=lambda op, uri: ...)`` forwards every call to ``inner`` except those for which
``fail(op, uri)`` is true: they raise :class:`~pipeline.exceptions.StorageError` naming the URI, as a
lost S3 request would. ``op`` is the method name (``write_bytes``, ``read_bytes``, ``list``, ``delete``...).
``lose_answer=True`` performs the write first and then raises (the PUT landed, its answer was lost).
For real HTTP faults in front of S3 see :mod:`pipeline.testing.s3_faults`.
"""
from __future__ import annotations

from typing import Any, Callable

from pipeline.exceptions import StorageError

__all__ = ["FaultyFileIO"]


class FaultyFileIO:
    def __init__(self, inner: Any, fail: Callable[[str, str], bool], *, lose_answer: bool = False) -> None:
        self.inner = inner
        self.fail = fail
        self.lose_answer = lose_answer
        self.injected: list[tuple[str, str]] = []

    def __getattr__(self, op: str) -> Any:
        target = getattr(self.inner, op)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            uri = str(args[0]) if args else str(kwargs.get("uri", kwargs.get("prefix_uri", "")))
            if self.fail(op, uri):
                self.injected.append((op, uri))
                if self.lose_answer and op == "write_bytes":
                    target(*args, **kwargs)
                raise StorageError(f"injected fault: {op} {uri}")
            return target(*args, **kwargs)
        return call
