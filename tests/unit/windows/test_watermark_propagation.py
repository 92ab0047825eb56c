"""Watermarks through operators (docs/concepts/watermarks.md): the channel rules of :mod:`pipeline.windows.channels`
on job graphs of this test's own, and a property test of the propagation against a model.

The model is Flink's: every source partition has a watermark (its highest event time so far), every operator's output
watermark is the minimum of its inputs' (inputs idle in the epoch excluded; an operator whose inputs are all idle is
idle), and the window takes ``W(m) = max(W(m-1), input watermark - O)``. It is evaluated node by node over the graph,
recursively, sharing no code with the runtime. The runtime's side is what the window task does: the records tagged
with the channel the runtime gives them (source partition, forwarded through deduplicates, or ``op:<uid>``),
observed per epoch (:func:`observe_channels`) and folded by :meth:`WatermarkState.advance`. Both agree, and they
agree with the same graph without its deduplicates (which drop nothing here): a deduplicate in front of a window no
longer changes which records are late.
"""
from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline import Job
from pipeline.job import DedupNode, SourceNode, UnionNode, WindowNode
from pipeline.windows import WatermarkState, observe_channels
from pipeline.windows.channels import fixed_channels, forwards_channels, needs_channels, operator_channel

pytestmark = pytest.mark.unit

SEC = 1_000_000
TS = pa.timestamp("us", tz="UTC")
SCHEMA = pa.schema([("id", pa.string()), ("k", pa.string()), ("et", TS), ("_ingest_ts", TS)])
AGGS = {"n": ("count", None)}


def _window(s, uid="w"):
    return s.window(uid=uid, key="k", event_time="et", size_seconds=60, max_out_of_orderness_seconds=5, aggs=AGGS)


def _win(job: Job) -> WindowNode:
    return next(op for op in job.operators() if isinstance(op, WindowNode))


# ------------------------------------------------------------------------------------------------ the graph rules
def test_a_deduplicate_forwards_its_rows_channels_to_a_window():
    job = Job("g1")
    d = job.source("a", SCHEMA).deduplicate(uid="dd", key="id")
    _window(d.select("id", "k", "et")).sink("out")
    assert forwards_channels(job.nodes[d.node]) and needs_channels(job, d.node)
    assert fixed_channels(job, _win(job).parent) == frozenset()   # every row keeps its source partition


def test_a_deduplicate_that_no_window_reads_does_not_carry_channels():
    job = Job("g2")
    d = job.source("a", SCHEMA).deduplicate(uid="dd", key="id")
    d.sink("firsts")
    assert not needs_channels(job, d.node)


def test_chained_deduplicates_and_unions_forward_channels():
    job = Job("g3")
    a, b = job.source("a", SCHEMA), job.source("b", SCHEMA)
    d1 = a.deduplicate(uid="d1", key="id")
    d2 = d1.select("id", "k", "et").deduplicate(uid="d2", key="id")
    _window(d2.union(b.select("id", "k", "et"))).sink("out")
    assert needs_channels(job, d1.node) and needs_channels(job, d2.node)
    assert fixed_channels(job, _win(job).parent) == frozenset()


def _process(s, uid):
    return s.process(uid=uid, key="k", fn=lambda r, x: (x, r), state_schema=pa.schema([("k", pa.string())]),
                     output_schema=SCHEMA)


def test_operators_that_build_rows_form_one_channel():
    """A ``process`` builds its rows from the key's state (not one input row each): one channel ``op:<uid>``. A
    ``join`` forwards (since 2026-11-29; its own rules: tests/unit/windows/test_join_watermark_fold.py)."""
    job = Job("g4")
    a, b = job.source("a", SCHEMA), job.source("b", SCHEMA)
    p = _process(a, "p")
    d = p.deduplicate(uid="dd", key="id")
    _window(d).sink("out")
    assert not forwards_channels(job.nodes[p.node], job)
    assert needs_channels(job, d.node)                           # forwards the process's one channel
    assert fixed_channels(job, _win(job).parent) == {"op:p"} == {operator_channel(job, p.node)}
    job2 = Job("g5")
    a, b = job2.source("a", SCHEMA), job2.source("b", SCHEMA)
    d = a.deduplicate(uid="dd", key="id")
    _window(_process(d, "p")).sink("out")
    assert not needs_channels(job2, d.node)                      # the process builds new rows: nothing to forward
    p1 = _process(a, "p1").select("id", "k", "et")
    p2 = _process(b, "p2").select("id", "k", "et")
    assert fixed_channels(job2, p1.union(p2).node) == {"op:p1", "op:p2"}   # the batch reports these NOT CHECKED
    assert fixed_channels(job2, a.select("id", "k", "et").union(p1).node) == {"op:p1"}


# ------------------------------------------------------------------------------------------------ the property
def _tagged_rows(job: Job, nid: int, recs: list[dict]) -> list[dict]:
    """The rows of node ``nid``'s chain as the runtime tags them (source partition, forwarded, or op:<uid>)."""
    rows: list[dict] = []
    for base in sorted(job.bases(nid)):
        node = job.nodes[base]
        if isinstance(node, SourceNode):
            rows += [{**r, "ch": f"{r['src']}/{r['part']}"} for r in recs if r["src"] == node.name]
        elif forwards_channels(node):
            rows += _tagged_rows(job, node.parent, recs)  # type: ignore[attr-defined]
        else:
            raise AssertionError("only sources, unions and deduplicates in these graphs")
    return rows


