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
the executors' requests (``executor_s3_requests``).

**Per task** (the executors' Python workers): while a Spark task function runs inside a *recording*
(:func:`open_recording` / :func:`close_recording`, opened by :func:`pipeline.runtime.spark.task_requests.counted` around
every task function of a round), each request is also recorded under the *attribution* current when it was sent
(:func:`attributed_to`: the epoch tag of the work running, in a round of several epochs; None otherwise), and the
task hands what it recorded to a Spark accumulator: exact counts per round and epoch
(:class:`RequestCounting` ``EXACT``). Without accumulators (Spark Connect) each operator task reports its worker's
requests not yet reported (:func:`take_unreported`) with its handle rows instead (``APPROXIMATE``).
Outside rounds (bootstrap, export, validation) a command counts its requests the same way
(:class:`pipeline.runtime.spark.task_requests.RequestSpan`). The Iceberg sink's commits go through :class:`S3FileIO`
(:mod:`pipeline.sink.iceberg_io`); clients that do not (``pyarrow_fs()``, delta-rs's Rust client) are not
counted, and the checkpoint stats say so per sink (``sink_s3_requests_counting``).
"""
from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = ["StorageRequests", "RequestCounting", "request_counts", "count_request", "instrument_client",
           "take_unreported", "open_recording", "close_recording", "recording", "attributed_to", "KINDS"]

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

    def __sub__(self, other: StorageRequests) -> StorageRequests:
        return StorageRequests(*(getattr(self, k) - getattr(other, k) for k in KINDS))

    def __add__(self, other: StorageRequests) -> StorageRequests:
        return StorageRequests(*(getattr(self, k) + getattr(other, k) for k in KINDS))

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in KINDS}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StorageRequests:
        return cls(**{k: int(d.get(k, 0) or 0) for k in KINDS})

    def __str__(self) -> str:
        return " ".join(f"{k.upper()} {getattr(self, k)}" for k in KINDS)


class RequestCounting(Enum):
    """How the executors' requests of a checkpoint were counted (``CheckpointStats.executor_s3_requests_counting``)."""

    #: every request of every successful task attempt of the checkpoint's rounds, once (a Spark accumulator)
    EXACT = "exact"
    #: each operator task reported its Python worker's requests not reported before (Spark Connect: no
    #: accumulators): a worker's requests after its last operator task of a round go with a later task (or none)
    APPROXIMATE = "approximate"


_LOCK = threading.Lock()
_COUNTS: dict[str, int] = dict.fromkeys(KINDS, 0)
_INDEX: dict[str, int] = {k: i for i, k in enumerate(KINDS)}
_OPEN = [0]                                   # recordings open in this process (nested task functions)
_ATTRIBUTION: list[int | None] = [None]       # where a request sent now is recorded (attributed_to)
_RECORDED: dict[int | None, list[int]] = {}   # recorded requests not yet closed out, by attribution


def count_request(kind: str, n: int = 1) -> None:
    """Add ``n`` requests of ``kind`` (one of :data:`KINDS`) to this process's counter (and to the open
    recording, under the current attribution)."""
    with _LOCK:
        _COUNTS[kind] = _COUNTS.get(kind, 0) + n
        if _OPEN[0]:
            _RECORDED.setdefault(_ATTRIBUTION[0], [0] * len(KINDS))[_INDEX[kind]] += n


def open_recording() -> None:
    """Start (or nest) a recording: requests sent until the matching :func:`close_recording` are recorded, by
    attribution. A Spark task function opens one for its whole run (:mod:`pipeline.runtime.spark.task_requests`)."""
    with _LOCK:
        _OPEN[0] += 1


def close_recording() -> dict[int | None, tuple[int, ...]]:
    """End a recording; returns everything recorded and not yet returned (by attribution: counts in the order of
    :data:`KINDS`). Nested recordings: each close returns what was recorded since the previous close, so every
    request is returned exactly once."""
    with _LOCK:
        _OPEN[0] = max(0, _OPEN[0] - 1)
        out = {k: tuple(v) for k, v in _RECORDED.items() if any(v)}
        _RECORDED.clear()
        return out


def recording() -> bool:
    """Whether a recording is open (the requests are counted per task: no need to report them otherwise)."""
    with _LOCK:
        return _OPEN[0] > 0


@contextmanager
def attributed_to(tag: int | None) -> Iterator[None]:
    """Record the requests sent inside the block under ``tag`` (the epoch of a tagged round's work)."""
    with _LOCK:
        before, _ATTRIBUTION[0] = _ATTRIBUTION[0], tag
    try:
        yield
    finally:
        with _LOCK:
            _ATTRIBUTION[0] = before


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
