"""A join carries both inputs' watermark channels (docs/concepts/watermarks.md, issue 32 item 3): the graph rule of
:mod:`pipeline.windows.channels`, the kernel's channel sets (:func:`pipeline.operators.join.join_step` with
``channel=``) and a property test of the whole fold against a model of this test's own, without Spark.

The model: two sources whose partitions lag each other in event time feed a join (inner, left or full) on a key; a
window reads the join's rows with the left row's event time. Every output row carries the channels of the rows it
was made of (a pair both, a lone outer row its own side's) and counts for each; a channel is active in an epoch iff
some output row of that epoch carries it; ``W(m) = max(W(m-1), min over active c of M_c(m) - O)``. The model
enumerates the pairs with nested loops from the join's definition (a pair is emitted in the round of its later row
if both rows are alive then; an outer row that never paired is emitted, alone, in the round it expires) and spells
channel sets with Python sets. The runtime side is what the tasks do: the join kernel round by round (its state
carried, with the channel column), the window's :func:`observe_channels` over the rows it receives and
:meth:`WatermarkState.advance`, checkpointed and restored each epoch.
"""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import Job
from pipeline.batch.evaluation.wm_channels import split_maxima, watermark_fold
from pipeline.exceptions import ConfigError, IncompatibleStateError
from pipeline.job import WindowNode
from pipeline.operators.channel_sets import SEPARATOR, canonical, split_channels, union_channels
from pipeline.operators.join import JoinType, Uniqueness, join_step
from pipeline.runtime.operators.join import JoinTaskSpec, _channel_state_guard
from pipeline.windows import WatermarkState, observe_channels
from pipeline.windows.channels import check_channel_names, fixed_channels, forwards_channels, needs_channels

pytestmark = pytest.mark.unit

SEC = 1_000_000
E = 60 * SEC          # the epoch length of the model (µs)
TS = pa.timestamp("us", tz="UTC")
CH = "_wm_channel"
LEFT = pa.schema([("id", pa.string()), ("et", TS), ("_ingest_ts", TS)])
RIGHT = pa.schema([("id", pa.string()), ("rv", pa.int64()), ("_ingest_ts", TS)])
AGGS = {"n": ("count", None)}


def _window(s, uid="w"):
    return s.window(uid=uid, key="id", event_time="et", size_seconds=60, max_out_of_orderness_seconds=5, aggs=AGGS)


def _win(job: Job) -> WindowNode:
    return next(op for op in job.operators() if isinstance(op, WindowNode))


# ------------------------------------------------------------------------------------------------ the graph rules
def test_a_join_forwards_both_inputs_channels_to_a_window():
    job = Job("j1")
    a, b = job.source("a", LEFT), job.source("b", RIGHT)
    j = a.join(b, on="id", uid="j")
    _window(j).sink("out")
    assert forwards_channels(job.nodes[j.node], job) and needs_channels(job, j.node)
    assert fixed_channels(job, _win(job).parent) == frozenset()   # every row carries its channel set


def test_a_join_no_window_reads_keeps_its_state_format():
    job = Job("j2")
    a, b = job.source("a", LEFT), job.source("b", RIGHT)
    j = a.join(b, on="id", uid="j", how="left")
    j.sink("pairs")
    assert forwards_channels(job.nodes[j.node], job) and not needs_channels(job, j.node)


def test_channels_reach_the_window_through_joins_and_deduplicates():
    job = Job("j3")
    a, b, c = job.source("a", LEFT), job.source("b", RIGHT), job.source("c", pa.schema([("id", pa.string()),
                                                                                         ("cv", pa.int64()),
                                                                                         ("_ingest_ts", TS)]))
    d = a.deduplicate(uid="dd", key="id")
    j1 = d.join(b, on="id", uid="j1")
    j2 = j1.join(c, on="id", uid="j2").deduplicate(uid="d2", key="id")
    _window(j2.select("id", "et")).sink("out")
    assert all(needs_channels(job, n) for n in (d.node, j1.node, j2.node))
    # a union of two joins: each row carries its own set, so the batch evaluation can check it (was NOT CHECKED)
    u = j1.select("id", "et").union(a.join(c, on="id", uid="j4").select("id", "et"))
    assert fixed_channels(job, u.node) == frozenset()


