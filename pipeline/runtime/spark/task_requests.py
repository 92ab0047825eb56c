"""The executors' S3 requests of a round, counted exactly per task and attributed to the checkpoint they served.

Every task function of a round's Spark plan (source reads, operator tasks: state chains, sink staging, dead
letters, ack objects) is wrapped by :func:`counted`: while it runs, its Python worker records each S3 request it
sends (:func:`pipeline.fileio.request_counter.open_recording`), under the epoch tag of the work running (a tagged
round's source split run or one-epoch body, :func:`~pipeline.fileio.request_counter.attributed_to`; None
elsewhere), and at its end adds the records to a Spark accumulator. The driver reads the accumulator before and
after a round (:class:`TaskRequestCounter`): the difference is the round's requests, whichever worker ran which
task (:class:`RoundRequests`).

Semantics (Spark's accumulator rules, docs/state.md "S3 requests per epoch"):

* a task attempt that **fails** (an exception, a killed worker) sends no accumulator update: its requests are
  not counted; a retried attempt that succeeds counts its own requests. The count is of the successful
  attempts, once each: what the round's result was made of. The requests of failed attempts are real (S3 bills
  them) and are visible at the storage (the moto server's request log in the tests), not in the stats;
* a **speculative** duplicate of a result task is not counted (Spark merges a result task's update once); a
  shuffle-map task that runs again (a speculative copy that also succeeds, a stage recomputed after a fetch
  failure) is counted again (its requests were sent again and its output used);
* a round that fails counts nowhere (its checkpoint fails); the next round starts a new difference.

**Outside rounds** (bootstrap, export, validation): :class:`RequestSpan` counts one command's requests the same
way: the driver's (the process counter's difference over the span) and the executors' (the task functions the
command builds inside the span are wrapped by :func:`counted_in_span`, onto the span's own accumulator); the
command reports them in its result (``s3_requests``: :meth:`SpanRequests.to_dict`).

Spark Connect has no accumulators: :meth:`TaskRequestCounter.for_session` returns None, the task functions run
unwrapped and each operator task reports its worker's requests not yet reported with its first report (the
approximate count, :attr:`~pipeline.fileio.request_counter.RequestCounting.APPROXIMATE`).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipeline.fileio.request_counter import (
    KINDS,
    RequestCounting,
    StorageRequests,
    close_recording,
    open_recording,
    request_counts,
)
from pipeline.runtime.spark.session import is_connect_session

__all__ = ["RequestSpan", "RoundRequests", "SpanRequests", "TaskRequestCounter", "counted", "counted_in_span"]

_Counts = dict  # {epoch tag or None: (list, get, head, put, delete)}


class _CountsParam:
    """The accumulator's algebra (PySpark's ``AccumulatorParam`` protocol): counts by attribution, added up."""

    def zero(self, value: _Counts) -> _Counts:
        return {}

    def addInPlace(self, a: _Counts, b: _Counts) -> _Counts:  # noqa: N802 - PySpark's name
        for k, v in b.items():
            old = a.get(k)
            a[k] = tuple(v) if old is None else tuple(x + y for x, y in zip(old, v))
        return a


def _requests(counts: Sequence[int]) -> StorageRequests:
    return StorageRequests(**dict(zip(KINDS, counts)))


@dataclass(frozen=True, slots=True)
class RoundRequests:
    """The executors' S3 requests of one round, by the epoch tag they were attributed to (None: work of no single
    epoch, e.g. a tagged round's ack objects, or any work of a one-epoch round)."""

    by_tag: Mapping[int | None, StorageRequests] = field(default_factory=dict)
    counting: RequestCounting = RequestCounting.EXACT

    @property
    def total(self) -> StorageRequests:
        out = StorageRequests()
        for r in self.by_tag.values():
            out = out + r
        return out

    def per_epoch(self, epochs: Sequence[int]) -> list[StorageRequests]:
        """The requests of each of ``epochs`` (a tagged round's, ascending): what was attributed to it; work of no
        single epoch goes to the first (whose checkpoint holds the round's ack objects). Tags outside ``epochs``
        (none are expected) go to the first too, so the total is kept."""
        out = [StorageRequests() for _ in epochs]
        index = {e: i for i, e in enumerate(epochs)}
        for tag, r in self.by_tag.items():
            i = index.get(tag, 0) if tag is not None else 0
            out[i] = out[i] + r
        return out

    @classmethod
    def reported(cls, reports: Sequence[Any]) -> RoundRequests:
        """The approximate count: the sum of the ``s3_requests`` the tasks reported (Spark Connect)."""
        total = StorageRequests()
        for r in reports:
            if r.s3_requests is not None:
                total = total + r.s3_requests
        return cls({None: total}, RequestCounting.APPROXIMATE)


