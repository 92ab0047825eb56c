"""LocalFileIO: ``file://`` URIs on a local (or shared POSIX) file system.

Writes are atomic (temporary file + ``os.replace``); create-only writes (``if_none_match=True``) use a
temporary file + ``os.link``, which fails atomically if the target exists. ``open_output`` is atomic too:
the file appears under its final name only when the stream is closed, so a killed writer never leaves a
partial file. Local URIs are ``file://`` + an absolute POSIX path (``file:/abs`` and
``file://localhost/abs`` are accepted; ``%xx`` escapes are decoded). Listed URIs are built from the prefix
exactly as the caller spelled it.
"""
from __future__ import annotations

import builtins
import os
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from pipeline.exceptions import ConditionalWriteError, ObjectNotFoundError, StorageError
from pipeline.fileio.base import TMP_MARK, FileInfo, is_tmp

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow
    import pyarrow.fs

__all__ = ["LocalFileIO"]

class _AtomicLocalWriter:
    """File-like object for ``pyarrow.PythonFile``: writes a temp file, renames on close."""

    def __init__(self, uri: str, path: str) -> None:
        self._uri = uri
        self._path = path
        directory = os.path.dirname(path)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise StorageError(f"cannot create directory for {uri}: {e}") from e
        self._tmp = os.path.join(directory, f".{os.path.basename(path)}{TMP_MARK}{uuid.uuid4().hex}")
        self._f = open(self._tmp, "wb")  # noqa: SIM115 - closed in close()
        self.closed = False

    def write(self, data: Any) -> int:
        return self._f.write(data)

    def flush(self) -> None:
        self._f.flush()

    def tell(self) -> int:
        return self._f.tell()

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self._f.close()
            os.replace(self._tmp, self._path)
        except OSError as e:
            _silent_unlink(self._tmp)
            raise StorageError(f"cannot write {self._uri}: {e}") from e


