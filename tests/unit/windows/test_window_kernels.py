"""Property tests of the window kernels against a brute-force, per-record model of docs/windows.md.

Random epochs of records (repeated keys, out-of-order and late event times, idle and empty partitions, skew
onto one key, null keys/event times), processed by ``window_step`` split over subtasks (the split may change
between epochs: rescaling) and over rounds (a checkpoint spanning several rounds), compared with the model:
the late records, the emitted rows of every epoch, and the state after every epoch.
"""
from __future__ import annotations

import zlib

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.testing.window_model import model
from pipeline.windows import EmitMode, WatermarkState, WindowSpec, observe_channels, window_step

pytestmark = pytest.mark.unit

SEC = 1_000_000
SCHEMA = pa.schema([("rid", pa.int64()), ("channel", pa.string()), ("k", pa.string()),
                    ("et", pa.timestamp("us", tz="UTC")), ("v", pa.float64()), ("n", pa.int64()),
                    ("u", pa.string())])
AGGS = (("cnt", "count", None), ("total", "sum", "v"), ("lo", "min", "n"), ("hi", "max", "v"),
        ("mean", "avg", "v"), ("users", "count_distinct", "u"), ("nsum", "sum", "n"))


# ---------------------------------------------------------------- the kernels, driven like the runtime
def to_table(recs):
    return pa.table({"rid": [r["rid"] for r in recs], "channel": [r["channel"] for r in recs],
                     "k": [r["k"] for r in recs], "et": [None if r["et"] is None else r["et"] * SEC for r in recs],
                     "v": [r["v"] for r in recs], "n": [r["n"] for r in recs], "u": [r["u"] for r in recs]},
                    schema=pa.schema([f if f.name != "et" else pa.field("et", pa.int64()) for f in SCHEMA])
                    ).cast(SCHEMA)


def subtask_of(k, p):
    return zlib.crc32(k.encode()) % p


