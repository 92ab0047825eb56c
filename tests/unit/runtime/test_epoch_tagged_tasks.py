"""Several epochs in one round, per operator task: the task function of a tagged round (rows tagged with their
epoch, the values of every epoch in the operator's property) gives, epoch by epoch, what sequential one-epoch
rounds give - the same state (read back from the snapshot files), the same staged sink output or flowing rows,
the same dead letters, expiry counts and chain shapes (delta counts: the materialisation cadence, a base every third
snapshot) - on random inputs, with TTL expiry inside the round, on the heap backend and on the rocksdb keyed stores
(each epoch's body opens the subtask's store at the version the previous epoch left). The window runs two subtasks
with watermarks advancing per epoch inside the round (subtask 1 carries the watermark state in memory: only
subtask 0 writes it). Spark Connect's path (the values captured by the task function, pickled by value) is the
last test.

The real task functions run in this process (no Spark: the round's values come from a patched ``task_params``,
state and output go to local files), once per epoch with the previous epoch's state handles (sequential), and
once over all epochs (tagged)."""
from __future__ import annotations

import json
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.fileio import LocalFileIO
from pipeline.operators.join import JoinType
from pipeline.operators.ttl import ROW_EPOCH
from pipeline.runtime.operators import task as ops
from pipeline.runtime.operators.aggregate import EXACT_SUM, AggTaskSpec, make_agg_task
from pipeline.runtime.operators.dedup import DedupTaskSpec, make_dedup_task
from pipeline.runtime.operators.join import JoinTaskSpec, make_join_task
from pipeline.runtime.operators.process import ProcessTaskSpec, make_process_task
from pipeline.runtime.operators.report_codec import from_ipc, from_table, to_batch
from pipeline.runtime.operators.round_params import EPOCH_TAG, TAGGED_KEY
from pipeline.runtime.operators.task import BEACON
from pipeline.state import backend
from pipeline.state.backend import load_chain
from pipeline.state.chain import StateChain
from pipeline.state.materialization import MaterializationPolicy
from pipeline.state.snapshot import SnapshotOptions

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("state_cache_dir")]

E_US = 60_000_000
FIRST = 29_000_000           # the first epoch of the round
EPOCHS = 5
TS = pa.timestamp("us", tz="UTC")
LEFT = pa.schema([("k", pa.string()), ("x", pa.float64()), ("_ingest_ts", TS)])
RIGHT = pa.schema([("k", pa.string()), ("y", pa.int64()), ("_ingest_ts", TS)])
OUT = pa.schema([pa.field("k", pa.string()), pa.field("x", pa.float64()), pa.field("y", pa.int64())])


def _kg(k: str) -> int:
    return int(k[1:]) % 8


#: the state backend of the runs (a test parametrised with ``backend`` sets it; the stores live under the run's
#: root, so the sequential and the tagged run never share a store)
BACKEND = ["heap"]


#: ``EPOCHAL_LONG_TAGGED_TESTS=1``: every seed and variant on both backends (default: a short profile, ~20 s)
LONG = bool(os.environ.get("EPOCHAL_LONG_TAGGED_TESTS"))


def _short_profile(keep: bool) -> None:
    if not LONG and not keep:
        pytest.skip("short profile: EPOCHAL_LONG_TAGGED_TESTS=1 runs every seed and variant")


@pytest.fixture(params=["heap", "rocksdb"])
def backend_name(request):
    BACKEND[0] = request.param
    yield request.param
    BACKEND[0] = "heap"