def _model_watermark(job: Job, nid: int, recs: list[dict], m: int) -> int | None:
    """Flink's rule, node by node: the input watermark of node ``nid`` after epoch ``m`` over its active inputs
    (None: every input idle in ``m``). A source partition's watermark: its highest event time in epochs <= m, active
    iff it has a record in ``m``; an operator or union: the minimum over its active inputs."""
    base, _maps = job.chain_to(nid)
    node = job.nodes[base]
    if isinstance(node, SourceNode):
        mine = [r for r in recs if r["src"] == node.name]
        active = {r["part"] for r in mine if r["epoch"] == m}
        marks = [max(r["et"] for r in mine if r["part"] == p and r["epoch"] <= m) for p in active]
        return min(marks) if marks else None
    if isinstance(node, UnionNode):
        marks = [w for p in node.parents if (w := _model_watermark(job, p, recs, m)) is not None]
        return min(marks) if marks else None
    assert isinstance(node, DedupNode)
    return _model_watermark(job, node.parent, recs, m)


def _build(shape: dict, dedups: bool) -> Job:
    job = Job("prop")
    streams = []
    for s, (_parts, n_dedup) in enumerate(shape["sources"]):
        st_ = job.source(f"s{s}", SCHEMA)
        for i in range(n_dedup if dedups else 0):
            st_ = st_.deduplicate(uid=f"d{s}_{i}", key="id").select("id", "k", "et", "_ingest_ts")
        streams.append(st_)
    top = streams[0].union(*streams[1:]) if len(streams) > 1 else streams[0]
    if dedups and shape["dedup_after_union"]:
        top = top.deduplicate(uid="d_top", key="id")
    _window(top).sink("out")
    return job


@st.composite
def scenarios(draw):
    n_src = draw(st.integers(1, 3))
    sources = [(draw(st.integers(1, 3)), draw(st.integers(0, 2))) for _ in range(n_src)]
    epochs = draw(st.integers(1, 5))
    recs = []
    for s, (parts, _n) in enumerate(sources):
        for p in range(parts):
            lag = draw(st.integers(0, 200))   # partitions progress at different event-time speeds
            for m in range(epochs):
                for _ in range(draw(st.integers(0, 3))):   # 0: the partition is idle in the epoch
                    recs.append({"src": f"s{s}", "part": p, "epoch": m,
                                 "et": m * 60 - lag + draw(st.integers(-30, 30)), "id": f"r{len(recs)}"})
    return {"sources": sources, "dedup_after_union": draw(st.booleans())}, recs, epochs


def _runtime_watermarks(job: Job, recs: list[dict], epochs: int, ooo: int) -> list[int | None]:
    w = _win(job)
    rows = _tagged_rows(job, w.parent, recs)
    state, out = WatermarkState(), []
    for m in range(epochs):
        mine = [r for r in rows if r["epoch"] == m]
        t = pa.table({"ch": [r["ch"] for r in mine], "et": pa.array([r["et"] * SEC for r in mine], pa.int64()),
                      "k": ["x"] * len(mine)})
        obs = observe_channels(t["ch"], t["et"].cast(TS), t["k"]) if mine else {}
        state = WatermarkState.from_table(state.to_table()).advance(obs, ooo)   # checkpointed and restored
        out.append(state.watermark_us)
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_window_watermark_is_the_minimum_of_its_inputs_and_a_deduplicate_changes_nothing(sc):
    shape, recs, epochs = sc
    ooo = 5 * SEC
    with_dedup = _build(shape, dedups=True)
    got = _runtime_watermarks(with_dedup, recs, epochs, ooo)
    # the model: Flink's min-of-inputs, node by node, then the window's max over epochs
    want: list[int | None] = []
    w: int | None = None
    for m in range(epochs):
        x = _model_watermark(with_dedup, _win(with_dedup).parent, recs, m)
        if x is not None:
            cand = x * SEC - ooo
            w = cand if w is None else max(w, cand)
        want.append(w)
    assert got == want
    # the same graph without its deduplicates (they drop nothing: one row per id): the same watermark, epoch by epoch
    assert _runtime_watermarks(_build(shape, dedups=False), recs, epochs, ooo) == got


def test_before_the_fix_the_deduplicate_channel_took_the_global_maximum():
    """The defect the rule removes, as numbers: partition 1's event time runs 120 s behind partition 0; behind one
    ``op:<uid>`` channel the window's watermark is the global maximum minus O (partition 1's records late), with the
    channels forwarded it is the minimum over the partitions."""
    obs_forwarded = {"s/0": 300 * SEC, "s/1": 180 * SEC}
    obs_one_channel = {"op:dd": 300 * SEC}
    assert WatermarkState().advance(obs_forwarded, 5 * SEC).watermark_us == 175 * SEC
    assert WatermarkState().advance(obs_one_channel, 5 * SEC).watermark_us == 295 * SEC


def test_a_deduplicate_forwards_channels_to_an_interval_join_too():
    job = Job("g6")
    a, b = job.source("a", SCHEMA), job.source("b", SCHEMA)
    d = a.deduplicate(uid="dd", key="id")
    ij = d.select("id", "k", "et").interval_join(b.select("id", "et AS rt"), uid="ij", on="id", left_time="et",
                                                 right_time="rt", lower_seconds=-10, upper_seconds=10)
    ij.sink("pairs")
    assert needs_channels(job, d.node)
    assert fixed_channels(job, job.nodes[ij.node].left) == frozenset()