def run_kernels(epochs, size, slide, ooo, lateness, emit, parallelisms, rounds):
    spec = WindowSpec("k", "et", size * SEC, slide * SEC, ooo * SEC, lateness * SEC, AGGS, EmitMode(emit))
    wm = WatermarkState()
    state = None
    results = []
    for m, recs in enumerate(epochs):
        P = parallelisms[m % len(parallelisms)]
        nr = rounds[m % len(rounds)]
        table = to_table(recs)
        # the runtime broadcasts each upstream task's per-channel maxima to every subtask (markers)
        new_wm = WatermarkState.from_table(wm.to_table()).advance(
            observe_channels(table["channel"], table["et"], table["k"]), spec.out_of_orderness_us)
        states = [[] for _ in range(P)]
        if state is not None:  # restore: every subtask takes the rows of its keys (rescaling included)
            for i in range(P):
                own = [subtask_of(k, P) == i for k in state["k"].to_pylist()]
                states[i] = state.filter(pa.array(own, pa.bool_()))
        outs, lates, new_states, bads = [], [], [], 0
        for i in range(P):
            st_i = states[i] if state is not None else None
            mine = table.filter(pa.array([k is None and i == 0 or k is not None and subtask_of(k, P) == i
                                          for k in table["k"].to_pylist()], pa.bool_()))
            cur = st_i if st_i is not None else pa.table({})
            bounds = [mine.num_rows * j // nr for j in range(nr + 1)]
            for j in range(nr):
                part = mine.slice(bounds[j], bounds[j + 1] - bounds[j])
                res = window_step(spec, cur, part, epoch=m, late_watermark_us=wm.watermark_us,
                                  fire_watermark_us=new_wm.watermark_us, complete=(j == nr - 1),
                                  input_schema=SCHEMA, carry=("rid",))
                cur = res.state
                lates.extend(res.late["rid"].to_pylist())
                bads += res.bad.num_rows
                if j < nr - 1:
                    assert res.output.num_rows == 0
            outs.append(res.output)
            new_states.append(cur)
        state = pa.concat_tables(new_states)
        out = pa.concat_tables(outs)
        rows = [(r["k"], r["window_start"].timestamp() // 1 if r["window_start"] else None) for r in out.to_pylist()]
        del rows
        out_rows = sorted(
            (r["k"], int(r["window_start"].timestamp()), int(r["window_end"].timestamp()), r["cnt"], r["total"],
             r["lo"], r["hi"], r["mean"], r["users"], r["nsum"]) for r in out.to_pylist())
        results.append((out_rows, sorted(lates), sorted(state["rid"].to_pylist()),
                        None if new_wm.watermark_us is None else new_wm.watermark_us // SEC, bads))
        wm = new_wm
    return results


# ---------------------------------------------------------------- strategies
quarter = st.one_of(st.none(), st.integers(-400, 400).map(lambda x: x / 4))


@st.composite
def workloads(draw):
    size = draw(st.sampled_from([10, 20, 30]))
    slide = draw(st.sampled_from([d for d in (size, size // 2, size // 5 if size % 5 == 0 else size)
                                  if d > 0 and size % d == 0]))
    ooo = draw(st.integers(0, 15))
    lateness = draw(st.integers(0, 15))
    n_epochs = draw(st.integers(1, 7))
    keys = draw(st.lists(st.sampled_from(list("abcdefgh")), min_size=1, max_size=5, unique=True))
    hot = keys[0]
    channels = draw(st.lists(st.sampled_from(["s/0", "s/1", "s/2", "t/0"]), min_size=1, max_size=4, unique=True))
    epochs, rid = [], 0
    for m in range(n_epochs):
        recs = []
        n = draw(st.integers(0, 25))          # an empty epoch is possible
        live = draw(st.lists(st.sampled_from(channels), min_size=0, max_size=len(channels), unique=True))
        for _ in range(n if live else 0):     # channels not in `live` are idle this epoch
            base = m * 20
            jitter = draw(st.integers(-60, 25))   # out of order, some far behind: late
            key = draw(st.one_of(st.just(hot), st.sampled_from(keys), st.just(None) if rid % 17 == 5 else st.just(hot)))
            et = None if draw(st.integers(0, 30)) == 0 else base + jitter
            recs.append({"rid": rid, "channel": draw(st.sampled_from(live)), "k": key, "et": et,
                         "v": draw(quarter), "n": draw(st.one_of(st.none(), st.integers(-50, 50))),
                         "u": draw(st.one_of(st.none(), st.sampled_from(["x", "y", "z", "w"])))})
            rid += 1
        epochs.append(recs)
    emit = draw(st.sampled_from(["final", "update"]))
    parallelisms = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    rounds = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
    return epochs, size, slide, ooo, lateness, emit, parallelisms, rounds


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(workloads())
def test_window_step_matches_the_model(w):
    epochs, size, slide, ooo, lateness, emit, parallelisms, rounds = w
    expected = model(epochs, size, slide, ooo, lateness, emit)
    got = run_kernels(epochs, size, slide, ooo, lateness, emit, parallelisms, rounds)
    for m, (exp, act) in enumerate(zip(expected, got)):
        assert act[3] == exp[3], f"epoch {m}: watermark"
        assert act[1] == exp[1], f"epoch {m}: late records"
        assert act[2] == exp[2], f"epoch {m}: state"
        assert act[0] == exp[0], f"epoch {m}: output"
        n_bad = sum(1 for r in epochs[m] if r["k"] is None or r["et"] is None)
        assert act[4] == n_bad, f"epoch {m}: bad records"


def test_final_emits_each_window_once_and_nothing_is_lost():
    """Every valid record is either late (dead letter) or counted in windows that all fire once."""
    recs = [[{"rid": i, "channel": f"s/{i % 2}", "k": "a", "et": t, "v": 1.0, "n": 1, "u": "x"}
             for i, t in enumerate([5, 3, 12, 11, 25])],
            [{"rid": 10, "channel": "s/0", "k": "a", "et": 2, "v": 1.0, "n": 1, "u": "x"},   # late
             {"rid": 11, "channel": "s/0", "k": "a", "et": 80, "v": 1.0, "n": 1, "u": "x"},
             {"rid": 12, "channel": "s/1", "k": "a", "et": 90, "v": 1.0, "n": 1, "u": "x"}]]
    got = run_kernels(recs, 10, 10, 0, 0, "final", [2], [1])
    # epoch 0: W = min(25 (s/0), 11 (s/1)) = 11 -> window [0,10) fires with 5, 3
    assert got[0][3] == 11 and [r[:4] for r in got[0][0]] == [("a", 0, 10, 2)]
    # epoch 1: record 10 (t=2) is late against W(0)=11; W(1) = 80 fires [10,20) and [20,30)
    assert got[1][1] == [10]
    assert [r[:4] for r in got[1][0]] == [("a", 10, 20, 2), ("a", 20, 30, 1)]
    assert got[1][2] == [11, 12] and got[1][3] == 80


def test_idle_channel_does_not_hold_the_watermark_back():
    recs = [[{"rid": 0, "channel": "s/0", "k": "a", "et": 50, "v": None, "n": None, "u": None},
             {"rid": 1, "channel": "s/1", "k": "a", "et": 10, "v": None, "n": None, "u": None}],
            [{"rid": 2, "channel": "s/0", "k": "a", "et": 100, "v": None, "n": None, "u": None}]]
    got = run_kernels(recs, 10, 10, 5, 0, "final", [1], [1])
    assert got[0][3] == 5          # min(50, 10) - 5
    assert got[1][3] == 95         # s/1 idle in epoch 1: min over {s/0} = 100 - 5
    assert [r[:4] for r in got[1][0]] == [("a", 10, 20, 1), ("a", 50, 60, 1)]
    assert got[1][0][0][4] is None and got[1][0][0][8] == 0   # all-null sum -> null; count_distinct -> 0


def test_watermark_state_round_trips_and_detects_corrupt_copies():
    w = WatermarkState().advance({"s/0": 7 * SEC, "s/1": 3 * SEC}, SEC)
    assert w.watermark_us == 2 * SEC
    t = w.to_table()
    assert WatermarkState.from_table(pa.concat_tables([t, t])) == w
    bad = pa.concat_tables([t, WatermarkState(9, w.channels).to_table()])
    from pipeline.exceptions import CorruptCheckpointError
    with pytest.raises(CorruptCheckpointError, match="disagree"):
        WatermarkState.from_table(bad, "chk-3")
    assert WatermarkState().advance({}, 0) == WatermarkState()


def test_update_re_completing_a_completed_epoch_emits_only_its_new_records_windows():
    """A restore/savepoint re-completes the restored epoch (``replayed``): the windows its records changed were
    emitted by the checkpoint being restored, so emitting them again would commit the same rows twice."""
    spec = WindowSpec("k", "et", 10 * SEC, 10 * SEC, 0, 0, AGGS, EmitMode.UPDATE)
    recs = [{"rid": i, "channel": "s/0", "k": k, "et": t, "v": 1.0, "n": 1, "u": "x"}
            for i, (k, t) in enumerate([("a", 3), ("b", 14), ("a", 25)])]
    first = window_step(spec, pa.table({}), to_table(recs), epoch=7, late_watermark_us=None,
                        fire_watermark_us=None, complete=True)
    assert sorted(first.output["k"].to_pylist()) == ["a", "a", "b"]
    for replayed, want in ((False, ["a", "a", "b"]), (True, [])):
        again = window_step(spec, first.state, None, epoch=7, late_watermark_us=None, fire_watermark_us=None,
                            complete=True, input_schema=SCHEMA, replayed=replayed)
        assert sorted(again.output["k"].to_pylist()) == want
        assert again.state.equals(first.state)
    # records arriving in the replayed step: their windows (with the state's records) only
    more = to_table([{"rid": 9, "channel": "s/0", "k": "a", "et": 7, "v": 2.0, "n": 1, "u": "y"}])
    res = window_step(spec, first.state, more, epoch=7, late_watermark_us=None, fire_watermark_us=None,
                      complete=True, replayed=True)
    assert [(r["k"], r["cnt"], r["total"]) for r in res.output.to_pylist()] == [("a", 2, 3.0)]
