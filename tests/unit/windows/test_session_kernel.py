"""Property test of the session window kernel against a pandas model of docs/operators.md "Session windows".

Random epochs of records (repeated keys, out-of-order and late event times, idle channels, null keys and event
times), processed by ``session_step``, split over subtasks (the split changes between epochs:
rescaling) and over rounds (a checkpoint spanning several rounds), compared with the model (pandas, sharing no
code with Epochal): the late records, the sessions emitted at every epoch and the state after every epoch. The
model sessionizes *all* on-time records of the epochs so far (the batch meaning); the kernel only ever sees the
records of unfired sessions, so the test also checks that no on-time record belongs to a fired session.
"""
from __future__ import annotations

import zlib

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.exceptions import ConfigError
from pipeline.job import Job
from pipeline.windows import EmitMode, WatermarkState, WindowSpec, observe_channels, session_step

pytestmark = pytest.mark.unit

SEC = 1_000_000
SCHEMA = pa.schema([("rid", pa.int64()), ("channel", pa.string()), ("k", pa.string()),
                    ("et", pa.timestamp("us", tz="UTC")), ("v", pa.int64())])
AGGS = (("cnt", "count", None), ("total", "sum", "v"), ("hi", "max", "v"))


def to_table(recs):
    return pa.table({"rid": [r["rid"] for r in recs], "channel": [r["channel"] for r in recs],
                     "k": [r["k"] for r in recs], "et": [None if r["et"] is None else r["et"] * SEC for r in recs],
                     "v": [r["v"] for r in recs]},
                    schema=pa.schema([f if f.name != "et" else pa.field("et", pa.int64()) for f in SCHEMA])
                    ).cast(SCHEMA)


def run_kernel(epochs, gap, ooo, lateness, parallelisms, rounds):
    spec = WindowSpec("k", "et", 0, 0, ooo * SEC, lateness * SEC, AGGS, EmitMode.FINAL, gap * SEC)
    wm = WatermarkState()
    state = None
    results = []
    for m, recs in enumerate(epochs):
        P = parallelisms[m % len(parallelisms)]
        nr = rounds[m % len(rounds)]
        table = to_table(recs)
        new_wm = WatermarkState.from_table(wm.to_table()).advance(
            observe_channels(table["channel"], table["et"], table["k"]), spec.out_of_orderness_us)
        outs, lates, new_states, bads = [], [], [], 0
        for i in range(P):
            cur = (state.filter(pa.array([zlib.crc32(k.encode()) % P == i for k in state["k"].to_pylist()],
                                         pa.bool_())) if state is not None else pa.table({}))
            mine = table.filter(pa.array([k is None and i == 0 or k is not None and zlib.crc32(k.encode()) % P == i
                                          for k in table["k"].to_pylist()], pa.bool_()))
            bounds = [mine.num_rows * j // nr for j in range(nr + 1)]
            for j in range(nr):
                res = session_step(spec, cur, mine.slice(bounds[j], bounds[j + 1] - bounds[j]), epoch=m,
                                  late_watermark_us=wm.watermark_us, fire_watermark_us=new_wm.watermark_us,
                                  complete=(j == nr - 1), input_schema=SCHEMA, carry=("rid",))
                cur = res.state
                lates.extend(res.late["rid"].to_pylist())
                bads += res.bad.num_rows
                assert j == nr - 1 or res.output.num_rows == 0
            outs.append(res.output)
            new_states.append(cur)
        state = pa.concat_tables(new_states)
        out = pa.concat_tables(outs).to_pylist()
        rows = sorted((r["k"], int(r["window_start"].timestamp()), int(r["window_end"].timestamp()), r["cnt"],
                       r["total"], r["hi"]) for r in out)
        results.append((rows, sorted(lates), sorted(state["rid"].to_pylist()), bads))
        wm = new_wm
    return results


def model(epochs, gap, ooo, lateness):
    """Per epoch: W(m) (per-channel maxima, minimum over the channels active in the epoch, minus the bound, never
    decreasing), the late records (t + L <= W(m-1)), and the sessions of all on-time records so far firing at m."""
    seen: dict[str, int] = {}
    w = None
    on: list[dict] = []
    out = []
    for recs in epochs:
        w_prev = w
        good = [r for r in recs if r["k"] is not None and r["et"] is not None]
        active = {r["channel"] for r in good}
        for c in active:
            seen[c] = max([seen.get(c, -10**9)] + [r["et"] for r in good if r["channel"] == c])
        if active:
            cand = min(seen[c] for c in active) - ooo
            w = cand if w is None else max(w, cand)
        late = sorted(r["rid"] for r in good if w_prev is not None and r["et"] + lateness <= w_prev)
        on += [r for r in good if not (w_prev is not None and r["et"] + lateness <= w_prev)]
        rows, held = [], []
        if on:
            df = pd.DataFrame(on).sort_values(["k", "et"])
            df["sid"] = ((df["k"] != df["k"].shift()) | (df["et"] - df["et"].shift() >= gap)).cumsum()
            for _sid, s in df.groupby("sid"):
                end = int(s["et"].max()) + gap
                if w is not None and end + lateness <= w:
                    if w_prev is None or end + lateness > w_prev:
                        rows.append((s["k"].iloc[0], int(s["et"].min()), end, len(s), int(s["v"].sum()),
                                     int(s["v"].max())))
                else:
                    held += [int(x) for x in s["rid"]]
        out.append((sorted(rows), late, sorted(held), sum(1 for r in recs if r["k"] is None or r["et"] is None)))
    return out


@st.composite
def workloads(draw):
    gap = draw(st.integers(1, 15))
    ooo = draw(st.integers(0, 10))
    lateness = draw(st.integers(0, 10))
    keys = draw(st.lists(st.sampled_from(list("abcde")), min_size=1, max_size=4, unique=True))
    channels = draw(st.lists(st.sampled_from(["s/0", "s/1", "t/0"]), min_size=1, max_size=3, unique=True))
    epochs, rid = [], 0
    for m in range(draw(st.integers(1, 7))):
        recs = []
        live = draw(st.lists(st.sampled_from(channels), min_size=0, max_size=len(channels), unique=True))
        for _ in range(draw(st.integers(0, 20)) if live else 0):
            k = None if draw(st.integers(0, 25)) == 0 else draw(st.sampled_from(keys))
            et = None if draw(st.integers(0, 25)) == 0 else m * 15 + draw(st.integers(-40, 20))
            recs.append({"rid": rid, "channel": draw(st.sampled_from(live)), "k": k, "et": et,
                         "v": draw(st.integers(-20, 20))})
            rid += 1
        epochs.append(recs)
    return (epochs, gap, ooo, lateness, draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)),
            draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(workloads())