def _params(root, uid: str, cid: int, epoch: int, ttl_s: int | None, *, chained: bool, parent: dict) -> dict:
    end = (epoch + 1) * E_US
    return {"barrier_us": end, "checkpoint": f"chk-{cid}", "parent_handles": parent,
            "state_prefix": f"{root}/chk-{cid}/rounds/0/state/{uid}", "output_prefix": f"{root}/sink/txn-{cid}",
            "output_name": "out", "file_tag": "r0", "ttl_cutoff_us": end - ttl_s * 1_000_000 if ttl_s else None,
            "ack_prefix": f"{root}/chk-{cid}/rounds/0/acks/{uid}" if chained else None, "replay_handles": {},
            "channel_prefix": None, "prior_output": [], "epoch": epoch, "complete": True,
            "snapshot": SnapshotOptions(checkpoint_id=cid, round=0, shared=f"{root}/shared/{uid}",
                                        policy=MaterializationPolicy(True, 2, 10.0), backend=BACKEND[0],
                                        job_root=root).to_params()}


def _run(task, batches, params, monkeypatch) -> list[pa.RecordBatch]:
    monkeypatch.setattr(ops, "task_params", lambda key: params)
    return list(task(iter(batches)))


def _rows(reports) -> list[dict]:
    """The reports as their codec rows (compared field by field), each with its typed state handle."""
    return [{**row, "_state": r.state} for r, row in zip(reports, to_batch(reports).to_pylist())]


def _sequential(make, uid, inputs, root, ttl_s, chained, monkeypatch):
    """One round per epoch; returns per epoch (handle rows, flowing batches)."""
    out, parent = [], {}
    for i, t in enumerate(inputs):
        cid, epoch = 10 + i, FIRST + i
        p = _params(root, uid, cid, epoch, ttl_s, chained=chained, parent=parent)
        got = _run(make(), t.drop_columns([EPOCH_TAG]).to_batches(), p, monkeypatch)
        if chained:
            fio = LocalFileIO()
            rows = _rows(from_ipc(fio.read_bytes(f"{p['ack_prefix']}/00000.arrow")))
            flow = got
        else:
            rows = _rows(from_table(pa.Table.from_batches(got)))
            flow = []
        parent = {}
        for r in rows:
            if r["kind"] == "state":
                parent.setdefault(r["name"], []).append(r["_state"].to_dict())
        out.append((rows, flow))
    return out


def _tagged(make, uid, inputs, root, ttl_s, chained, monkeypatch):
    entries = [{"checkpoint_id": 10 + i, "epoch": FIRST + i,
                "params": _params(root, uid, 10 + i, FIRST + i, ttl_s, chained=chained, parent={})}
               for i in range(len(inputs))]
    whole = pa.concat_tables(inputs)
    got = _run(make(), whole.to_batches(max_chunksize=7), {TAGGED_KEY: entries}, monkeypatch)
    if chained:
        rows = _rows(from_ipc(LocalFileIO().read_bytes(f"{entries[0]['params']['ack_prefix']}/00000.arrow")))
        flow = pa.Table.from_batches(got) if got else None
    else:
        rows = _rows(from_table(pa.Table.from_batches(got)))
        flow = None
    out = []
    for i in range(len(inputs)):
        mine = [r for r in rows if r["checkpoint_id"] == 10 + i]
        f = []
        if flow is not None:
            part = flow.filter(pa.compute.equal(flow[EPOCH_TAG], FIRST + i)).drop_columns([EPOCH_TAG])
            f = part.to_batches()
        out.append((mine, f))
    return out


def _beaconed(inputs: list[pa.Table]) -> tuple[list[pa.Table], list[pa.Table]]:
    """(tagged inputs, sequential inputs) with the subtask's beacon: one row per subtask and round, untagged - once
    in the tagged round, in every sequential round. Keyed inputs (a ``_kg`` column, no ``_subtask``) as
    routing.route_by_key_group sends them (the beacon's key group is -1 - subtask), else as routing.with_beacons."""
    schema = inputs[0].schema
    if "_kg" in schema.names and "_subtask" not in schema.names:
        beacon = pa.Table.from_pylist([{"_kg": -1}], schema=schema)
        full = [pa.Table.from_pylist(t.to_pylist(), schema=schema) for t in inputs]
        return [pa.concat_tables([beacon, full[0]])] + full[1:], [pa.concat_tables([beacon, t]) for t in full]
    if "_subtask" not in schema.names:
        schema = schema.append(pa.field("_subtask", pa.int32()))
    schema = schema.append(pa.field(BEACON, pa.bool_()))
    beacon = pa.Table.from_pylist([{"_subtask": 0, BEACON: True}], schema=schema)
    full = [pa.Table.from_pylist(t.to_pylist(), schema=schema) for t in inputs]
    return [pa.concat_tables([beacon, full[0]])] + full[1:], [pa.concat_tables([beacon, t]) for t in full]


