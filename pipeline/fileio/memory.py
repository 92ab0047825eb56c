"""InMemoryFileIO: ``memory://name/key`` URIs held in the current process (tests, examples).

The same semantics as the local and S3 implementations (create-only writes, directory-like prefixes,
sorted listings, ``open_output`` visible only on close), checked by the same contract suite. The objects
live in a process-wide dictionary, so Spark tasks in other processes cannot see them: use it for driver-side
code and unit tests, not for a job's data plane.
"""
from __future__ import annotations

import builtins
import threading
from typing import TYPE_CHECKING, Any

from pipeline.exceptions import ConditionalWriteError, ObjectNotFoundError, StorageError
from pipeline.fileio.base import FileInfo, dir_prefix

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow
    import pyarrow.fs

__all__ = ["InMemoryFileIO"]

SCHEME = "memory://"


class _Output:
    """A writable stream that publishes its bytes under ``uri`` when closed."""

    def __init__(self, store: InMemoryFileIO, uri: str) -> None:
        import pyarrow as pa

        self._store, self._uri = store, uri
        self._buf = pa.BufferOutputStream()
        self.closed = False

    def write(self, data: Any) -> int:
        return self._buf.write(data)

    def flush(self) -> None:
        pass

    def tell(self) -> int:
        return self._buf.tell()

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._store.write_bytes(self._uri, self._buf.getvalue().to_pybytes())

    def __enter__(self) -> _Output:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _arrow_handler_base() -> type:
    import pyarrow.fs as pafs

    return pafs.FileSystemHandler


class _ArrowHandler(_arrow_handler_base()):  # type: ignore[misc]
    """Read access for pyarrow (``pq.read_table(path, filesystem=fs)``); writes go through the FileIO."""

    def __init__(self, store: InMemoryFileIO) -> None:
        self.store = store

    def get_type_name(self) -> str:
        return "epochal-memory"

    def normalize_path(self, path: str) -> str:
        return path

    def equals(self, other: Any) -> bool:
        return isinstance(other, _ArrowHandler) and other.store is self.store

    def _info(self, path: str) -> Any:
        import pyarrow.fs as pafs

        uri = SCHEME + path
        if self.store.exists(uri):
            return pafs.FileInfo(path, pafs.FileType.File, size=self.store.size(uri))
        if self.store.list(uri):
            return pafs.FileInfo(path, pafs.FileType.Directory)
        return pafs.FileInfo(path, pafs.FileType.NotFound)

    def get_file_info(self, paths: list[str]) -> list[Any]:
        return [self._info(p) for p in paths]

    def get_file_info_selector(self, selector: Any) -> list[Any]:
        import pyarrow.fs as pafs

        base = selector.base_dir.rstrip("/")
        files = self.store.list(SCHEME + base, recursive=selector.recursive)
        return [pafs.FileInfo(f.uri[len(SCHEME):], pafs.FileType.File, size=f.size) for f in files]

    def open_input_stream(self, path: str) -> Any:
        return self.store.open_input(SCHEME + path)

    open_input_file = open_input_stream

    def open_output_stream(self, path: str, metadata: Any = None) -> Any:
        import pyarrow as pa

        return pa.PythonFile(self.store.open_output(SCHEME + path), mode="w")

    def _read_only(self, *args: Any, **kwargs: Any) -> None:
        raise StorageError("memory:// through pyarrow is read-only here: write through the FileIO")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = _read_only
    delete_file = move = copy_file = open_append_stream = _read_only


class InMemoryFileIO:
    """FileIO for ``memory://`` URIs (see module docstring). Instances share one store unless given their own."""

    scheme = "memory"  # the URIs it serves: memory://

    _shared: dict[str, bytes] = {}
    _shared_lock = threading.Lock()

    def __init__(self, *, objects: dict[str, bytes] | None = None) -> None:
        self._objects = self._shared if objects is None else objects
        self._lock = self._shared_lock if objects is None else threading.Lock()

    @staticmethod
    def _check(uri: str) -> str:
        if not uri.startswith(SCHEME) or len(uri) <= len(SCHEME):
            raise StorageError(f"not a memory:// URI: {uri!r}")
        return uri

    def read_bytes(self, uri: str) -> bytes:
        try:
            return self._objects[self._check(uri)]
        except KeyError:
            raise ObjectNotFoundError(f"{uri} does not exist") from None

    def write_bytes(self, uri: str, data: bytes, *, if_none_match: bool = False) -> None:
        self._check(uri)
        with self._lock:
            if if_none_match and uri in self._objects:
                raise ConditionalWriteError(f"{uri} already exists (create-only write)")
            self._objects[uri] = bytes(data)

    def exists(self, uri: str) -> bool:
        return self._check(uri) in self._objects

    def size(self, uri: str) -> int:
        return len(self.read_bytes(uri))

    def list(self, prefix_uri: str, *, recursive: bool = True, start_after: str | None = None) -> list[FileInfo]:
        pre = dir_prefix(self._check(prefix_uri))
        with self._lock:
            items = [(k, len(v)) for k, v in self._objects.items()
                     if k.startswith(pre) and (start_after is None or k > start_after)]
        if not recursive:
            items = [(k, n) for k, n in items if "/" not in k[len(pre):]]
        return [FileInfo(k, n) for k, n in sorted(items)]

    def list_dirs(self, prefix_uri: str) -> builtins.list[str]:
        pre = dir_prefix(self._check(prefix_uri))
        with self._lock:
            keys = [k[len(pre):] for k in self._objects if k.startswith(pre)]
        return sorted({k.split("/", 1)[0] for k in keys if "/" in k})

    def delete(self, uri: str) -> None:
        with self._lock:
            self._objects.pop(self._check(uri), None)

    def delete_prefix(self, prefix_uri: str) -> int:
        pre = dir_prefix(self._check(prefix_uri))
        with self._lock:
            gone = [k for k in self._objects if k.startswith(pre)]
            for k in gone:
                del self._objects[k]
        return len(gone)

    def open_input(self, uri: str) -> pyarrow.NativeFile:
        import pyarrow as pa

        return pa.BufferReader(self.read_bytes(uri))

    def open_output(self, uri: str) -> pyarrow.NativeFile:
        self._check(uri)
        return _Output(self, uri)  # type: ignore[return-value]

    def pyarrow_fs(self, uri: str | None = None) -> tuple[pyarrow.fs.FileSystem, str]:
        """A pyarrow file system over this store (paths without the ``memory://`` scheme)."""
        import pyarrow.fs as pafs

        fs = pafs.PyFileSystem(_ArrowHandler(self))
        return fs, (self._check(uri)[len(SCHEME):] if uri else "")

    def clear(self) -> None:
        with self._lock:
            self._objects.clear()

    def __repr__(self) -> str:
        return f"InMemoryFileIO({len(self._objects)} objects)"
