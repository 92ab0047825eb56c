"""Bounded, logged retries of S3 requests (riding out throttling, dropped connections and outages).

boto3's own retries are off by default (``PIPELINE_S3_BOTO_ATTEMPTS=1``, see :mod:`pipeline.fileio.s3`) so that
every retry is one of this module's: logged and bounded by one time budget. Around every small-object request of
:class:`~pipeline.fileio.S3FileIO` (GET incl. reading the body, PUT, HEAD, LIST, DELETE) and of its streams (ranged GETs, PUT/multipart parts) this module adds an
outer loop for *transient* failures: HTTP 5xx, ``SlowDown``/``ServiceUnavailable``/``InternalError``/
``RequestTimeout``, connection errors, timeouts and response bodies cut short. It backs off exponentially
(``base * 2^k``, capped, with jitter) and gives up when the total time spent would exceed the budget.

Knobs (environment, read at every call, so Spark's Python workers see them too):

* ``PIPELINE_S3_RETRY_SECONDS`` (default 90): total time budget of one request's retries. An outage
  shorter than this is ridden out; a longer one fails with one StorageError naming the URI.
* ``PIPELINE_S3_RETRY_BASE_MS`` (default 200) and ``PIPELINE_S3_RETRY_MAX_BACKOFF_SECONDS`` (default 5).

Each retry is logged (``WARNING pipeline.storage_retry: ... retry k in x s``). Non-transient errors
(404, 403, 412 ...) are never retried here.

Open table formats (delta-rs, pyiceberg over pyarrow's S3 filesystem) do their own S3 requests and report failures
as plain ``OSError`` text (``Generic S3 error ... error reading a body from connection``; ``AWS Error
NETWORK_CONNECTION ...``). :func:`is_transient_table_error` recognises the transient ones from that text, and
:class:`~pipeline.sink.open_table.OpenFormatTable` retries a whole table commit with it (its steps are idempotent).
"""
from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from pipeline import settings

__all__ = ["RetryPolicy", "is_transient", "is_transient_table_error", "one_line", "with_retries"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_TRANSIENT_CODES = frozenset({"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout",
                              "RequestTimeoutException", "ThrottlingException", "Throttling", "500", "502", "503",
                              "504", "RequestLimitExceeded", "BandwidthLimitExceeded"})
_TRANSIENT_TYPES = ("ConnectionError", "EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError",
                    "ConnectTimeoutError", "ResponseStreamingError", "IncompleteReadError", "IncompleteRead",
                    "ProtocolError", "ProxyConnectionError", "RemoteDisconnected", "ConnectionResetError",
                    "BrokenPipeError", "ChunkedEncodingError", "TimeoutError", "_ShortBodyError")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    budget_s: float = 90.0
    base_s: float = 0.2
    max_backoff_s: float = 5.0

    @classmethod
    def from_env(cls) -> RetryPolicy:
        env = settings.environ()
        try:
            return cls(float(env.get("PIPELINE_S3_RETRY_SECONDS") or 90.0),
                       float(env.get("PIPELINE_S3_RETRY_BASE_MS") or 200.0) / 1000.0,
                       float(env.get("PIPELINE_S3_RETRY_MAX_BACKOFF_SECONDS") or 5.0))
        except ValueError:
            return cls()


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying (5xx, throttling, connection problems, cut bodies)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        resp = getattr(e, "response", None)
        if isinstance(resp, dict):
            code = str(resp.get("Error", {}).get("Code", ""))
            status = int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            if code in _TRANSIENT_CODES or status >= 500:
                return True
            if code or status:
                return False
        if any(t.__name__ in _TRANSIENT_TYPES for t in type(e).__mro__):
            return True
        e = e.__cause__ or e.__context__
    return False


# what an S3 failure of a table format library looks like (its message is all there is): the library's S3 layer...
_TABLE_S3_MARKERS = ("s3 error", "aws error", "object_store", "objectstore", "s3://")
# ...and a transient cause (a cut body, a dropped/refused connection, a timeout, 5xx / throttling)
_TABLE_TRANSIENT_MARKERS = ("error sending request", "timed out", "timeout", "connection", "body error",
                            "error reading a body", "end of file before message length", "error decoding response",
                            "response body", "broken pipe", "reset by peer", "slowdown", "slow down", "slow_down",
                            "serviceunavailable", "service unavailable", "service_unavailable", "internalerror",
                            "internal error", "internal_failure", "network_connection", "throttl", "status: 500",
                            "status: 502", "status: 503", "status: 504", "503 service", "500 internal",
                            "502 bad gateway", "504 gateway", "incomplete")
# never transient, whatever else the text says
_TABLE_PERMANENT_MARKERS = ("forbidden", "access denied", "accessdenied", "invalidaccesskeyid",
                            "signaturedoesnotmatch", "nosuchbucket", "no such bucket", "already exists",
                            "precondition", "version mismatch", "commitfailed", "conflict")


#: HTTP 403 as a status code: "403" standing alone, not inside an object key (a random UUID such as
#: ``6c429032-701c-403f-...`` in the key of a failed request must not make a transient error permanent)
_STATUS_403 = re.compile(r"(?<![0-9a-z])403(?![0-9a-z])")
_KEY_IN_QUOTES = re.compile(r"'[^']*'|\"[^\"]*\"|s3://\S+")  # the keys and URIs a message quotes

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def one_line(exc: BaseException, limit: int = 300) -> str:
    """An error's text on one line: no terminal colours (delta-rs adds them), no tree arrows, at most ``limit``
    characters."""
    text = _ANSI.sub("", str(exc)).replace("\u21b3", " ")
    return " ".join(text.split())[:limit]


def is_transient_table_error(exc: BaseException) -> bool:
    """True for a transient S3 failure reported by a table format library (delta-rs, pyiceberg/pyarrow):
    :func:`is_transient`, or an error whose text names the S3 layer and a transient cause (see the module
    docstring). Auth errors, missing buckets and commit conflicts are never transient."""
    if is_transient(exc):
        return True
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e).lower()
        if any(m in text for m in _TABLE_PERMANENT_MARKERS) or _STATUS_403.search(_KEY_IN_QUOTES.sub("", text)):
            return False
        if any(m in text for m in _TABLE_S3_MARKERS) and any(m in text for m in _TABLE_TRANSIENT_MARKERS):
            return True
        e = e.__cause__ or e.__context__
    return False


def with_retries(fn: Callable[[], T], what: str, policy: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep, *,
                 transient: Callable[[BaseException], bool] = is_transient,
                 before_retry: Callable[[], None] | None = None) -> T:
    """``fn()``, retried on transient failures within the policy's time budget; the last error otherwise.
    ``transient`` classifies a failure (default :func:`is_transient`); ``before_retry`` runs before each retry
    (e.g. to drop a client's cached view of the table)."""
    policy = policy or RetryPolicy.from_env()
    start = time.monotonic()
    k = 0
    while True:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - classified below
            if not transient(e):
                raise
            delay = min(policy.max_backoff_s, policy.base_s * (2 ** k)) * (0.5 + random.random() / 2)
            spent = time.monotonic() - start
            if spent + delay > policy.budget_s:
                log.warning("%s: giving up after %d retries in %.1f s (PIPELINE_S3_RETRY_SECONDS=%g): %s",
                            what, k, spent, policy.budget_s, e)
                raise
            k += 1
            log.warning("%s: transient failure (%s: %s); retry %d in %.2f s", what, type(e).__name__,
                        one_line(e), k, delay)
            sleep(delay)
            if before_retry is not None:
                before_retry()