def _norm(rows) -> list:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)


def _content(h: dict) -> list:
    """The state (whole chain, read from its files) or the staged output file of a handle row."""
    fio = LocalFileIO()
    if h["kind"] == "state":
        chain = StateChain.of(h["_state"])
        return [] if chain is None else _norm(load_chain(fio, chain, "test", warm=False).to_pylist())
    if h["kind"] in ("output", "dead_letter") and h["uri"]:
        if not h["uri"].endswith(".parquet"):
            return sorted(fio.read_bytes(h["uri"]).decode().splitlines())
        with fio.open_input(h["uri"]) as f:
            return _norm(pq.read_table(f).to_pylist())
    return []


def _same(seq, tag):
    assert len(seq) == len(tag)
    for i, ((rs, fs), (rt, ft)) in enumerate(zip(seq, tag)):
        key = lambda r: (r["kind"], r["name"])  # noqa: E731
        assert sorted(map(key, rs)) == sorted(map(key, rt)), f"epoch {i}"
        for a, b in zip(sorted(rs, key=key), sorted(rt, key=key)):
            for field in ("rows", "in_rows", "restored_rows", "expired_rows", "state_rows"):
                assert a[field] == b[field], f"epoch {i} {a['kind']}/{a['name']}: {field}"
            assert len(json.loads(a["deltas"] or "[]")) == len(json.loads(b["deltas"] or "[]")), \
                f"epoch {i} {a['kind']}/{a['name']}: chain shape (materialisation cadence)"
            assert _content(a) == _content(b), f"epoch {i} {a['kind']}/{a['name']}"
        flow_a = pa.Table.from_batches(fs).to_pylist() if fs else []
        flow_b = pa.Table.from_batches(ft).to_pylist() if ft else []
        assert _norm(flow_a) == _norm(flow_b), f"epoch {i}: flowing rows"


def _join_inputs(rnd: random.Random) -> list[pa.Table]:
    out = []
    for i in range(EPOCHS):
        e = FIRST + i
        rows = []
        for side in (0, 1):
            for _ in range(rnd.randint(0, 12)):
                k = f"k{rnd.randint(0, 15)}"
                rows.append({"k": k, "x": float(rnd.randint(0, 99)) if side == 0 else None,
                             "y": rnd.randint(0, 99) if side == 1 else None,
                             "_ingest_ts": e * E_US + rnd.randint(0, E_US - 1), "_side": side, "_kg": _kg(k),
                             ROW_EPOCH: e, EPOCH_TAG: e})
        schema = pa.schema([("k", pa.string()), ("x", pa.float64()), ("y", pa.int64()), ("_ingest_ts", TS),
                            ("_side", pa.int8()), ("_kg", pa.int32()), (ROW_EPOCH, pa.int64()),
                            (EPOCH_TAG, pa.int64())])
        out.append(pa.Table.from_pylist(rows, schema=schema))
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("how,chained", [("inner", False), ("left", False), ("full", True)])
def test_join_tagged_round_equals_sequential_rounds(tmp_path, monkeypatch, seed, how, chained, backend_name):
    _short_profile(backend_name == "heap" or (seed == 0 and how == "full"))
    rnd = random.Random(seed)
    ttl_s = 150  # rows expire two to three epochs after they arrive: expiry happens inside the round
    flow = OUT.append(pa.field(ROW_EPOCH, pa.int64())) if chained else None

    def make():
        spec = JoinTaskSpec("j", "chk-?", "k", tuple(LEFT.names), tuple(RIGHT.names), tuple(OUT.names), 1, 8, None,
                            {}, "", "", "", "", LEFT, RIGHT, OUT, flow_schema=flow, how=JoinType(how),
                            ttl_us=ttl_s * 1_000_000, epoch_us=E_US)
        return make_join_task(spec)

    inputs, seq_inputs = _beaconed(_join_inputs(rnd))
    seq = _sequential(make, "j", seq_inputs, (tmp_path / "seq").as_uri(), ttl_s, chained, monkeypatch)
    backend._RECENT.clear()
    tag = _tagged(make, "j", inputs, (tmp_path / "tag").as_uri(), ttl_s, chained, monkeypatch)
    _same(seq, tag)
    assert sum(r["expired_rows"] for rs, _ in seq for r in rs if r["kind"] == "state") > 0, "no expiry exercised"
    assert _rematerialised(seq), "no materialisation inside the round"


