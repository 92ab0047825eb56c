"""The FileIO port: the protocol every storage implementation satisfies, and helpers shared by them."""
from __future__ import annotations

import builtins
import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow
    import pyarrow.fs

__all__ = ["FileInfo", "FileIO", "join_uri", "sha256_of", "sha256_of_file"]

TMP_MARK = ".epochal-tmp-"
CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class FileInfo:
    """A stored file: its full URI and size in bytes."""

    uri: str
    size: int


@runtime_checkable
class FileIO(Protocol):
    """The storage port. Every path is a full URI (``file://...`` or ``s3://...``)."""

    def read_bytes(self, uri: str) -> bytes: ...

    def write_bytes(self, uri: str, data: bytes, *, if_none_match: bool = False) -> None: ...

    def exists(self, uri: str) -> bool: ...

    def size(self, uri: str) -> int: ...

    def list(self, prefix_uri: str, *, recursive: bool = True,
             start_after: str | None = None) -> list[FileInfo]: ...

    def list_dirs(self, prefix_uri: str) -> builtins.list[str]: ...

    def delete(self, uri: str) -> None: ...

    def delete_prefix(self, prefix_uri: str) -> int: ...

    def open_input(self, uri: str) -> pyarrow.NativeFile: ...

    def open_output(self, uri: str) -> pyarrow.NativeFile: ...

    def pyarrow_fs(self, uri: str | None = None) -> tuple[pyarrow.fs.FileSystem, str]: ...


def join_uri(root: str, *parts: str) -> str:
    """Join URI path segments with single slashes: ``join_uri("s3://b/p/", "job", "a/b")``."""
    out = root.rstrip("/")
    if not out or out.endswith(":"):  # "file:///", "s3://", "/"
        out = root
    for part in parts:
        p = str(part).strip("/")
        if p:
            out = f"{out}{p}" if out.endswith("/") else f"{out}/{p}"
    return out


def sha256_of(data: bytes) -> str:
    """Hex SHA-256 of ``data`` (the checksum recorded in file handles)."""
    return hashlib.sha256(data).hexdigest()


def dir_prefix(prefix_uri: str) -> str:
    return prefix_uri.rstrip("/") + "/"


def is_tmp(name: str) -> bool:
    return TMP_MARK in name



def sha256_of_file(fileio: FileIO, uri: str) -> tuple[int, str]:
    """``(size, hex sha256)`` of a stored file, streamed in chunks (never fully in memory)."""
    h = hashlib.sha256()
    size = 0
    with fileio.open_input(uri) as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                break
            size += len(chunk)
            h.update(chunk)
    return size, h.hexdigest()