def test_a_retracting_join_does_not_forward():
    job = Job("j4")
    a, b = job.source("a", LEFT), job.source("b", RIGHT)
    agg = b.aggregate(uid="agg", key="id", aggs={"total": ("sum", "rv")})
    j = a.join(agg, on="id", uid="rj")
    assert job.retracting_join(job.nodes[j.node]) and not forwards_channels(job.nodes[j.node], job)


def test_a_source_name_with_the_separator_is_refused_when_a_join_carries_channels():
    job = Job("j5")
    job.source(f"a{SEPARATOR}x", LEFT)
    with pytest.raises(ConfigError, match="rename the source"):
        check_channel_names(job, "j")


# ------------------------------------------------------------------------------------------------ channel sets
def test_channel_sets_are_spelled_sorted_and_distinct():
    got = union_channels(pa.chunked_array([["b/1", "a/0", None, f"x{SEPARATOR}a/0", None]]),
                         pa.array(["a/0", "c/2", "d/0", None, None]))
    assert got.to_pylist() == ["a/0|b/1", "a/0|c/2", "d/0", "a/0|x", None]
    assert split_channels("a/0|b/1") == ("a/0", "b/1") and canonical(["b", "a", "b"]) == "a|b"
    obs = observe_channels(pa.array(["a/0|b/1", "a/0", "b/1|c/0"]), pa.array([5, 9, 7], pa.int64()).cast(TS))
    assert obs == {"a/0": 9, "b/1": 7, "c/0": 7}
    # the batch fold splits the sets the same way
    assert split_maxima([(0, "a/0|b/1", 5), (0, "a/0", 9), (1, "b/1", 3)]) == [(0, "a/0", 9), (0, "b/1", 5),
                                                                               (1, "b/1", 3)]


def test_restoring_state_without_the_channel_column_is_a_clear_error():
    spec = JoinTaskSpec("j", "chk-3", "id", (), (), (), 1, 128, None, {}, "", "", "", "", LEFT, RIGHT, LEFT,
                        channel=CH)
    with pytest.raises(IncompatibleStateError, match="bootstrap"):
        with _channel_state_guard(spec):
            pa.table({"id": ["x"]}).select(["id", CH])
    with pytest.raises(KeyError):   # a join that carries no channel: the error is not about channels
        with _channel_state_guard(JoinTaskSpec("j", "chk-3", "id", (), (), (), 1, 128, None, {}, "", "", "", "",
                                               LEFT, RIGHT, LEFT)):
            pa.table({"id": ["x"]}).select(["id", "other"])


# ------------------------------------------------------------------------------------------------ the property
@st.composite
def scenarios(draw):
    """Rows of two sources: per partition an event-time lag (partitions progress at different speeds), 0-3 rows
    per epoch (0: idle), keys from a small set; one partition of the right side may never match (keys of its own)."""
    epochs = draw(st.integers(1, 6))
    rows: dict[str, list[dict]] = {"left": [], "right": []}
    for side, src in (("left", "a"), ("right", "b")):
        for p in range(draw(st.integers(1, 3))):
            lag = draw(st.integers(0, 300))
            lonely = side == "right" and p == 2 and draw(st.booleans())
            for m in range(epochs):
                for _ in range(draw(st.integers(0, 3))):
                    key = f"z{p}" if lonely else f"k{draw(st.integers(0, 3))}"
                    rows[side].append({"id": key, "ch": f"{src}/{p}", "epoch": m,
                                       "ingest": m * E + draw(st.integers(0, E - 1)),
                                       "et": (m * 60 - lag + draw(st.integers(-20, 20))) * SEC,
                                       "rv": len(rows[side])})
    how = draw(st.sampled_from(["inner", "left", "full"]))
    ttl = draw(st.sampled_from([None, 1, 2]))   # in epochs: rows expire (outer rows then leave alone)
    return rows, epochs, JoinType(how), ttl


