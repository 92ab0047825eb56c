"""Value objects: metadata JSON round trip, format check, frozenness; failure reasons; ack rows."""
from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from pipeline.checkpoint.ack import AckResult, TaskAcknowledgement, TaskMetrics, acks_from_reports
from pipeline.checkpoint.failure import CheckpointFailureReason as R
from pipeline.checkpoint.handles import ChannelStateHandle, FileHandle, Position, SinkHandle, StateHandle
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.checkpoint.stats import CheckpointStats, OperatorStats
from pipeline.exceptions import CheckpointError, CorruptCheckpointError

pytestmark = pytest.mark.unit

SHA = "ab" * 32


def fh(name: str, rows: int = 3, size: int = 100) -> FileHandle:
    return FileHandle(uri=f"s3://b/job/checkpoints/chk-7/rounds/0/{name}", rows=rows, bytes=size, sha256=SHA)


def sample_metadata() -> CheckpointMetadata:
    op_stats = OperatorStats(uid="join", subtasks=2, acks=2, rows=6, bytes=200, sync_ms=1.5, async_ms=2.25,
                             alignment_ms=0.0, start_delay_ms=0.1, inflight_bytes=0, mode="aligned", in_rows=10)
    return CheckpointMetadata(
        job="orders_payments", checkpoint_id=7, parent_id=6, kind="checkpoint", epoch=41,
        barrier_time="2024-01-01T10:00:00.000Z", checkpoint_mode="exactly_once", alignment="unaligned",
        max_parallelism=128, parallelism=2,
        positions={"orders": {"0": Position(3, 10), "1": Position(2, 0)}, "payments": {"0": {"seq": 5, "row": 1}}},
        barriers={"orders": {"0": Position(3, 10), 1: Position(2, 0)}},
        channel_state=(
            ChannelStateHandle("join", 0, "right", file=fh("chan-0")),
            ChannelStateHandle("join", 1, "left", source="orders", partition=1, start=Position(1, 0),
                               end=Position(1, 50)),
        ),
        operators={"join": (StateHandle("join", 0, 0, 63, "left", fh("l0")), StateHandle("join", 1, 64, 127, "left", None))},
        sinks={"paid_orders": SinkHandle((FileHandle("s3://b/sink/job/paid_orders/data/txn-7/part-00000.parquet",
                                                     4, 400, SHA),), full=False),
               "merchant_revenue": {"files": [], "full": True}},
        stats=CheckpointStats(trigger_time="2024-01-01T10:00:01.000Z", duration_ms=1234.5, sync_ms=1.5,
                              async_ms=2.25, bytes=200, rows=6, acks=2, expected_acks=2, rounds=2,
                              operators={"join": op_stats}, backlog={"orders": 5}, dead_letters={"payments": 1}),
        created_at="2024-01-01T10:00:02.000Z", extra={"plan": {"segments": [1, 2, {"x": None}]}},
    )


def test_json_round_trip_is_exact():
    md = sample_metadata()
    text = md.to_json()
    back = CheckpointMetadata.from_json(text, "mem://_metadata")
    assert back == md
    assert back.to_json() == text
    assert CheckpointMetadata.from_json(text.encode()).to_json() == text
    d = json.loads(text)
    assert d["format"] == 1
    assert d["positions"]["orders"]["1"] == {"seq": 2, "row": 0}
    assert d["sinks"]["merchant_revenue"] == {"files": [], "full": True}
    assert back.channel_state[1].partition == 1        # an int in memory ...
    assert d["channel_state"][1]["partition"] == "1"    # ... its string key on disk, as before


def test_partition_keys_normalised_to_strings():
    md = sample_metadata()
    assert set(md.barriers["orders"]) == {"0", "1"}
    assert md.positions["payments"]["0"] == Position(5, 1)


def test_frozen_all_the_way_down_and_picklable():
    md = sample_metadata()
    with pytest.raises(dataclasses.FrozenInstanceError):
        md.checkpoint_id = 8  # type: ignore[misc]
    with pytest.raises(TypeError):
        md.positions["orders"]["9"] = Position(0, 0)  # type: ignore[index]
    with pytest.raises(TypeError):
        md.sinks.pop("paid_orders")  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        md.extra["plan"]["segments"] = ()  # type: ignore[index]
    assert pickle.loads(pickle.dumps(md)) == md


def test_referenced_files():
    md = sample_metadata()
    uris = [f.uri for f in md.referenced_files()]
    assert uris[0].endswith("/l0") and uris[1].endswith("/chan-0") and uris[2].endswith("part-00000.parquet")
    assert len(uris) == 3


