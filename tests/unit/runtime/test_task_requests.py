"""Exact executor S3 request counts (pipeline.runtime.spark.task_requests, pipeline.fileio.request_counter recordings):
what a task function records, under which epoch, and how a round's counts are split over its checkpoints.
Spark's side (the accumulator travelling with mapInArrow functions to other workers) is in
tests/integration/test_s3_requests.py."""
from __future__ import annotations

import pytest
from pyspark.accumulators import Accumulator

from pipeline.fileio.request_counter import (
    RequestCounting,
    StorageRequests,
    attributed_to,
    close_recording,
    count_request,
    open_recording,
    recording,
    request_counts,
    take_unreported,
)
from pipeline.runtime.spark.task_requests import RoundRequests, TaskRequestCounter, _CountsParam, counted

pytestmark = pytest.mark.unit


def test_a_recording_holds_what_was_sent_inside_it_by_attribution():
    count_request("get")  # outside any recording: counted for the process, recorded nowhere
    assert not recording()
    open_recording()
    assert recording()
    count_request("get", 2)
    with attributed_to(7):
        count_request("put")
        with attributed_to(8):
            count_request("list")
        count_request("put")
    count_request("head")
    got = close_recording()
    assert not recording()
    assert got == {None: (0, 2, 1, 0, 0), 7: (0, 0, 0, 2, 0), 8: (1, 0, 0, 0, 0)}
    assert close_recording() == {}  # returned once


def test_nested_recordings_return_every_request_exactly_once():
    open_recording()
    count_request("get")
    open_recording()  # e.g. two task functions of one worker
    count_request("get")
    inner = close_recording()
    count_request("put")
    outer = close_recording()
    assert inner == {None: (0, 2, 0, 0, 0)} and outer == {None: (0, 0, 0, 1, 0)}


def test_take_unreported_is_unchanged_by_recordings():
    take_unreported()
    open_recording()
    count_request("delete", 3)
    close_recording()
    assert take_unreported() == StorageRequests(delete=3)


def test_counted_adds_the_task_records_to_the_accumulator_when_the_task_ends():
    acc = Accumulator(10_001, {}, _CountsParam())
    counter = TaskRequestCounter(acc)
    mark = counter.mark()
    before = request_counts()

    def task(batches):
        for b in batches:
            count_request("get")
            with attributed_to(3):
                count_request("put", 2)
            yield b

    out = list(counted(task, counter)(iter([1, 2])))
    assert out == [1, 2] and not recording()
    assert request_counts() - before == StorageRequests(get=2, put=4)
    got = counter.since(mark)
    assert got.counting is RequestCounting.EXACT
    assert dict(got.by_tag) == {None: StorageRequests(get=2), 3: StorageRequests(put=4)}
    assert got.total == StorageRequests(get=2, put=4)
    # a second task: the difference is its own
    mark = counter.mark()
    list(counted(task, counter)(iter([1])))
    assert counter.since(mark).total == StorageRequests(get=1, put=2)


def test_counted_records_a_task_that_fails_too_but_spark_drops_its_update():
    """The worker adds what a failing task recorded (the ``finally``), but PySpark sends no accumulator update
    for a failed task (the worker exits): Spark counts only successful attempts (docs/state.md)."""
    acc = Accumulator(10_002, {}, _CountsParam())

    def failing(batches):
        count_request("get")
        raise RuntimeError("boom")
        yield  # pragma: no cover

    with pytest.raises(RuntimeError):
        list(counted(failing, TaskRequestCounter(acc))(iter([])))
    assert not recording()


def test_without_a_counter_the_function_is_unwrapped():
    def task(batches):
        yield from batches
    assert counted(task, None) is task


def test_counts_param_adds_by_attribution():
    p = _CountsParam()
    a = p.zero({})
    a = p.addInPlace(a, {None: (1, 0, 0, 0, 0), 4: (0, 1, 0, 0, 0)})
    a = p.addInPlace(a, {4: (0, 2, 0, 1, 0)})
    assert a == {None: (1, 0, 0, 0, 0), 4: (0, 3, 0, 1, 0)}


def test_round_requests_per_epoch_of_a_tagged_round():
    r = RoundRequests({None: StorageRequests(put=2), 5: StorageRequests(get=3, put=1), 6: StorageRequests(get=4)})
    assert r.per_epoch([5, 6]) == [StorageRequests(get=3, put=3), StorageRequests(get=4)]
    assert r.per_epoch([5, 6])[0] + r.per_epoch([5, 6])[1] == r.total
    assert RoundRequests().per_epoch([1, 2]) == [StorageRequests(), StorageRequests()]


def test_reported_counts_are_approximate():
    from pipeline.checkpoint.report import ReportKind, TaskReport
    reports = [TaskReport(ReportKind.ACK, "op", 0, "", s3_requests=StorageRequests(get=2)),
               TaskReport(ReportKind.ACK, "op", 1, ""),
               TaskReport(ReportKind.ACK, "op", 2, "", s3_requests=StorageRequests(put=1))]
    r = RoundRequests.reported(reports)
    assert r.counting is RequestCounting.APPROXIMATE and r.total == StorageRequests(get=2, put=1)