@pytest.mark.parametrize("seed", range(3))
def test_aggregate_tagged_round_equals_sequential_rounds(tmp_path, monkeypatch, seed, backend_name):
    _short_profile(backend_name == "heap" or seed == 0)
    rnd = random.Random(seed)
    state = pa.schema([("g", pa.string()), ("n", pa.int64()), ("s", EXACT_SUM)])
    out = pa.schema([("g", pa.string()), ("n", pa.int64()), ("s", pa.float64())])

    def make():
        return make_agg_task(AggTaskSpec("a", "chk-?", "g", (("n", "count", None), ("s", "sum", "x")), state, 1, 8,
                                         {}, "", "", "", "", None, out))

    schema = pa.schema([("g", pa.string()), ("x", pa.float64()), ("_kg", pa.int32()), (EPOCH_TAG, pa.int64())])
    inputs = []
    for i in range(EPOCHS):
        gs = [f"k{rnd.randint(0, 9)}" for _ in range(rnd.randint(0, 20))]
        inputs.append(pa.Table.from_pylist([{"g": g, "x": rnd.uniform(-5, 5), "_kg": _kg(g), EPOCH_TAG: FIRST + i}
                                            for g in gs], schema=schema))
    inputs, seq_inputs = _beaconed(inputs)
    seq = _sequential(make, "a", seq_inputs, (tmp_path / "seq").as_uri(), None, False, monkeypatch)
    backend._RECENT.clear()
    tag = _tagged(make, "a", inputs, (tmp_path / "tag").as_uri(), None, False, monkeypatch)
    _same(seq, tag)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("chained", [False, True])
def test_dedup_tagged_round_equals_sequential_rounds(tmp_path, monkeypatch, seed, chained, backend_name):
    _short_profile(backend_name == "heap" or (seed == 0 and not chained))
    rnd = random.Random(seed)
    ttl_s = 100
    user = pa.schema([("k", pa.string()), ("v", pa.int64()), ("_ingest_ts", TS)])
    in_schema = user.append(pa.field(ROW_EPOCH, pa.int64()))

    def make():
        return make_dedup_task(DedupTaskSpec("d", "chk-?", "k", in_schema, 1, 8, {}, "", "", "", "", None,
                                             ttl_us=ttl_s * 1_000_000, epoch_us=E_US, user_schema=user))

    schema = in_schema.append(pa.field("_kg", pa.int32())).append(pa.field(EPOCH_TAG, pa.int64()))
    inputs = []
    for i in range(EPOCHS):
        e = FIRST + i
        rows = [{"k": (k := f"k{rnd.randint(0, 12)}"), "v": rnd.randint(0, 9), "_ingest_ts": e * E_US + rnd.randint(0, E_US - 1),
                 ROW_EPOCH: e, "_kg": _kg(k), EPOCH_TAG: e}
                for _ in range(rnd.randint(0, 15))]
        if i == 0:  # the subtask's beacon (routing.route_by_key_group): one per subtask, untagged
            rows.insert(0, {"_kg": -1})
        inputs.append(pa.Table.from_pylist(rows, schema=schema))
    seq_inputs = [inputs[0]] + [pa.concat_tables([inputs[0].slice(0, 1), t]) for t in inputs[1:]]
    seq = _sequential(make, "d", seq_inputs, (tmp_path / "seq").as_uri(), ttl_s, chained, monkeypatch)
    backend._RECENT.clear()
    tag = _tagged(make, "d", inputs, (tmp_path / "tag").as_uri(), ttl_s, chained, monkeypatch)
    _same(seq, tag)
    assert sum(r["rows"] for rs, _ in seq for r in rs if r["kind"] == "dropped") > 0, "no duplicate exercised"