def test_session_step_matches_the_model(w):
    epochs, gap, ooo, lateness, parallelisms, rounds = w
    expected = model(epochs, gap, ooo, lateness)
    got = run_kernel(epochs, gap, ooo, lateness, parallelisms, rounds)
    for m, (exp, act) in enumerate(zip(expected, got)):
        assert act[1] == exp[1], f"epoch {m}: late records"
        assert act[2] == exp[2], f"epoch {m}: state"
        assert act[0] == exp[0], f"epoch {m}: emitted sessions"
        assert act[3] == exp[3], f"epoch {m}: bad records"


def test_a_record_bridging_two_sessions_merges_them():
    spec = WindowSpec("k", "et", 0, 0, 0, 0, AGGS, EmitMode.FINAL, 10 * SEC)
    recs = [{"rid": i, "channel": "s/0", "k": "a", "et": t, "v": i} for i, t in enumerate((0, 18, 9))]
    first = session_step(spec, pa.table({}), to_table(recs[:2]), epoch=0, late_watermark_us=None,
                        fire_watermark_us=None, complete=True, input_schema=SCHEMA)
    assert first.output.num_rows == 0 and first.state.num_rows == 2   # two sessions: [0, 10) and [18, 28)
    res = session_step(spec, first.state, to_table(recs[2:]), epoch=1, late_watermark_us=None,
                      fire_watermark_us=28 * SEC, complete=True, input_schema=SCHEMA)
    assert [(int(r["window_start"].timestamp()), int(r["window_end"].timestamp()), r["cnt"])
            for r in res.output.to_pylist()] == [(0, 28, 3)]
    assert res.state.num_rows == 0


def test_session_window_refuses_update_emission():
    job = Job("s")
    src = job.source("e", SCHEMA.append(pa.field("_ingest_ts", pa.timestamp("us", tz="UTC"))), key="k")
    with pytest.raises(ConfigError, match="emit must be 'final'"):
        src.session_window(uid="s", key="k", event_time="et", gap_seconds=10, aggs={"n": ("count", None)},
                           emit="update")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="gap_seconds"):
        src.session_window(uid="s2", key="k", event_time="et", gap_seconds=0, aggs={"n": ("count", None)})
