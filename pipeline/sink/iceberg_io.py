"""pyiceberg's file IO on Epochal's counted S3 client, so an Iceberg sink's commits are in the S3 request counts.

pyiceberg's default ``PyArrowFileIO`` reaches S3 through pyarrow's own C++ client, which Epochal cannot count.
:class:`CountedPyArrowFileIO` (the catalog property ``py-io-impl``, set by :func:`pipeline.sink.iceberg.iceberg_catalog`
for ``s3://`` sink roots) is the same ``PyArrowFileIO`` whose ``s3://`` file system is a
``pyarrow.fs.PyFileSystem`` over :class:`~pipeline.fileio.S3FileIO` (:class:`S3FileIOHandler`): every request it
sends (metadata and manifest reads and writes, the staged files' footers that ``add_files`` reads, the data files
an upsert's delete reads and rewrites) goes through S3FileIO's instrumented boto3 client and retry layer, counted
by kind like any other request of the driver (``CheckpointStats.s3_requests``). The rest of pyiceberg (Arrow
reads and writes over a file system) is unchanged. ``EPOCHAL_ICEBERG_COUNTED_IO=0`` switches back to pyiceberg's
own client (then ``sink_s3_requests_counting`` says the commits are not counted); so does a named catalog
(``PIPELINE_ICEBERG_CATALOG``: its own configuration decides its file IO).
"""
from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO

from pipeline.exceptions import ObjectNotFoundError
from pipeline.fileio.s3 import S3FileIO

__all__ = ["CountedPyArrowFileIO", "S3FileIOHandler"]


class S3FileIOHandler(pafs.FileSystemHandler):
    """A pyarrow file system over :class:`S3FileIO` (paths ``bucket/key``, as ``pyarrow.fs.S3FileSystem``'s)."""

    def __init__(self, fio: S3FileIO | None = None) -> None:
        self.fio = fio or S3FileIO()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, S3FileIOHandler)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    @staticmethod
    def _uri(path: str) -> str:
        return "s3://" + path.lstrip("/")

    def get_type_name(self) -> str:
        return "epochal-s3"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        out = []
        for p in paths:
            try:
                out.append(pafs.FileInfo(p, pafs.FileType.File, size=self.fio.size(self._uri(p))))  # HEAD
            except ObjectNotFoundError:
                out.append(pafs.FileInfo(p, pafs.FileType.NotFound))
        return out

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        base = selector.base_dir.rstrip("/") + "/"
        files = self.fio.list(self._uri(base), recursive=selector.recursive)
        return [pafs.FileInfo(f.uri[len("s3://"):], pafs.FileType.File, size=f.size) for f in files]

    def create_dir(self, path: str, recursive: bool) -> None:
        pass  # S3 has no directories

    def delete_dir(self, path: str) -> None:
        self.fio.delete_prefix(self._uri(path.rstrip("/") + "/"))

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.fio.delete_prefix(self._uri(path.rstrip("/") + "/"))

    def delete_root_dir_contents(self) -> None:
        raise OSError("epochal-s3: refusing to delete a bucket's root")

    def delete_file(self, path: str) -> None:
        if not self.fio.exists(self._uri(path)):
            raise FileNotFoundError(f"Cannot delete file, does not exist: s3://{path}")
        self.fio.delete(self._uri(path))

    def move(self, src: str, dest: str) -> None:
        self.copy_file(src, dest)
        self.fio.delete(self._uri(src))

    def copy_file(self, src: str, dest: str) -> None:
        self.fio.write_bytes(self._uri(dest), self.fio.read_bytes(self._uri(src)))

    def open_input_stream(self, path: str) -> Any:
        return self._open_input(path)

    def open_input_file(self, path: str) -> Any:
        return self._open_input(path)

    def _open_input(self, path: str) -> Any:
        try:
            return self.fio.open_input(self._uri(path))
        except ObjectNotFoundError as e:
            raise FileNotFoundError(str(e)) from e

    def open_output_stream(self, path: str, metadata: Any = None) -> Any:
        return self.fio.open_output(self._uri(path))

    def open_append_stream(self, path: str, metadata: Any = None) -> Any:
        raise OSError("epochal-s3: S3 objects cannot be appended to")


class CountedPyArrowFileIO(PyArrowFileIO):
    """pyiceberg's ``PyArrowFileIO`` with ``s3://`` through :class:`S3FileIOHandler` (see the module docstring)."""

    def _initialize_fs(self, scheme: str, netloc: str | None = None) -> pafs.FileSystem:
        if scheme in {"s3", "s3a", "s3n"}:
            return pafs.PyFileSystem(S3FileIOHandler())
        return super()._initialize_fs(scheme, netloc)


_ = pa  # pyarrow is imported before pyarrow.fs for its type registrations