def _table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    cols = {f.name: pa.array([r["et" if f.name == "et" else "ingest" if f.name == "_ingest_ts" else f.name]
                              for r in rows], pa.int64() if f.type == TS else f.type).cast(f.type) for f in schema}
    cols[CH] = pa.array([r["ch"] for r in rows], pa.string())
    cols["_seq"] = pa.array([r["rv"] for r in rows], pa.int64())   # which model row it is (the kernel keeps it)
    return pa.table(cols)


def _cutoff(m: int, ttl: int | None) -> int | None:
    return None if ttl is None else (m + 1) * E - ttl * E


def _runtime(rows, epochs: int, how: JoinType, ttl: int | None) -> tuple[list[int | None], list[list]]:
    """The join kernel round by round (one round per epoch), the window's observation and fold: W per epoch, and
    the output per epoch as (left seq, right seq, channel set)."""
    out_schema = pa.schema([("id", pa.string()), ("et", TS), ("rv", pa.int64()), ("_lseq", pa.int64()),
                            ("_rseq", pa.int64()), (CH, pa.string())])
    sl, sr = None, None
    state, marks, emitted = WatermarkState(), [], []
    for m in range(epochs):
        nl = _table([r for r in rows["left"] if r["epoch"] == m], LEFT).rename_columns(
            [*LEFT.names, CH, "_lseq"])
        nr = _table([r for r in rows["right"] if r["epoch"] == m], RIGHT).rename_columns(
            [*RIGHT.names, CH, "_rseq"])
        cut = _cutoff(m, ttl)
        res = join_step(sl if sl is not None else nl.slice(0, 0), sr if sr is not None else nr.slice(0, 0), nl, nr,
                        key="id", cutoff=None if cut is None else pa.scalar(cut, TS), how=how,
                        unique=Uniqueness.NONE, output_schema=out_schema, channel=CH)
        sl, sr = res.left, res.right
        assert CH in sl.column_names and CH in sr.column_names   # state keeps each held row's channel
        o = res.output
        emitted.append(sorted(zip(o["_lseq"].to_pylist(), o["_rseq"].to_pylist(), o[CH].to_pylist()),
                              key=lambda x: (x[0] is None, x[0] or 0, x[1] is None, x[1] or 0)))
        obs = observe_channels(o[CH], o["et"], o["id"]) if o.num_rows else {}
        state = WatermarkState.from_table(state.to_table()).advance(obs, 5 * SEC)   # checkpointed and restored
        marks.append(state.watermark_us)
    return marks, emitted


