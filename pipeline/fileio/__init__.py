"""The FileIO port: every byte Epochal stores goes through it (pyiceberg ``pyiceberg/io``-style).

A small :class:`FileIO` protocol (:mod:`pipeline.fileio.base`) and three implementations, chosen by URI
scheme through a registry (:func:`file_io_for`, :func:`register_scheme`):

* :class:`LocalFileIO` (:mod:`pipeline.fileio.local`) for ``file:///abs/path``;
* :class:`S3FileIO` (:mod:`pipeline.fileio.s3`) for ``s3://bucket/key`` (AWS S3, MinIO, moto);
* :class:`InMemoryFileIO` (:mod:`pipeline.fileio.memory`) for ``memory://name/key`` (one process; tests).

Semantics shared by all (one contract suite checks them on all three):

* All paths are full URIs. ``list``/``list_dirs``/``delete_prefix`` treat the prefix as a directory
  (``.../chk-1`` never matches ``.../chk-10``).
* ``list`` returns files only, sorted by URI; ``list(prefix, start_after=uri)`` only those whose URI sorts after
  ``uri`` (S3 ``StartAfter``: a listing that costs O(new keys), not O(all keys ever)); ``list_dirs`` returns the names of immediate
  sub-directories that contain at least one file (S3 has no empty directories, so neither do we).
* ``write_bytes(..., if_none_match=True)`` creates or fails with
  :class:`~pipeline.exceptions.ConditionalWriteError` (S3 conditional PUT): the basis of ``_metadata``
  write-once, id claims (fencing), the barrier log and the sink commit log.
* ``delete`` of a missing object is fine. Errors are :mod:`pipeline.exceptions` errors naming the URI.
"""
from __future__ import annotations

from collections.abc import Callable

from pipeline.exceptions import ConfigError
from pipeline.fileio.base import FileInfo, FileIO, join_uri, sha256_of, sha256_of_file
from pipeline.fileio.local import LocalFileIO
from pipeline.fileio.memory import InMemoryFileIO
from pipeline.fileio.s3 import S3FileIO, split_s3_uri

__all__ = [
    "FileInfo", "FileIO", "LocalFileIO", "S3FileIO", "InMemoryFileIO", "file_io_for", "register_scheme",
    "file_io_serving",
    "join_uri", "sha256_of", "sha256_of_file", "split_s3_uri",
]

_LOCAL = LocalFileIO()
_MEMORY = InMemoryFileIO()

#: scheme (lower case, without ``://``) -> factory of the FileIO for a URI of that scheme
_REGISTRY: dict[str, Callable[[str], FileIO]] = {
    "file": lambda uri: _LOCAL,
    "s3": lambda uri: S3FileIO(),  # settings are read from the environment now
    "memory": lambda uri: _MEMORY,
}
_REFUSED = {"s3a": "use s3:// URIs, not s3a:// (Hadoop S3A is not available)",
            "s3n": "use s3:// URIs, not s3n:// (Hadoop S3A is not available)"}


def register_scheme(scheme: str, factory: Callable[[str], FileIO]) -> None:
    """Make :func:`file_io_for` return ``factory(uri)`` for URIs of ``scheme`` (e.g. a test double)."""
    _REGISTRY[scheme.lower()] = factory


def file_io_serving(fileio: FileIO | None, uri: str) -> FileIO:
    """``fileio`` when it serves ``uri``'s scheme (or does not say which it serves, as a test double), else the
    FileIO of ``uri``: a lake source's files live in the table's location, not under the source root whose FileIO
    the caller holds."""
    scheme = getattr(fileio, "scheme", None)
    if fileio is not None and (scheme is None or uri.lower().startswith(f"{scheme}://")):
        return fileio
    return file_io_for(uri)


def file_io_for(uri: str) -> FileIO:
    """The FileIO for a URI's scheme (``file://``, ``s3://`` or ``memory://``)."""
    scheme = uri.split(":", 1)[0].lower() if ":" in uri else ""
    if scheme == "file" or (scheme in _REGISTRY and uri[len(scheme):].startswith("://")):
        return _REGISTRY[scheme](uri)
    if scheme in _REFUSED:
        raise ConfigError(f"{_REFUSED[scheme]}: {uri}")
    raise ConfigError(f"unsupported URI (expected file:///abs/path or s3://bucket/prefix): {uri!r}")