TOTALS = pa.schema([("k", pa.string()), ("total", pa.int64())])


def _running_total(rows: pa.Table, state: pa.Table) -> tuple[pa.Table, pa.Table]:
    g = rows.group_by("k").aggregate([("v", "sum")])
    prev = {r["k"]: r["total"] for r in state.to_pylist()}
    t = pa.Table.from_pylist([{"k": k, "total": prev.get(k, 0) + s}
                              for k, s in zip(g["k"].to_pylist(), g["v_sum"].to_pylist())], schema=TOTALS)
    return t, t


@pytest.mark.parametrize("seed", range(2))
def test_process_tagged_round_equals_sequential_rounds(tmp_path, monkeypatch, seed, backend_name):
    _short_profile(backend_name == "heap" or seed == 0)
    rnd = random.Random(seed)
    user = pa.schema([("k", pa.string()), ("v", pa.int64()), ("_ingest_ts", TS)])

    def make():
        return make_process_task(ProcessTaskSpec("p", "chk-?", "k", _running_total, TOTALS, TOTALS, user, 120, 1, 8,
                                                 {}, "", "", "", ""))

    schema = user.append(pa.field("_kg", pa.int32())).append(pa.field(EPOCH_TAG, pa.int64()))
    inputs = []
    for i in range(EPOCHS):
        e = FIRST + i
        rows = [{"k": (k := f"k{rnd.randint(0, 9)}"), "v": rnd.randint(1, 9),
                 "_ingest_ts": e * E_US + rnd.randint(0, E_US - 1), "_kg": _kg(k), EPOCH_TAG: e}
                for _ in range(rnd.randint(0, 10))]
        if i == 0:  # the subtask's beacon (routing.route_by_key_group)
            rows.insert(0, {"_kg": -1})
        inputs.append(pa.Table.from_pylist(rows, schema=schema))
    seq_inputs = [inputs[0]] + [pa.concat_tables([inputs[0].slice(0, 1), t]) for t in inputs[1:]]
    seq = _sequential(make, "p", seq_inputs, (tmp_path / "seq").as_uri(), None, False, monkeypatch)
    backend._RECENT.clear()
    tag = _tagged(make, "p", inputs, (tmp_path / "tag").as_uri(), None, False, monkeypatch)
    _same(seq, tag)


def _rematerialised(seq) -> bool:
    """Whether some state chain was materialised again inside the round (a base after a delta: the cadence)."""
    depth: dict = {}
    for rs, _ in seq:
        for r in rs:
            if r["kind"] == "state" and r["uri"]:
                n = len(json.loads(r["deltas"] or "[]"))
                key = (r["name"], r["subtask"])
                if n == 0 and depth.get(key, 0) > 0:
                    return True
                depth[key] = n
    return False


# ------------------------------------------------------------------------------------------------ windows
W_IN = pa.schema([("k", pa.string()), ("et", TS), ("v", pa.float64()), ("_ingest_ts", TS),
                  ("_wm_channel", pa.string()), ("_kg", pa.int32())])
W_WIRE = W_IN.append(pa.field("_subtask", pa.int32())).append(pa.field("_wm_max", pa.int64())).append(
    pa.field(BEACON, pa.bool_()))
