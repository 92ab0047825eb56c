"""S3FileIO: ``s3://bucket/key`` URIs (AWS S3, MinIO, moto).

Everything goes through a boto3 client and the retry layer (:mod:`pipeline.storage_retry`): small
objects (create-only = ``put_object(IfNoneMatch="*")``, 412 ``PreconditionFailed`` ->
:class:`~pipeline.exceptions.ConditionalWriteError`) and streams (``open_input``: ranged GETs,
``open_output``: one PUT or a multipart upload). ``pyarrow_fs`` hands out a ``pyarrow.fs.S3FileSystem``
(tools and oracles; not retried by this layer). Settings come from the standard ``AWS_ENDPOINT_URL`` (or
``AWS_ENDPOINT_URL_S3``), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``.
Clients are cached per process (and per settings), so constructing an ``S3FileIO`` on a Spark executor for
every task is cheap. boto3 and pyarrow.fs are imported on first use (import cost at DAG parse time).

Over 400 lines: one FileIO implementation: each method maps one FileIO operation onto S3 (retries, request
counting).
"""
from __future__ import annotations

import builtins
import io
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pipeline import settings
from pipeline.exceptions import ConditionalWriteError, ObjectNotFoundError, StorageError
from pipeline.fileio.base import FileInfo, dir_prefix
from pipeline.fileio.request_counter import instrument_client
from pipeline.storage_retry import with_retries

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow
    import pyarrow.fs

__all__ = ["S3FileIO", "split_s3_uri", "list_page_size"]

def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``."""
    if not uri.startswith("s3://"):
        raise StorageError(f"not an s3:// URI: {uri!r}")
    rest = uri[len("s3://"):]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise StorageError(f"s3 URI without a bucket: {uri!r}")
    return bucket, key


@dataclass(frozen=True, slots=True)
class _S3Settings:
    endpoint_url: str | None
    access_key_id: str | None
    secret_access_key: str | None
    session_token: str | None
    region: str


_CLIENT_LOCK = threading.Lock()
_CLIENTS: dict[tuple[int, _S3Settings], Any] = {}
_ARROW_FS: dict[tuple[int, _S3Settings], Any] = {}


def _boto_attempts() -> int:
    """boto3's own attempts per call (``PIPELINE_S3_BOTO_ATTEMPTS``, default 1: no silent inner retries). Every
    retry is then one of :mod:`pipeline.storage_retry`'s: logged, backed off and bounded by its time budget."""
    try:
        return max(1, settings.get_int("PIPELINE_S3_BOTO_ATTEMPTS"))
    except ValueError:
        return 1


def list_page_size() -> int:
    """Keys per LIST page (``PIPELINE_S3_LIST_PAGE_SIZE``, default S3's 1000). Tests set it small so that a
    listing which grows with history shows up as more LIST requests after a few epochs."""
    try:
        return max(1, settings.get_int("PIPELINE_S3_LIST_PAGE_SIZE"))
    except ValueError:
        return 1000


def _boto_client(settings: _S3Settings) -> Any:
    key = (os.getpid(), settings)
    client = _CLIENTS.get(key)
    if client is not None:
        return client
    with _CLIENT_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            import boto3
            from botocore.config import Config

            session = boto3.session.Session(
                aws_access_key_id=settings.access_key_id,
                aws_secret_access_key=settings.secret_access_key,
                aws_session_token=settings.session_token,
                region_name=settings.region,
            )
            client = session.client(
                "s3", endpoint_url=settings.endpoint_url,
                config=Config(retries={"total_max_attempts": _boto_attempts(), "mode": "standard"},
                              max_pool_connections=32, s3={"addressing_style": "path"}
                              if settings.endpoint_url else {}),
            )
            _CLIENTS[key] = instrument_client(client)  # counted per request kind (fileio/request_counter.py)
    return client


def _arrow_s3(settings: _S3Settings) -> Any:
    key = (os.getpid(), settings)
    fs = _ARROW_FS.get(key)
    if fs is not None:
        return fs
    with _CLIENT_LOCK:
        fs = _ARROW_FS.get(key)
        if fs is None:
            import pyarrow.fs as pafs

            kwargs: dict[str, Any] = {"region": settings.region}
            if settings.access_key_id:
                kwargs.update(access_key=settings.access_key_id, secret_key=settings.secret_access_key)
                if settings.session_token:
                    kwargs["session_token"] = settings.session_token
            if settings.endpoint_url:
                parts = urlsplit(settings.endpoint_url)
                if parts.scheme and parts.netloc:
                    kwargs.update(endpoint_override=parts.netloc + parts.path.rstrip("/"), scheme=parts.scheme)
                else:
                    kwargs["endpoint_override"] = settings.endpoint_url
                kwargs["force_virtual_addressing"] = False
            fs = pafs.S3FileSystem(**kwargs)
            _ARROW_FS[key] = fs
    return fs


