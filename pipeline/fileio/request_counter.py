"""Counting the S3 requests a process sends, by kind (what S3 bills and what grows with history).

Every boto3 client :class:`~pipeline.fileio.S3FileIO` creates carries a ``before-send`` hook that counts each
HTTP request it is about to send: retries (ours and boto3's) and every page of a listing count once each, as S3
bills them. Requests are grouped in five kinds (:class:`StorageRequests`):

=========  ===================================================================================
``list``   ``ListObjectsV2`` / ``ListObjects`` pages (``FileIO.list``, ``list_dirs``, ``delete_prefix``)
``get``    ``GetObject`` (small-object reads and every ranged GET of a stream)
``head``   ``HeadObject`` (``exists``, ``size``, opening a stream)
``put``    ``PutObject``, multipart ``CreateMultipartUpload`` / ``UploadPart`` / ``CompleteMultipartUpload``,
           ``CopyObject``
``delete`` ``DeleteObject``, ``DeleteObjects`` (one request per batch of up to 1000 keys), ``AbortMultipartUpload``
=========  ===================================================================================

The counter is per process (:func:`request_counts`); a caller measures a span as the difference of two readings
(``after - before``). The checkpoint stats record the driver's span per checkpoint
(:attr:`pipeline.checkpoint.stats.CheckpointStats.s3_requests`, see docs/state.md "S3 requests per epoch") and
the executors' requests (``executor_s3_requests``): each operator task reports its Python worker's requests not
yet reported (:func:`take_unreported`) with its handle rows.
Clients that do not go through :class:`S3FileIO` (``pyarrow_fs()``, the Iceberg and Delta writers' own clients)
are not counted.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["StorageRequests", "request_counts", "count_request", "instrument_client", "take_unreported", "KINDS"]

#: the request kinds, in the order tables print them
KINDS: tuple[str, ...] = ("list", "get", "head", "put", "delete")

_KIND_OF_OPERATION: dict[str, str] = {
    "ListObjectsV2": "list", "ListObjects": "list",
    "GetObject": "get",
    "HeadObject": "head",
    "PutObject": "put", "CreateMultipartUpload": "put", "UploadPart": "put", "CompleteMultipartUpload": "put",
    "CopyObject": "put",
    "DeleteObject": "delete", "DeleteObjects": "delete", "AbortMultipartUpload": "delete",
}


@dataclass(frozen=True, slots=True)
class StorageRequests:
    """Numbers of S3 requests by kind (a process total, or a span: the difference of two totals)."""

    list: int = 0
    get: int = 0
    head: int = 0
    put: int = 0
    delete: int = 0

    def __post_init__(self) -> None:
        for k in KINDS:
            object.__setattr__(self, k, int(getattr(self, k)))

    @property
    def total(self) -> int:
        return self.list + self.get + self.head + self.put + self.delete

    def __sub__(self, other: "StorageRequests") -> "StorageRequests":
        return StorageRequests(*(getattr(self, k) - getattr(other, k) for k in KINDS))

    def __add__(self, other: "StorageRequests") -> "StorageRequests":
        return StorageRequests(*(getattr(self, k) + getattr(other, k) for k in KINDS))

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in KINDS}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StorageRequests":
        return cls(**{k: int(d.get(k, 0) or 0) for k in KINDS})

    def __str__(self) -> str:
        return " ".join(f"{k.upper()} {getattr(self, k)}" for k in KINDS)


_LOCK = threading.Lock()
_COUNTS: dict[str, int] = dict.fromkeys(KINDS, 0)


def count_request(kind: str, n: int = 1) -> None:
    """Add ``n`` requests of ``kind`` (one of :data:`KINDS`) to this process's counter."""
    with _LOCK:
        _COUNTS[kind] = _COUNTS.get(kind, 0) + n


def request_counts() -> StorageRequests:
    """This process's S3 requests so far (monotonic; take differences to measure a span)."""
    with _LOCK:
        return StorageRequests(**{k: _COUNTS[k] for k in KINDS})


_REPORTED: dict[str, int] = dict.fromkeys(KINDS, 0)


def take_unreported() -> StorageRequests:
    """This process's requests since the previous call (all of them at the first): what an executor's Python
    worker reports with its next task's handle rows, so that every request of the worker (of any task: source
    reads, state chains, sink staging, acks) is reported exactly once, with the next operator task it runs."""
    with _LOCK:
        out = StorageRequests(**{k: _COUNTS[k] - _REPORTED[k] for k in KINDS})
        _REPORTED.update(_COUNTS)
    return out


def _on_before_send(**kwargs: Any) -> None:
    operation = str(kwargs.get("event_name", "")).rsplit(".", 1)[-1]
    kind = _KIND_OF_OPERATION.get(operation)
    if kind is not None:
        count_request(kind)


def instrument_client(client: Any) -> Any:
    """Count every request ``client`` (a boto3 S3 client) sends; returns the client."""
    client.meta.events.register("before-send.s3", _on_before_send)
    return client