P2 = 2  # two subtasks: only subtask 0 writes the watermark file, subtask 1 must carry it in memory


def _window_inputs(rnd: random.Random) -> list[dict[int, list[dict]]]:
    """Per epoch, per subtask: the wire rows (records of its key groups and one marker per active channel and
    subtask, as keyed_ops._with_markers sends them). Event times run up to 90 s behind: late records."""
    from pipeline.keygroups import range_for_subtask
    out = []
    for i in range(EPOCHS):
        e = FIRST + i
        recs = []
        for ch in ("src/0", "src/1", "src/2"):
            if rnd.random() < 0.25:  # an idle channel this epoch
                continue
            for _ in range(rnd.randint(1, 10)):
                k = f"k{rnd.randint(0, 9)}" if rnd.random() > 0.05 else None
                recs.append({"k": k, "et": e * E_US + rnd.randint(-90_000_000, E_US - 1), "v": rnd.uniform(-9, 9),
                             "_ingest_ts": e * E_US + rnd.randint(0, E_US - 1), "_wm_channel": ch,
                             "_kg": _kg(k) if k else 0})
        marks: dict[str, int] = {}
        for r in recs:
            if r["k"] is not None:
                marks[r["_wm_channel"]] = max(marks.get(r["_wm_channel"], r["et"]), r["et"])
        per: dict[int, list[dict]] = {}
        for s in range(P2):
            kgr = range_for_subtask(8, P2, s)
            rows = [{**r, "_subtask": s} for r in recs if kgr.start <= r["_kg"] <= kgr.end]
            rows += [{"_wm_channel": c, "_subtask": s, "_wm_max": t} for c, t in sorted(marks.items())]
            per[s] = rows
        out.append(per)
    return out


def _window_task(root: str, emit: str):
    from pipeline.runtime.operators.window import WindowTaskSpec, make_window_task
    from pipeline.windows.aggregate import EmitMode, WindowSpec, output_schema
    w = WindowSpec("k", "et", 120_000_000, 60_000_000, 20_000_000, 30_000_000,
                   (("n", "count", None), ("s", "sum", "v"), ("hi", "max", "v")), EmitMode(emit))
    return make_window_task(WindowTaskSpec("w", "chk-?", w, W_IN, P2, 8, {}, "", "", "", "", output_schema(w, W_IN),
                                           f"{root}/dlq/w", "dead_letter"))


def _window_reports(got: list[pa.RecordBatch]) -> list[dict]:
    return _rows(from_table(pa.Table.from_batches(got)))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("emit", ["final", "update"])