class _RangeReader(io.RawIOBase):
    """A read-only, seekable file over an S3 object; every read is a ranged GET through the retry layer."""

    def __init__(self, fio: S3FileIO, uri: str, size: int) -> None:
        super().__init__()
        self._fio, self._uri, self._size, self._pos = fio, uri, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, n: int = -1) -> bytes:
        end = self._size if n is None or n < 0 else min(self._size, self._pos + n)
        if end <= self._pos:
            return b""
        data = self._fio._read_range(self._uri, self._pos, end - self._pos)
        self._pos = end
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)


class _UploadWriter(io.RawIOBase):
    """A write-only file uploaded on close: one retried PUT, or a multipart upload (every request retried)."""

    def __init__(self, fio: S3FileIO, uri: str) -> None:
        super().__init__()
        self._fio, self._uri = fio, uri
        self._bucket, self._key = split_s3_uri(uri)
        self._part = max(5, settings.get_int("PIPELINE_S3_PART_MB")) * 1024 * 1024
        self._buf = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._written = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._written

    def write(self, b: Any) -> int:
        data = bytes(b)
        self._buf += data
        self._written += len(data)
        while len(self._buf) >= self._part:
            self._upload_part(bytes(self._buf[: self._part]))
            del self._buf[: self._part]
        return len(data)

    def _call(self, what: str, fn: Any) -> Any:
        try:
            return with_retries(fn, f"{what} {self._uri}")
        except Exception as e:  # noqa: BLE001
            raise self._fio._fail("write", self._uri, e) from e

    def _upload_part(self, data: bytes) -> None:
        c = self._fio.client
        if self._upload_id is None:
            self._upload_id = self._call("CREATE MULTIPART", lambda: c.create_multipart_upload(
                Bucket=self._bucket, Key=self._key))["UploadId"]
        n = len(self._parts) + 1
        etag = self._call(f"PUT PART {n}", lambda: c.upload_part(
            Bucket=self._bucket, Key=self._key, UploadId=self._upload_id, PartNumber=n, Body=data))["ETag"]
        self._parts.append({"PartNumber": n, "ETag": etag})

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._upload_id is None:
                self._fio.write_bytes(self._uri, bytes(self._buf))
            else:
                if self._buf:
                    self._upload_part(bytes(self._buf))
                c = self._fio.client
                try:
                    self._call("COMPLETE MULTIPART", lambda: c.complete_multipart_upload(
                        Bucket=self._bucket, Key=self._key, UploadId=self._upload_id,
                        MultipartUpload={"Parts": self._parts}))
                except StorageError:
                    # a lost answer: the retry finds no upload any more; the object being there in full is success
                    if self._fio.size(self._uri) != self._written:
                        raise
            self._buf = bytearray()
        finally:
            super().close()


class _ShortBodyError(Exception):
    """A GET response body shorter than its Content-Length (the connection was cut mid-body)."""


def _error_code(exc: Exception) -> tuple[str, int]:
    resp = getattr(exc, "response", None) or {}
    code = str(resp.get("Error", {}).get("Code", ""))
    status = int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


