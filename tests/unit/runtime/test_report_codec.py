"""The one codec of task reports at the Spark boundary: what a task builds is what the driver decodes, through a
``mapInArrow`` batch, an Arrow table (``DataFrame.toArrow``) and a chained operator's IPC ack object; the state
handles decoded are the ones ``_metadata`` serialises with the checkpoint's own codec."""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.checkpoint.ack import acks_from_reports
from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.exceptions import CheckpointError
from pipeline.fileio.request_counter import StorageRequests
from pipeline.runtime.operators.report_codec import REPORT_DDL, REPORT_SCHEMA, from_ipc, from_table, to_batch, to_ipc

pytestmark = pytest.mark.unit

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_uri = _text.map(lambda s: f"s3://b/job/shared/op/{s}.parquet")
_n = st.integers(0, 2**40)
_ms = st.floats(0, 1e9, allow_nan=False)
_files = st.builds(FileHandle, uri=_uri, rows=_n, bytes=_n, sha256=st.text("0123456789abcdef", min_size=64,
                                                                                max_size=64))


@st.composite
def _reports(draw) -> TaskReport:
    kind = draw(st.sampled_from(list(ReportKind)))
    uid, sub, name = draw(_text), draw(st.integers(0, 2**31 - 1)), draw(_text)
    kg_start = draw(st.integers(0, 2**15))
    kg_end = draw(st.integers(kg_start - 1, 2**15))
    metrics = dict(in_rows=draw(_n), restored_rows=draw(_n), expired_rows=draw(_n), sync_ms=draw(_ms),
                   async_ms=draw(_ms), ack_ts_ms=draw(_ms), alignment_ms=draw(_ms), start_delay_ms=draw(_ms),
                   mode=draw(st.none() | st.sampled_from(["aligned", "unaligned", "at_least_once"])),
                   s3_requests=draw(st.none() | st.builds(StorageRequests, *[st.integers(0, 10**6)] * 5)),
                   checkpoint_id=draw(st.none() | st.integers(0, 2**62)))  # tagged rounds: the acknowledged checkpoint
    if kind is ReportKind.STATE:
        base = draw(st.none() | _files)
        state = StateHandle(operator_uid=uid, subtask=sub, kg_start=kg_start, kg_end=kg_end, name=name, file=base,
                            deltas=tuple(draw(st.lists(_files, max_size=3))) if base else (),
                            state_rows=draw(st.none() | _n) if base else None,
                            persisted_bytes=draw(st.none() | _n) if base else None)
        return TaskReport(ReportKind.STATE, uid, sub, name, kg_start, kg_end, state=state, **metrics)
    return TaskReport(kind, uid, sub, name, kg_start, kg_end,
                      file=None if kind in (ReportKind.DROPPED, ReportKind.ACK) else draw(st.none() | _files),
                      count=draw(_n) if kind is ReportKind.DROPPED else 0, **metrics)


@settings(max_examples=200, deadline=None)
@given(st.lists(_reports(), max_size=6))
def test_reports_round_trip_through_a_batch_a_table_and_an_ack_object(reports):
    batch = to_batch(reports)
    assert batch.schema == REPORT_SCHEMA and batch.num_rows == len(reports)
    assert from_table(batch) == reports
    assert from_table(pa.Table.from_batches([batch])) == reports
    assert from_ipc(to_ipc(reports)) == reports