class TaskRequestCounter:
    """The driver's side: one accumulator per Spark plan (session), read around each round."""

    def __init__(self, accumulator: Any) -> None:
        self.accumulator = accumulator

    @classmethod
    def for_session(cls, spark: Any) -> TaskRequestCounter | None:
        """A counter on ``spark``'s context; None where there are no accumulators (Spark Connect)."""
        sc = None if is_connect_session(spark) else getattr(spark, "sparkContext", None)
        if sc is None:
            return None
        return cls(sc.accumulator({}, _CountsParam()))

    def mark(self) -> dict:
        """The accumulator's value now (a copy)."""
        return dict(self.accumulator.value)

    def since(self, mark: Mapping) -> RoundRequests:
        """The requests of the tasks that completed since ``mark``, by attribution."""
        now = dict(self.accumulator.value)
        out: dict[int | None, StorageRequests] = {}
        for tag, counts in now.items():
            before = mark.get(tag)
            diff = counts if before is None else tuple(x - y for x, y in zip(counts, before))
            if any(diff):
                out[tag] = _requests(diff)
        return RoundRequests(out, RequestCounting.EXACT)


def counted(fn: Callable[[Iterator[Any]], Iterator[Any]],
            counter: TaskRequestCounter | None) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """``fn`` (a ``mapInArrow`` function), recording the S3 requests its worker sends while it runs and adding
    them to ``counter``'s accumulator at its end (before PySpark sends the task's accumulator updates), and to
    the accumulators of the :class:`RequestSpan` s open on the driver when ``fn`` is wrapped (a command outside
    rounds that runs rounds, e.g. a validation's replay). No accumulator at all (Spark Connect): ``fn`` itself."""
    accs = ([counter.accumulator] if counter is not None else []) + [
        c.accumulator for c in (span.counter for span in _SPANS) if c is not None]
    if not accs:
        return fn

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        open_recording()
        try:
            yield from fn(batches)
        finally:
            recorded = close_recording()
            if recorded:
                for acc in accs:
                    acc.add(recorded)

    return task


#: executors' requests without accumulators (Spark Connect): said so in the reports, never a silent zero
NOT_COUNTED_CONNECT = "not counted (Spark Connect: no accumulators)"


@dataclass(frozen=True, slots=True)
class SpanRequests:
    """The S3 requests of one command outside rounds (bootstrap, export, validation): the driver's and the
    executors' (None: not counted, ``executor_counting`` says why)."""

    driver: StorageRequests
    executors: StorageRequests | None
    executor_counting: str  # "exact" | NOT_COUNTED_CONNECT | "no executors" (no Spark session)

    def to_dict(self) -> dict[str, Any]:
        return {"driver": self.driver.to_dict(),
                "executors": None if self.executors is None else self.executors.to_dict(),
                "executor_counting": self.executor_counting}


_SPANS: list[RequestSpan] = []  # the driver's open spans (innermost last)


class RequestSpan:
    """Counts one command's S3 requests (a context manager on the driver; :meth:`requests` during or after it):
    the driver's process counter's difference, and the requests of the executors' task functions wrapped while
    the span is open (:func:`counted_in_span`, and every round's task function, :func:`counted`) onto an
    accumulator of the span's own. ``spark``: the session, or ``session``: a callable giving it once a Spark task
    is built (None while there is none: a command that may run without Spark, e.g. a local validation pass)."""

    def __init__(self, spark: Any = None, *, session: Callable[[], Any] | None = None) -> None:
        self._session = session if session is not None else (lambda: spark)
        self._counter: TaskRequestCounter | None = None
        self._connect = False
        self._driver0 = request_counts()
        self._result: SpanRequests | None = None

    @property
    def counter(self) -> TaskRequestCounter | None:
        """The span's accumulator (created on the session at first need; None without one, or on Connect)."""
        if self._counter is None and not self._connect:
            spark = self._session()
            if spark is not None:
                if is_connect_session(spark):
                    self._connect = True
                else:
                    self._counter = TaskRequestCounter.for_session(spark)
        return self._counter

    def __enter__(self) -> RequestSpan:
        self._driver0 = request_counts()
        _SPANS.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._result = self._now()
        if self in _SPANS:
            _SPANS.remove(self)

    def _now(self) -> SpanRequests:
        driver = request_counts() - self._driver0
        counter = self.counter
        if counter is not None:  # a fresh accumulator: everything in it is the span's
            return SpanRequests(driver, counter.since({}).total, RequestCounting.EXACT.value)
        if self._connect:
            return SpanRequests(driver, None, NOT_COUNTED_CONNECT)
        return SpanRequests(driver, StorageRequests(), "exact (no Spark session: no executor ran)")

    def requests(self) -> SpanRequests:
        """The span's requests (up to its end, or up to now while it is open)."""
        return self._result if self._result is not None else self._now()


def counted_in_span(fn: Callable[[Iterator[Any]], Iterator[Any]]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """``fn`` (a task function built on the driver) counted onto the open :class:`RequestSpan` s' accumulators
    (``fn`` itself outside a span, or without accumulators)."""
    return counted(fn, None)