class S3FileIO:
    """FileIO for ``s3://bucket/key`` URIs (AWS S3, MinIO, moto)."""

    scheme = "s3"  # the URIs it serves: s3://

    def __init__(self, *, endpoint_url: str | None = None, access_key_id: str | None = None,
                 secret_access_key: str | None = None, region: str | None = None,
                 session_token: str | None = None) -> None:
        env = settings.environ()
        self._settings = _S3Settings(
            endpoint_url=endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
            access_key_id=access_key_id or env.get("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=secret_access_key or env.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=session_token or env.get("AWS_SESSION_TOKEN") or None,
            region=region or env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or "us-east-1",
        )

    @property
    def endpoint_url(self) -> str | None:
        return self._settings.endpoint_url

    @property
    def client(self) -> Any:
        """The (per-process cached) boto3 S3 client."""
        return _boto_client(self._settings)

    def _fail(self, op: str, uri: str, exc: Exception) -> StorageError:
        code, status = _error_code(exc)
        if code in ("NoSuchKey", "404", "NotFound") or (status == 404 and code != "NoSuchBucket"):
            return ObjectNotFoundError(f"object not found: {uri}")
        if code == "NoSuchBucket":
            return StorageError(f"cannot {op} {uri}: bucket does not exist")
        return StorageError(f"cannot {op} {uri}: {code or type(exc).__name__}: {exc}")

    # -- small objects ---------------------------------------------------------------------------
    def read_bytes(self, uri: str) -> bytes:
        bucket, key = split_s3_uri(uri)

        def get() -> bytes:  # the body is read inside the retried call: a cut body is retried, not corruption
            resp = self.client.get_object(Bucket=bucket, Key=key)
            data = resp["Body"].read()
            expected = resp.get("ContentLength")
            if expected is not None and len(data) != int(expected):
                raise _ShortBodyError(f"got {len(data)} of {expected} bytes")
            return data
        try:
            return with_retries(get, f"GET {uri}")
        except Exception as e:  # noqa: BLE001 - botocore raises several unrelated types
            raise self._fail("read", uri, e) from e

    def write_bytes(self, uri: str, data: bytes, *, if_none_match: bool = False) -> None:
        bucket, key = split_s3_uri(uri)
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, "Body": bytes(data)}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        calls = [0]

        def put() -> Any:
            calls[0] += 1
            return self.client.put_object(**kwargs)
        try:
            with_retries(put, f"PUT {uri}")
        except Exception as e:  # noqa: BLE001
            code, status = _error_code(e)
            if if_none_match and (code in ("PreconditionFailed", "ConditionalRequestConflict")
                                  or status in (409, 412)):
                resp = getattr(e, "response", None) or {}
                retried = calls[0] > 1 or int(resp.get("ResponseMetadata", {}).get("RetryAttempts", 0) or 0) > 0
                if retried and self._holds(uri, data):  # our own PUT landed, its answer was lost, the retry got 412
                    return
                raise ConditionalWriteError(
                    f"object already exists (create-only write refused, {code or status}): {uri}") from e
            raise self._fail("write", uri, e) from e

    def _holds(self, uri: str, data: bytes) -> bool:
        """True if the object at ``uri`` has exactly the bytes ``data`` (a write-once PUT already done)."""
        try:
            return self.read_bytes(uri) == bytes(data)
        except StorageError:
            return False

    def exists(self, uri: str) -> bool:
        try:
            self.size(uri)
        except ObjectNotFoundError:
            return False
        return True

    def size(self, uri: str) -> int:
        bucket, key = split_s3_uri(uri)
        if not key or key.endswith("/"):
            raise ObjectNotFoundError(f"object not found: {uri}")
        try:
            resp = with_retries(lambda: self.client.head_object(Bucket=bucket, Key=key), f"HEAD {uri}")
        except Exception as e:  # noqa: BLE001
            code, status = _error_code(e)
            if status == 404 or code in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
                raise ObjectNotFoundError(f"object not found: {uri}") from e
            raise self._fail("stat", uri, e) from e
        return int(resp["ContentLength"])

    # -- listing -----------------------------------------------------------------------------------
    def _pages(self, prefix_uri: str, delimiter: str | None, start_after: str | None = None) -> Any:
        bucket, key = split_s3_uri(prefix_uri)
        prefix = dir_prefix(key) if key.strip("/") else ""
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        if start_after:
            kwargs["StartAfter"] = start_after
        page_size = list_page_size()
        if page_size != 1000:
            kwargs["PaginationConfig"] = {"PageSize": page_size}
        try:
            pages = with_retries(
                lambda: builtins.list(self.client.get_paginator("list_objects_v2").paginate(**kwargs)),
                f"LIST {prefix_uri}")
        except Exception as e:  # noqa: BLE001
            raise self._fail("list", prefix_uri, e) from e
        yield from pages

    def list(self, prefix_uri: str, *, recursive: bool = True, start_after: str | None = None) -> list[FileInfo]:
        bucket, _key = split_s3_uri(prefix_uri)
        after = None
        if start_after is not None:
            after_bucket, after = split_s3_uri(start_after)
            if after_bucket != bucket:
                raise StorageError(f"start_after {start_after} is not in the bucket of {prefix_uri}")
        out: list[FileInfo] = []
        for page in self._pages(prefix_uri, None if recursive else "/", after):
            for obj in page.get("Contents", []) or []:
                k = obj["Key"]
                if k.endswith("/"):
                    continue  # "directory marker" objects written by some tools
                out.append(FileInfo(f"s3://{bucket}/{k}", int(obj["Size"])))
        out.sort(key=lambda fi: fi.uri)
        return out

    def list_dirs(self, prefix_uri: str) -> builtins.list[str]:
        names: list[str] = []
        for page in self._pages(prefix_uri, "/"):
            for cp in page.get("CommonPrefixes", []) or []:
                name = cp["Prefix"].rstrip("/").rsplit("/", 1)[-1]
                if name:
                    names.append(name)
        return sorted(set(names))

    # -- deleting ----------------------------------------------------------------------------------
    def delete(self, uri: str) -> None:
        bucket, key = split_s3_uri(uri)
        try:
            with_retries(lambda: self.client.delete_object(Bucket=bucket, Key=key), f"DELETE {uri}")
        except Exception as e:  # noqa: BLE001
            code, status = _error_code(e)
            if status == 404 or code in ("NoSuchKey", "NoSuchBucket"):
                return
            raise self._fail("delete", uri, e) from e

    def delete_prefix(self, prefix_uri: str) -> int:
        bucket, key = split_s3_uri(prefix_uri)
        if not key.strip("/"):
            raise StorageError(f"refusing to delete a whole bucket: {prefix_uri}")
        keys = [obj["Key"] for page in self._pages(prefix_uri, None) for obj in page.get("Contents", []) or []]
        deleted = 0
        for i in range(0, len(keys), 1000):
            batch = keys[i:i + 1000]
            try:
                resp = with_retries(lambda b=batch: self.client.delete_objects(  # type: ignore[misc]
                    Bucket=bucket, Delete={"Objects": [{"Key": k} for k in b], "Quiet": True}),
                    f"DELETE {len(batch)} objects under {prefix_uri}")
            except Exception as e:  # noqa: BLE001
                raise self._fail("delete", prefix_uri, e) from e
            errors = resp.get("Errors") or []
            if errors:
                first = errors[0]
                raise StorageError(f"cannot delete s3://{bucket}/{first.get('Key')} under {prefix_uri}: "
                                   f"{first.get('Code')}: {first.get('Message')}")
            deleted += sum(1 for k in batch if not k.endswith("/"))
        return deleted

    # -- streams -----------------------------------------------------------------------------------
    def _arrow(self) -> Any:
        return _arrow_s3(self._settings)

    def open_input(self, uri: str) -> pyarrow.NativeFile:
        """A seekable stream over the object: ranged GETs, each inside the retry layer (a throttled, dropped or
        cut read is retried like any small-object request, not surfaced as a broken file)."""
        import pyarrow as pa

        size = self.size(uri)  # HEAD, retried; ObjectNotFoundError for a missing object
        return pa.PythonFile(_RangeReader(self, uri, size), mode="r")

    def _read_range(self, uri: str, start: int, length: int) -> bytes:
        bucket, key = split_s3_uri(uri)
        rng = f"bytes={start}-{start + length - 1}"

        def get() -> bytes:
            resp = self.client.get_object(Bucket=bucket, Key=key, Range=rng)
            data = resp["Body"].read()
            if len(data) != length:
                raise _ShortBodyError(f"got {len(data)} of {length} bytes ({rng})")
            return data
        try:
            return with_retries(get, f"GET {uri} {rng}")
        except Exception as e:  # noqa: BLE001
            raise self._fail("read", uri, e) from e

    def open_output(self, uri: str) -> pyarrow.NativeFile:
        """A write stream: buffered, uploaded on close as one retried PUT, or in parts of
        ``PIPELINE_S3_PART_MB`` (default 32) MiB by a multipart upload whose every request is retried."""
        import pyarrow as pa

        split_s3_uri(uri)
        return pa.PythonFile(_UploadWriter(self, uri), mode="w")

    def pyarrow_fs(self, uri: str | None = None) -> tuple[pyarrow.fs.FileSystem, str]:
        if uri is None:
            return self._arrow(), ""
        bucket, key = split_s3_uri(uri)
        return self._arrow(), f"{bucket}/{key}"

    def __repr__(self) -> str:
        return f"S3FileIO(endpoint_url={self._settings.endpoint_url!r}, region={self._settings.region!r})"

