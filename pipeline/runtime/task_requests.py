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

Spark Connect has no accumulators: :meth:`TaskRequestCounter.for_session` returns None, the task functions run
unwrapped and each operator task reports its worker's requests not yet reported with its first report (the
approximate count, :attr:`~pipeline.fileio.request_counter.RequestCounting.APPROXIMATE`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from pipeline.fileio.request_counter import (
    KINDS,
    RequestCounting,
    StorageRequests,
    close_recording,
    open_recording,
)
from pipeline.runtime.session import is_connect_session

__all__ = ["RoundRequests", "TaskRequestCounter", "counted"]

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
    def reported(cls, reports: Sequence[Any]) -> "RoundRequests":
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
    def for_session(cls, spark: Any) -> "TaskRequestCounter | None":
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
            counter: "TaskRequestCounter | None") -> Callable[[Iterator[Any]], Iterator[Any]]:
    """``fn`` (a ``mapInArrow`` function), recording the S3 requests its worker sends while it runs and adding
    them to ``counter``'s accumulator at its end (before PySpark sends the task's accumulator updates). ``counter``
    None (Spark Connect): ``fn`` itself."""
    if counter is None:
        return fn
    acc = counter.accumulator  # only the accumulator travels with the task function

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        open_recording()
        try:
            yield from fn(batches)
        finally:
            recorded = close_recording()
            if recorded:
                acc.add(recorded)

    return task