@settings(max_examples=100, deadline=None)
@given(st.lists(_reports().filter(lambda r: r.kind is ReportKind.STATE), min_size=1, max_size=4))
def test_decoded_state_handles_are_what_metadata_serialises(reports):
    """Task -> Spark row -> driver -> ``_metadata`` JSON -> restore: one typed value all the way."""
    decoded = from_table(to_batch(reports))
    handles = [h for a in acks_from_reports(decoded) for h in a.state]
    assert sorted(handles, key=repr) == sorted((r.state for r in reports), key=repr)
    for h in handles:
        assert StateHandle.from_dict(h.to_dict()) == h
    md = CheckpointMetadata(format=1, job="j", checkpoint_id=3, parent_id=None, kind="checkpoint", epoch=2,
                            barrier_time="2024-01-01T00:00:00Z", checkpoint_mode="exactly_once", alignment="aligned",
                            max_parallelism=8, parallelism=1, operators={"op": tuple(handles)})
    assert CheckpointMetadata.from_json(md.to_json()).operators["op"] == tuple(handles)


def test_ddl_is_the_schema_and_a_wrong_kind_is_named():
    assert REPORT_DDL.startswith("`kind` string, `operator` string")
    bad = pa.Table.from_pylist([{"kind": "bogus", "operator": "join", "name": "x", "subtask": 2}],
                               schema=REPORT_SCHEMA)
    with pytest.raises(CheckpointError, match=r"join\[2\] has unknown kind 'bogus'"):
        from_table(bad)


def test_a_report_refuses_what_its_kind_cannot_carry():
    h = StateHandle("op", 1, 0, 3, "left")
    with pytest.raises(ValueError, match="its state handle is of op\\[1\\]"):
        TaskReport(ReportKind.STATE, "op", 2, "left", 0, 3, state=h)
    with pytest.raises(ValueError, match="only state reports"):
        TaskReport(ReportKind.OUTPUT, "op", 1, "t", state=h)
    with pytest.raises(ValueError, match="only a dropped report"):
        TaskReport(ReportKind.OUTPUT, "op", 1, "t", count=3)


def test_acks_combine_a_subtasks_reports():
    f = FileHandle("s3://b/c.parquet", 5, 100, "ab" * 32)
    reports = [TaskReport.of_state(StateHandle("j", 0, 0, 3, "left", f), sync_ms=3.0, in_rows=9),
               TaskReport(ReportKind.CHANNEL, "j", 0, "right", 0, 3, file=f, async_ms=4.0, in_rows=9),
               TaskReport(ReportKind.OUTPUT, "j", 0, "t", 0, 3, file=None),
               TaskReport(ReportKind.ACK, "j", 0, "", mode="unaligned", alignment_ms=7.0)]
    [ack] = acks_from_reports(from_table(to_batch(reports)))
    assert ack.state[0].file == f and ack.channel_state[0].channel == "right"
    assert ack.sink_files["t"] == ()
    m = ack.metrics
    assert (m.sync_ms, m.async_ms, m.alignment_ms, m.in_rows, m.inflight_bytes, m.mode) == (
        3.0, 4.0, 7.0, 9, 100, "unaligned")


def test_round_parameters_carry_the_same_typed_handles_to_the_task():
    """Driver -> task (a Spark local property, JSON): the parent's StateHandles, the replayed channel files and the
    staged output files come back as the same values in the task's spec."""
    import dataclasses
    import json

    from pipeline.runtime.operators.round_params import apply_params, operator_params
    from pipeline.runtime.spark.dataflow import OperatorIO

    f = FileHandle("s3://b/job/shared/op/a.parquet", 3, 30, "cd" * 32)
    h = StateHandle("op", 1, 4, 7, "left", f, (f,), 6, 60)
    io = OperatorIO(checkpoint="chk-3", parallelism=2, max_parallelism=8, parent_handles={"left": [h]},
                    state_prefix="s", output_prefix="o", output_name="t", file_tag="r0", ttl_cutoff_us=None,
                    replay_handles={"right": [f]}, prior_output=((1, f),))
    wire = json.loads(json.dumps(operator_params(io)))
    spec = apply_params(dataclasses.replace(io, parent_handles={}, replay_handles=None, prior_output=()), wire)
    assert spec.parent_handles == {"left": (h,)} and spec.replay_handles == {"right": (f,)}
    assert spec.prior_output == ((1, f),)