def test_unknown_format_is_corrupt_naming_the_uri():
    d = sample_metadata().to_dict()
    d["format"] = 99
    with pytest.raises(CorruptCheckpointError, match=r"format 99 in s3://b/job/checkpoints/chk-7/_metadata"):
        CheckpointMetadata.from_json(json.dumps(d), "s3://b/job/checkpoints/chk-7/_metadata")


@pytest.mark.parametrize("text,match", [
    ("{not json", "invalid JSON"),
    ("[]", "not a JSON object"),
    ("", "invalid JSON"),
])
def test_garbage_is_corrupt(text, match):
    with pytest.raises(CorruptCheckpointError, match=match) as err:
        CheckpointMetadata.from_json(text, "file:///x/_metadata")
    assert "file:///x/_metadata" in str(err.value)


def test_missing_field_is_named():
    d = sample_metadata().to_dict()
    del d["epoch"]
    with pytest.raises(CorruptCheckpointError, match="missing field 'epoch'"):
        CheckpointMetadata.from_dict(d, "u")


def test_invalid_values_rejected():
    d = sample_metadata().to_dict()
    d["parent_id"] = 7
    with pytest.raises(CorruptCheckpointError, match="parent 7 must be older"):
        CheckpointMetadata.from_dict(d, "u")
    with pytest.raises(ValueError, match="kind"):
        dataclasses.replace(sample_metadata(), kind="snapshot")
    with pytest.raises(ValueError, match="parallelism"):
        dataclasses.replace(sample_metadata(), parallelism=129)


def test_position_order_and_validation():
    assert Position(1, 5) < Position(2, 0) < Position(2, 1)
    assert max([Position(0, 9), Position(3, 0), Position(2, 99)]) == Position(3, 0)
    with pytest.raises(ValueError):
        Position(-1, 0)


def test_failure_reason_flags_follow_flink():
    assert R.CHECKPOINT_EXPIRED.counts_as_failure and not R.CHECKPOINT_EXPIRED.is_pre_flight
    assert R.CHECKPOINT_DECLINED.counts_as_failure
    assert R.FINALIZE_CHECKPOINT_FAILURE.counts_as_failure
    assert R.TOO_MANY_CHECKPOINT_REQUESTS.is_pre_flight and not R.TOO_MANY_CHECKPOINT_REQUESTS.counts_as_failure
    assert R.IO_EXCEPTION.is_pre_flight and R.IO_EXCEPTION.counts_as_failure
    for r in (R.CHECKPOINT_SUBSUMED, R.CHECKPOINT_COORDINATOR_SHUTDOWN, R.TASK_FAILURE, R.JOB_FAILOVER_REGION,
              R.CHECKPOINT_FENCED):
        assert not r.counts_as_failure, r
    assert all(r.value == r.name and r.message for r in R)
    assert R("CHECKPOINT_EXPIRED") is R.CHECKPOINT_EXPIRED


def test_ack_result_members():
    assert {a.name for a in AckResult} == {"SUCCESS", "DUPLICATE", "UNKNOWN", "DISCARDED"}


def decoded(rows: list[dict]):
    """Rows as an operator task's ``mapInArrow`` result carries them, decoded by the one codec."""
    import pyarrow as pa

    from pipeline.runtime.operators.report_codec import REPORT_SCHEMA, from_table
    return from_table(pa.Table.from_pylist(rows, schema=REPORT_SCHEMA))


def runtime_row(kind, op, name, subtask, uri, rows=1, size=10, **kw):
    row = {"kind": kind, "operator": op, "name": name, "subtask": subtask, "kg_start": subtask * 64,
           "kg_end": subtask * 64 + 63, "uri": uri, "rows": rows, "bytes": size, "sha256": SHA if uri else None,
           "in_rows": 7, "restored_rows": 0, "expired_rows": 0, "sync_ms": 1.0, "async_ms": 2.0}
    row.update(kw)
    return row


def test_acks_from_runtime_handle_rows():
    rows = [
        runtime_row("state", "join", "left", 1, "file:///s/l1", async_ms=5.0),
        runtime_row("state", "join", "right", 1, None, rows=0, size=0),
        runtime_row("output", "join", "paid_orders", 1, "file:///sink/txn-3/part-00001.parquet"),
        runtime_row("state", "join", "left", 0, "file:///s/l0"),
        runtime_row("output", "join", "paid_orders", 0, None),
        runtime_row("state", "agg", "agg", 0, "file:///s/a0"),
    ]
    acks = acks_from_reports(decoded(rows))
    assert [a.task for a in acks] == [("agg", 0), ("join", 0), ("join", 1)]
    j1 = acks[2]
    assert [h.name for h in j1.state] == ["left", "right"]
    assert j1.state[1].file is None and j1.state[0].file.uri == "file:///s/l1"
    assert (j1.state[0].kg_start, j1.state[0].kg_end) == (64, 127)
    assert [f.uri for f in j1.sink_files["paid_orders"]] == ["file:///sink/txn-3/part-00001.parquet"]
    assert acks[1].sink_files["paid_orders"] == ()  # table known, no file
    assert j1.metrics.async_ms == 5.0 and j1.metrics.sync_ms == 1.0 and j1.metrics.in_rows == 7