def test_window_tagged_round_equals_sequential_rounds(tmp_path, monkeypatch, seed, emit, backend_name):
    """Two subtasks, watermarks advancing per epoch inside the round: each epoch's firings (staged output), late
    records (dead letters), window state and watermark state equal those of its own round, subtask by subtask."""
    _short_profile((backend_name == "heap" and (seed < 2 if emit == "final" else seed == 0))
                   or (seed == 0 and emit == "final"))
    inputs = _window_inputs(random.Random(seed))
    beacon = {s: {"_subtask": s, BEACON: True} for s in range(P2)}
    # sequential: one round per epoch, both subtasks, the parent = every subtask's handles of the epoch before
    root = (tmp_path / "seq").as_uri()
    seq: list[list] = []
    parent: dict = {}
    for i, per in enumerate(inputs):
        p = _params(root, "w", 10 + i, FIRST + i, None, chained=False, parent=parent)
        rows = []
        for s in range(P2):
            t = pa.Table.from_pylist([beacon[s]] + per[s], schema=W_WIRE)
            rows += _window_reports(_run(_window_task(root, emit), t.to_batches(max_chunksize=5), p, monkeypatch))
        parent = {}
        for r in rows:
            if r["kind"] == "state":
                parent.setdefault(r["name"], []).append(r["_state"].to_dict())
        seq.append((rows, []))
    backend._RECENT.clear()
    # tagged: one round per subtask over every epoch
    root = (tmp_path / "tag").as_uri()
    entries = [{"checkpoint_id": 10 + i, "epoch": FIRST + i,
                "params": _params(root, "w", 10 + i, FIRST + i, None, chained=False, parent={})}
               for i in range(EPOCHS)]
    wire = W_WIRE.append(pa.field(EPOCH_TAG, pa.int64()))
    rows = []
    for s in range(P2):
        t = pa.Table.from_pylist([beacon[s]] + [{**r, EPOCH_TAG: FIRST + i} for i, per in enumerate(inputs)
                                               for r in per[s]], schema=wire)
        rows += _window_reports(_run(_window_task(root, emit), t.to_batches(max_chunksize=7), {TAGGED_KEY: entries},
                                     monkeypatch))
    tag = [([r for r in rows if r["checkpoint_id"] == 10 + i], []) for i in range(EPOCHS)]
    keyed = [([{**r, "name": f"{r['name']}#{r['subtask']}"} for r in rs], f) for rs, f in seq]
    _same(keyed, [([{**r, "name": f"{r['name']}#{r['subtask']}"} for r in rs], f) for rs, f in tag])
    fired = [r for rs, _ in seq for r in rs if r["kind"] == "output" and r["rows"]]
    assert {r["subtask"] for r in fired} == {0, 1}, "both subtasks fire windows"
    assert sum(r["rows"] for rs, _ in seq for r in rs if r["kind"] == "dead_letter") > 0, "no late record"
    assert _rematerialised(seq), "no materialisation inside the round"


def test_a_task_function_built_under_embedded_params_carries_every_epoch_by_value(tmp_path, monkeypatch):
    """Spark Connect (no local properties): a task function created while the plan is built under
    ``EmbeddedParams`` captures the round's per-epoch values and, pickled by value as Connect ships it, runs the
    tagged round exactly as the local-property path does (and without any local property)."""
    from pyspark import cloudpickle

    from pipeline.runtime.operators.round_params import EmbeddedParams, operator_key
    state = pa.schema([("g", pa.string()), ("n", pa.int64()), ("s", EXACT_SUM)])
    out = pa.schema([("g", pa.string()), ("n", pa.int64()), ("s", pa.float64())])

    def make():
        return make_agg_task(AggTaskSpec("a", "chk-?", "g", (("n", "count", None), ("s", "sum", "x")), state, 1, 8,
                                         {}, "", "", "", "", None, out))

    rnd = random.Random(5)
    schema = pa.schema([("g", pa.string()), ("x", pa.float64()), ("_kg", pa.int32()), (EPOCH_TAG, pa.int64())])
    inputs = [pa.Table.from_pylist([{"g": (g := f"k{rnd.randint(0, 9)}"), "x": rnd.uniform(-5, 5), "_kg": _kg(g),
                                     EPOCH_TAG: FIRST + i} for _ in range(rnd.randint(1, 20))], schema=schema)
              for i in range(EPOCHS)]
    inputs, seq_inputs = _beaconed(inputs)
    seq = _sequential(make, "a", seq_inputs, (tmp_path / "seq").as_uri(), None, False, monkeypatch)
    backend._RECENT.clear()
    root = (tmp_path / "emb").as_uri()
    entries = [{"checkpoint_id": 10 + i, "epoch": FIRST + i,
                "params": _params(root, "a", 10 + i, FIRST + i, None, chained=False, parent={})}
               for i in range(EPOCHS)]
    with EmbeddedParams({operator_key("a"): {TAGGED_KEY: entries}}):
        shipped = cloudpickle.dumps(make())
    task = cloudpickle.loads(shipped)
    monkeypatch.setattr(ops, "task_params", lambda key: None)  # no local property anywhere
    rows = _rows(from_table(pa.Table.from_batches(list(task(iter(pa.concat_tables(inputs).to_batches()))))))
    _same(seq, [([r for r in rows if r["checkpoint_id"] == 10 + i], []) for i in range(EPOCHS)])
