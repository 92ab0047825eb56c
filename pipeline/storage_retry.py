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
"""
from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

__all__ = ["RetryPolicy", "is_transient", "with_retries"]

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
    def from_env(cls) -> "RetryPolicy":
        env = os.environ
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


def with_retries(fn: Callable[[], T], what: str, policy: RetryPolicy | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """``fn()``, retried on transient failures within the policy's time budget; the last error otherwise."""
    policy = policy or RetryPolicy.from_env()
    start = time.monotonic()
    k = 0
    while True:
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - classified below
            if not is_transient(e):
                raise
            delay = min(policy.max_backoff_s, policy.base_s * (2 ** k)) * (0.5 + random.random() / 2)
            spent = time.monotonic() - start
            if spent + delay > policy.budget_s:
                log.warning("%s: giving up after %d retries in %.1f s (PIPELINE_S3_RETRY_SECONDS=%g): %s",
                            what, k, spent, policy.budget_s, e)
                raise
            k += 1
            log.warning("%s: transient failure (%s: %s); retry %d in %.2f s", what, type(e).__name__,
                        str(e)[:200], k, delay)
            sleep(delay)