def test_report_codec_rejects_unknown_kind():
    with pytest.raises(CheckpointError, match="unknown kind 'bogus'"):
        decoded([runtime_row("bogus", "join", "x", 0, None)])


def test_ack_handles_must_belong_to_the_task():
    with pytest.raises(CheckpointError, match=r"join\[1\].*join\[0\]"):
        TaskAcknowledgement(operator_uid="join", subtask=0, state=(StateHandle("join", 1, 0, 1, "left"),))


def test_stats_round_trip():
    s = sample_metadata().stats
    assert CheckpointStats.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert TaskMetrics.from_dict(TaskMetrics(sync_ms=3, mode="unaligned").to_dict()) == TaskMetrics(3.0, mode="unaligned")


def test_stats_carry_s3_requests_typed_and_older_metadata_has_none():
    from pipeline.fileio.request_counter import StorageRequests
    s = CheckpointStats(trigger_time="2024-01-01T10:00:01.000Z",
                        s3_requests=StorageRequests(list=3, get=5, head=1, put=4, delete=2))
    d = json.loads(json.dumps(s.to_dict()))
    assert d["s3_requests"] == {"list": 3, "get": 5, "head": 1, "put": 4, "delete": 2}
    back = CheckpointStats.from_dict(d)
    assert back == s and isinstance(back.s3_requests, StorageRequests) and back.s3_requests.total == 15
    del d["s3_requests"]
    assert CheckpointStats.from_dict(d).s3_requests is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        back.s3_requests.list = 0  # type: ignore[misc,union-attr]
    assert StorageRequests(1, 2, 3, 4, 5) - StorageRequests(1, 1, 1, 1, 1) == StorageRequests(0, 1, 2, 3, 4)


def test_checkpoints_show_prints_the_s3_requests():
    from pipeline.checkpoint.completed import CompletedCheckpoint
    from pipeline.checkpoint.history import checkpoint_summary, format_show
    from pipeline.fileio.request_counter import StorageRequests
    md = sample_metadata()
    md = dataclasses.replace(md, stats=dataclasses.replace(md.stats, s3_requests=StorageRequests(19, 31, 9, 6, 1)))
    d = checkpoint_summary(CompletedCheckpoint(md, "s3://b/ck/chk-7"))
    assert d["s3_requests"] == {"list": 19, "get": 31, "head": 9, "put": 6, "delete": 1}
    d.update(positions={}, barriers={}, operators={}, subtasks=[], channel_state=[], sinks={}, extra={})
    assert ("  S3 requests (driver, since the previous checkpoint): LIST 19, GET 31, HEAD 9, PUT 6, DELETE 1, "
            "total 66") in format_show(d).splitlines()


def test_executor_requests_say_how_they_were_counted():
    from pipeline.checkpoint.completed import CompletedCheckpoint
    from pipeline.checkpoint.history import checkpoint_summary, format_show
    from pipeline.fileio.request_counter import RequestCounting, StorageRequests
    s = CheckpointStats(trigger_time="2024-01-01T10:00:01.000Z", executor_s3_requests=StorageRequests(get=2, put=3),
                        executor_s3_requests_counting=RequestCounting.EXACT)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["executor_s3_requests_counting"] == "exact"
    assert CheckpointStats.from_dict(d) == s
    del d["executor_s3_requests_counting"]  # older _metadata: not recorded
    assert CheckpointStats.from_dict(d).executor_s3_requests_counting is None
    for counting, words in ((RequestCounting.EXACT, "exact: every task of this checkpoint's rounds"),
                            (RequestCounting.APPROXIMATE, "approximate: reported with the next operator task")):
        md = sample_metadata()
        md = dataclasses.replace(md, stats=dataclasses.replace(md.stats, executor_s3_requests=StorageRequests(1, 2),
                                                               executor_s3_requests_counting=counting))
        row = checkpoint_summary(CompletedCheckpoint(md, "s3://b/ck/chk-7"))
        assert row["executor_s3_requests_counting"] == counting.value
        row.update(positions={}, barriers={}, operators={}, subtasks=[], channel_state=[], sinks={}, extra={})
        line = [ln for ln in format_show(row).splitlines() if "S3 requests (executors" in ln]
        assert line and words in line[0] and "LIST 1, GET 2" in line[0], line