def _silent_unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class LocalFileIO:
    """FileIO for ``file://`` URIs on a local (or shared POSIX) file system."""

    scheme = "file"  # the URIs it serves: file://

    def __init__(self, *, fsync: bool = False) -> None:
        self._fsync = fsync

    # -- paths ---------------------------------------------------------------------------------
    @staticmethod
    def path_of(uri: str) -> str:
        """The local path of a ``file://`` URI."""
        if not uri.startswith("file:"):
            raise StorageError(f"not a file:// URI: {uri!r}")
        parts = urlsplit(uri)
        if parts.netloc not in ("", "localhost"):
            raise StorageError(f"file URI with a remote host is not supported: {uri}")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise StorageError(f"file URI must hold an absolute path: {uri}")
        return path

    # -- small objects ---------------------------------------------------------------------------
    def read_bytes(self, uri: str) -> bytes:
        path = self.path_of(uri)
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as e:
            raise ObjectNotFoundError(f"file not found: {uri}") from e
        except OSError as e:
            raise StorageError(f"cannot read {uri}: {e}") from e

    def write_bytes(self, uri: str, data: bytes, *, if_none_match: bool = False) -> None:
        path = self.path_of(uri)
        directory = os.path.dirname(path)
        tmp = os.path.join(directory, f".{os.path.basename(path)}{TMP_MARK}{uuid.uuid4().hex}")
        try:
            os.makedirs(directory, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                if self._fsync:
                    f.flush()
                    os.fsync(f.fileno())
            if if_none_match:
                try:
                    os.link(tmp, path)
                except FileExistsError as e:
                    raise ConditionalWriteError(f"object already exists (create-only write refused): {uri}") from e
            else:
                os.replace(tmp, path)
                tmp = ""
        except ConditionalWriteError:
            raise
        except OSError as e:
            raise StorageError(f"cannot write {uri}: {e}") from e
        finally:
            if tmp:
                _silent_unlink(tmp)

    def exists(self, uri: str) -> bool:
        return os.path.isfile(self.path_of(uri))

    def size(self, uri: str) -> int:
        path = self.path_of(uri)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise ObjectNotFoundError(f"file not found: {uri}") from e
        except OSError as e:
            raise StorageError(f"cannot stat {uri}: {e}") from e
        if not os.path.isfile(path):
            raise ObjectNotFoundError(f"not a file: {uri}")
        return st.st_size

    # -- listing -----------------------------------------------------------------------------------
    def list(self, prefix_uri: str, *, recursive: bool = True, start_after: str | None = None) -> list[FileInfo]:
        base = self.path_of(prefix_uri).rstrip("/") or "/"
        prefix = prefix_uri.rstrip("/")
        if not os.path.isdir(base):
            return []
        out: list[FileInfo] = []
        try:
            if recursive:
                for dirpath, _dirs, files in os.walk(base):
                    rel_dir = os.path.relpath(dirpath, base)
                    for name in files:
                        if is_tmp(name):
                            continue
                        rel = name if rel_dir == "." else f"{rel_dir.replace(os.sep, '/')}/{name}"
                        full = os.path.join(dirpath, name)
                        try:
                            out.append(FileInfo(f"{prefix}/{rel}", os.path.getsize(full)))
                        except FileNotFoundError:  # deleted while listing
                            continue
            else:
                with os.scandir(base) as it:
                    for entry in it:
                        if entry.is_file() and not is_tmp(entry.name):
                            try:
                                out.append(FileInfo(f"{prefix}/{entry.name}", entry.stat().st_size))
                            except FileNotFoundError:
                                continue
        except OSError as e:
            raise StorageError(f"cannot list {prefix_uri}: {e}") from e
        out.sort(key=lambda fi: fi.uri)
        return out if start_after is None else [fi for fi in out if fi.uri > start_after]

    def list_dirs(self, prefix_uri: str) -> builtins.list[str]:
        base = self.path_of(prefix_uri).rstrip("/") or "/"
        if not os.path.isdir(base):
            return []
        names: list[str] = []
        try:
            with os.scandir(base) as it:
                for entry in it:
                    if entry.is_dir() and _holds_a_file(entry.path):
                        names.append(entry.name)
        except OSError as e:
            raise StorageError(f"cannot list {prefix_uri}: {e}") from e
        return sorted(names)

    # -- deleting ----------------------------------------------------------------------------------
    def delete(self, uri: str) -> None:
        path = self.path_of(uri)
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            pass
        except IsADirectoryError as e:
            raise StorageError(f"cannot delete {uri}: it is a directory (use delete_prefix)") from e
        except OSError as e:
            raise StorageError(f"cannot delete {uri}: {e}") from e

    def delete_prefix(self, prefix_uri: str) -> int:
        base = self.path_of(prefix_uri).rstrip("/")
        if not base:
            raise StorageError(f"refusing to delete the file system root: {prefix_uri}")
        if not os.path.isdir(base):
            return 0
        count = 0
        try:
            for dirpath, dirs, files in os.walk(base, topdown=False):
                for name in files:
                    _silent_unlink(os.path.join(dirpath, name))
                    if not is_tmp(name):
                        count += 1
                for d in dirs:
                    try:
                        os.rmdir(os.path.join(dirpath, d))
                    except OSError:
                        pass  # a concurrent writer put something there; leave it
            os.rmdir(base)
        except FileNotFoundError:
            pass
        except OSError as e:
            if os.path.isdir(base) and _holds_a_file(base):
                raise StorageError(f"cannot delete {prefix_uri}: {e}") from e
        return count

    # -- streams -----------------------------------------------------------------------------------
    def open_input(self, uri: str) -> pyarrow.NativeFile:
        import pyarrow as pa

        path = self.path_of(uri)
        if not os.path.isfile(path):
            raise ObjectNotFoundError(f"file not found: {uri}")
        try:
            return pa.OSFile(path, mode="r")
        except (FileNotFoundError, OSError) as e:
            if not os.path.exists(path):
                raise ObjectNotFoundError(f"file not found: {uri}") from e
            raise StorageError(f"cannot open {uri}: {e}") from e

    def open_output(self, uri: str) -> pyarrow.NativeFile:
        import pyarrow as pa

        return pa.PythonFile(_AtomicLocalWriter(uri, self.path_of(uri)), mode="w")

    def pyarrow_fs(self, uri: str | None = None) -> tuple[pyarrow.fs.FileSystem, str]:
        import pyarrow.fs as pafs

        return pafs.LocalFileSystem(), (self.path_of(uri) if uri is not None else "")

    def __repr__(self) -> str:
        return "LocalFileIO()"


def _holds_a_file(path: str) -> bool:
    for _dirpath, _dirs, files in os.walk(path):
        if any(not is_tmp(n) for n in files):
            return True
    return False