def _model(rows, epochs: int, how: JoinType, ttl: int | None) -> tuple[list[int | None], list[list]]:
    """The join by its definition (nested loops) and the window's watermark by the channel rule (Python sets)."""
    def alive(x, m):
        c = _cutoff(m, ttl)
        return c is None or x["ingest"] >= c
    per_epoch: list[list] = [[] for _ in range(epochs)]   # (left row or None, right row or None)
    paired: set[tuple[str, int]] = set()
    for lrow in rows["left"]:
        for rrow in rows["right"]:
            m = max(lrow["epoch"], rrow["epoch"])
            if lrow["id"] == rrow["id"] and alive(lrow, m) and alive(rrow, m):
                per_epoch[m].append((lrow, rrow))
                paired |= {("left", lrow["rv"]), ("right", rrow["rv"])}
    for side, outer in (("left", how.outer_left), ("right", how.outer_right)):
        for x in rows[side] if outer and ttl is not None else ():
            gone = next((m for m in range(x["epoch"], epochs) if not alive(x, m)), None)
            if gone is not None and (side, x["rv"]) not in paired:
                per_epoch[gone].append((x, None) if side == "left" else (None, x))
    w, marks, emitted, seen = None, [], [], {}
    for m in range(epochs):
        active: set[str] = set()
        for lrow, rrow in per_epoch[m]:
            chans = {r["ch"] for r in (lrow, rrow) if r is not None}
            if lrow is None:       # a lone right row has no left event time: a bad record, it moves nothing
                continue
            for c in chans:
                seen[c] = max(seen.get(c, lrow["et"]), lrow["et"])
                active.add(c)
        if active:
            cand = min(seen[c] for c in active) - 5 * SEC
            w = cand if w is None else max(w, cand)
        marks.append(w)
        emitted.append(sorted(((lr["rv"] if lr else None, rr["rv"] if rr else None,
                                "|".join(sorted({r["ch"] for r in (lr, rr) if r is not None})))
                               for lr, rr in per_epoch[m]),
                              key=lambda x: (x[0] is None, x[0] or 0, x[1] is None, x[1] or 0)))
    return marks, emitted


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_a_window_after_a_join_takes_the_minimum_over_both_inputs_channels(sc):
    rows, epochs, how, ttl = sc
    got_marks, got_rows = _runtime(rows, epochs, how, ttl)
    want_marks, want_rows = _model(rows, epochs, how, ttl)
    assert got_rows == want_rows        # which rows, in which epoch, carrying which channel set
    assert got_marks == want_marks      # the window's watermark epoch by epoch
    # the batch evaluation's fold over (epoch, channel set, max event time) gives the same watermarks
    maxima = [(m, ch, et) for m, es in enumerate(got_rows) for lseq, _r, ch in es if lseq is not None
              for et in [next(r["et"] for r in rows["left"] if r["rv"] == lseq)]]
    _prev, after, _seen, _w = watermark_fold(maxima, 5 * SEC)
    running = None
    for m in range(epochs):
        running = after.get(m, running)
        assert running == got_marks[m]


def test_a_partition_whose_rows_never_match_does_not_stall_the_window():
    """Right partition b/1 only has keys no left row has: it produces no join output, so it is idle in every
    epoch (as a partition whose rows a filter drops) and the window's watermark is that of the data without it.
    Flink would hold the join's watermark at b/1's (a source partition with records is not idle there)."""
    rows = {"left": [], "right": []}
    for m in range(4):
        rows["left"] += [{"id": "k", "ch": "a/0", "epoch": m, "ingest": m * E, "et": m * 60 * SEC, "rv": m}]
        rows["right"] += [{"id": "k", "ch": "b/0", "epoch": m, "ingest": m * E, "et": 0, "rv": 2 * m},
                          {"id": "zz", "ch": "b/1", "epoch": m, "ingest": m * E, "et": 0, "rv": 2 * m + 1}]
    marks, _ = _runtime(rows, 4, JoinType.INNER, None)
    alone = {"left": rows["left"], "right": [r for r in rows["right"] if r["ch"] == "b/0"]}
    assert marks == _runtime(alone, 4, JoinType.INNER, None)[0] == [-5 * SEC, 55 * SEC, 115 * SEC, 175 * SEC]


def test_a_join_that_feeds_a_window_reads_its_inputs_source_positions():
    """The channel of a join's input row is its source partition: read from the source only when a window reads the
    join's rows (a join feeding only sinks keeps reading what it did)."""
    job = Job("j6")
    a, b = job.source("a", LEFT), job.source("b", RIGHT)
    _window(a.select("id", "et", "_ingest_ts").join(b.select("id", "rv", "_ingest_ts"), on="id", uid="j")).sink("o")
    assert {"_source", "_partition"} <= job.columns_read(a.node)
    job2 = Job("j7")
    a, b = job2.source("a", LEFT), job2.source("b", RIGHT)
    a.select("id", "et", "_ingest_ts").join(b.select("id", "rv", "_ingest_ts"), on="id", uid="j").sink("o")
    assert not {"_source", "_partition"} & job2.columns_read(a.node)
