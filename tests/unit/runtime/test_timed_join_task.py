"""The interval and temporal join's executor task (``pipeline.runtime.operators.timed_join``) without Spark, on both
state backends: random epochs of both sides routed to their subtasks (with the watermark marker rows every subtask
receives), the parallelism changing between epochs (2 -> 3 -> 1 -> 2: state restored by key group from the previous
epoch's handles), the watermark derived from the markers by every subtask and written by subtask 0. Per epoch the
output rows, the dead-lettered rows and the held state (read back from the snapshot files) equal those of the kernel
run on one in-memory table with the same watermarks: what the runtime adds (routing, state files, rescaling, the
rocksdb keyed reads by the index of leaving rows) changes nothing."""
from __future__ import annotations

import dataclasses
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.handles import StateHandle
from pipeline.fileio import LocalFileIO
from pipeline.keygroups import range_for_subtask
from pipeline.operators.interval_join import IntervalJoinSpec, interval_join_step, state_schema
from pipeline.operators.temporal_join import TemporalJoinSpec, temporal_join_step
from pipeline.runtime.operators import task as ops
from pipeline.runtime.operators.report_codec import from_table
from pipeline.runtime.operators.round_params import EPOCH_TAG, TAGGED_KEY
from pipeline.runtime.operators.task import BEACON
from pipeline.runtime.operators.timed_join import SIDE, TimedJoinTaskSpec, make_timed_join_task
from pipeline.runtime.operators.window import CHANNEL, MARKER
from pipeline.state import backend
from pipeline.state.backend import KG_COLUMN, read_state
from pipeline.state.materialization import MaterializationPolicy
from pipeline.state.snapshot import SnapshotOptions
from pipeline.windows.watermark import WatermarkState

pytestmark = [pytest.mark.unit, pytest.mark.usefixtures("state_cache_dir")]

E_US = 60_000_000
SEC = 1_000_000
MP = 8
TS = pa.timestamp("us", tz="UTC")
LEFT = pa.schema([("k", pa.string()), ("lt", TS), ("lid", pa.int64()), (KG_COLUMN, pa.int32())])
RIGHT = pa.schema([("k", pa.string()), ("rt", TS), ("rid", pa.int64()), ("_ingest_ts", TS), (KG_COLUMN, pa.int32())])
WIRE = pa.schema([("k", pa.string()), ("lt", TS), ("lid", pa.int64()), ("rt", TS), ("rid", pa.int64()),
                  ("_ingest_ts", TS), (KG_COLUMN, pa.int32()), ("_subtask", pa.int32()), (SIDE, pa.int8()),
                  (CHANNEL, pa.string()), (MARKER, pa.int64()), (BEACON, pa.bool_())])
PARALLELISM = (2, 3, 1, 2, 2)
WM_SCHEMA = pa.schema([("channel", pa.string()), ("max_event_us", pa.int64())])


def _kg(k: str | None) -> int:
    return 0 if k is None else int(k[1:]) % MP


def _kernel(kind: str):
    if kind.startswith("interval"):   # interval, interval_full (the outer join: _matched held in state)
        return IntervalJoinSpec("k", "lt", "rt", -10 * SEC, 25 * SEC, (KG_COLUMN,),
                                "full" if kind == "interval_full" else "inner")
    return TemporalJoinSpec("k", "lt", "rt", "left", (KG_COLUMN,))


def _held(k, schema: pa.Schema, side: str) -> pa.Schema:
    return state_schema(k, schema, side) if isinstance(k, IntervalJoinSpec) else schema


def _params(root, cid: int, epoch: int, parent: dict, backend_name: str) -> dict:
    return {"barrier_us": (epoch + 1) * E_US, "checkpoint": f"chk-{cid}", "parent_handles": parent,
            "state_prefix": f"{root}/chk-{cid}/state/tj", "output_prefix": f"{root}/sink/txn-{cid}",
            "output_name": "out", "file_tag": "r0", "ack_prefix": None, "epoch": epoch, "complete": True,
            "snapshot": SnapshotOptions(checkpoint_id=cid, round=0, shared=f"{root}/shared/tj",
                                        policy=MaterializationPolicy(True, 2, 10.0), backend=backend_name,
                                        job_root=root).to_params()}


def _epochs(rnd: random.Random, n: int = 5):
    out, rid = [], 0
    for m in range(n):
        rows = []
        for side in (0, 1):
            for _ in range(rnd.randint(0, 25)):
                k = None if rnd.random() < 0.05 else f"k{rnd.randint(0, 9)}"
                t = (m * 60 + rnd.randint(-50, 59)) * SEC
                rows.append((side, k, t, rid, rnd.randint(0, 1)))
                rid += 1
        out.append(rows)
    return out


def _table(rows, side: int) -> pa.Table:
    if side == 0:
        return pa.Table.from_pylist([{"k": k, "lt": t, "lid": i, KG_COLUMN: _kg(k)} for s, k, t, i, _p in rows
                                     if s == 0], schema=LEFT)
    return pa.Table.from_pylist([{"k": k, "rt": t, "rid": i, "_ingest_ts": i, KG_COLUMN: _kg(k)}
                                 for s, k, t, i, _p in rows if s == 1], schema=RIGHT)


@pytest.mark.parametrize("kind", ["interval", "interval_full", "temporal"])
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("backend_name", ["heap", "rocksdb"])
def test_task_over_subtasks_and_rescales_equals_the_kernel(tmp_path, monkeypatch, kind, seed, backend_name):
    rnd = random.Random(seed)
    epochs = _epochs(rnd)
    root = (tmp_path / "run").as_uri()
    fio = LocalFileIO()
    k = _kernel(kind)
    step = interval_join_step if kind.startswith("interval") else temporal_join_step
    ref_l, ref_r, wm = _held(k, LEFT, "left").empty_table(), _held(k, RIGHT, "right").empty_table(), WatermarkState()
    parent: dict = {}
    for m, rows in enumerate(epochs):
        P = PARALLELISM[m]
        # the oracle: the kernel on one table, the watermark folded from the channels (side/partition)
        seen: dict[str, int] = {}
        for s, key, t, _i, p in rows:
            if key is not None:
                ch = f"{'ab'[s]}/{p}"
                seen[ch] = max(seen.get(ch, t), t)
        new_wm = wm.advance(seen, 5 * SEC)
        ref = step(k, ref_l, ref_r, _table(rows, 0), _table(rows, 1),  # type: ignore[arg-type]
                   late_watermark_us=wm.watermark_us, watermark_us=new_wm.watermark_us)
        ref_l, ref_r, wm = ref.left, ref.right, new_wm
        # the runtime: each subtask's rows, its beacon and the markers of every channel
        params = _params(root, 10 + m, m, parent, backend_name)
        monkeypatch.setattr(ops, "task_params", lambda key, p=params: p)
        reports = []
        for sub in range(P):
            kgr = range_for_subtask(MP, P, sub)
            wire = [{"_subtask": sub, BEACON: True}]
            for s, key, t, i, p in rows:
                if kgr.start <= _kg(key) <= kgr.end:
                    r = {"k": key, "lid" if s == 0 else "rid": i, "lt" if s == 0 else "rt": t, KG_COLUMN: _kg(key),
                         "_subtask": sub, SIDE: s, CHANNEL: f"{'ab'[s]}/{p}"}
                    if s == 1:
                        r["_ingest_ts"] = i
                    wire.append(r)
            wire += [{"_subtask": sub, CHANNEL: ch, MARKER: t} for ch, t in seen.items()]
            spec = TimedJoinTaskSpec("tj", "chk-?", k, LEFT, RIGHT, 5 * SEC, P, MP, {}, "", "", "", "",
                                     ref.output.schema, f"{root}/dlq/tj", "dead_letter")
            task = make_timed_join_task(spec)
            got = list(task(iter(pa.Table.from_pylist(wire, schema=WIRE).to_batches(max_chunksize=7))))
            reports += from_table(pa.Table.from_batches(got))
        parent = {}
        out, dead = [], []
        for r in reports:
            if r.kind.value == "state":
                parent.setdefault(r.name, []).append(r.state.to_dict())
            elif r.kind.value == "output" and r.file is not None:
                out += pq.read_table(r.file.uri[len("file://"):]).to_pylist()
            elif r.kind.value == "dead_letter" and r.file is not None:
                dead += pq.read_table(r.file.uri[len("file://"):]).to_pylist()
        assert sorted(map(repr, out)) == sorted(map(repr, ref.output.to_pylist())), f"epoch {m}: output"
        want_dead = sorted([x["lid"] for x in ref.late_left.to_pylist() + ref.bad_left.to_pylist()]
                           + [x["rid"] for x in ref.late_right.to_pylist() + ref.bad_right.to_pylist()])
        assert sorted(x["lid"] if x["lid"] is not None else x["rid"] for x in dead) == want_dead, f"epoch {m}"
        backend._RECENT.clear()
        for name, ref_t, schema in (("left", ref_l, _held(k, LEFT, "left")), ("right", ref_r, _held(k, RIGHT, "right"))):
            handles = [StateHandle.from_dict(h) for h in parent[name]]
            held = read_state(fio, handles, 0, MP - 1, schema, f"chk-{10 + m}")
            assert sorted(map(repr, held.to_pylist())) == sorted(map(repr, ref_t.to_pylist())), f"epoch {m}: {name}"
        wm_handles = [StateHandle.from_dict(h) for h in parent["wm"]]
        assert WatermarkState.from_table(read_state(fio, wm_handles, 0, 1 << 30, pa.schema(
            [("channel", pa.string()), ("max_event_us", pa.int64())]), "")).watermark_us == wm.watermark_us


def _wire_rows(rows, sub: int, P: int, seen: dict[str, int], tag: int | None) -> list[dict]:
    kgr = range_for_subtask(MP, P, sub)
    extra = {} if tag is None else {EPOCH_TAG: tag}
    wire = []
    for s, key, t, i, p in rows:
        if kgr.start <= _kg(key) <= kgr.end:
            r = {"k": key, "lid" if s == 0 else "rid": i, "lt" if s == 0 else "rt": t, KG_COLUMN: _kg(key),
                 "_subtask": sub, SIDE: s, CHANNEL: f"{'ab'[s]}/{p}", **extra}
            if s == 1:
                r["_ingest_ts"] = i
            wire.append(r)
    return wire + [{"_subtask": sub, CHANNEL: ch, MARKER: t, **extra} for ch, t in seen.items()]


def _contents(reports) -> dict:
    """Per checkpoint id: the output rows, the dead letters and each state's rows (read back from its files)."""
    fio = LocalFileIO()
    out: dict = {}
    for r in reports:
        d = out.setdefault(r.checkpoint_id, {"output": [], "dead": [], "left": [], "right": [], "wm": []})
        if r.kind.value == "state" and r.name in ("left", "right"):
            schema = LEFT if r.name == "left" else RIGHT
            d[r.name] += read_state(fio, [r.state], 0, MP - 1, schema, "t").to_pylist()
        elif r.kind.value == "state" and r.state.file is not None:
            d["wm"] += read_state(fio, [r.state], 0, 1 << 30, WM_SCHEMA, "t").to_pylist()
        elif r.kind.value in ("output", "dead_letter") and r.file is not None:
            d["output" if r.kind.value == "output" else "dead"] += pq.read_table(
                r.file.uri[len("file://"):]).drop_columns(["_watermark_us"] if r.kind.value != "output" else []
                                                          ).to_pylist()
    return {c: {k: sorted(map(repr, v)) for k, v in d.items()} for c, d in out.items()}


@pytest.mark.parametrize("kind", ["interval", "temporal"])
@pytest.mark.parametrize("backend_name", ["heap", "rocksdb"])
def test_tagged_round_equals_sequential_rounds(tmp_path, monkeypatch, kind, backend_name):
    """Several epochs in one round (epoch tags, the watermark carried from epoch to epoch in memory by subtask 1):
    each epoch's output, dead letters, states and watermark equal those of its own round."""
    epochs = _epochs(random.Random(3))
    k = _kernel(kind)
    P = 2
    seens = []
    for rows in epochs:
        seen: dict[str, int] = {}
        for s, key, t, _i, p in rows:
            if key is not None:
                ch = f"{'ab'[s]}/{p}"
                seen[ch] = max(seen.get(ch, t), t)
        seens.append(seen)

    def make(root):
        return make_timed_join_task(TimedJoinTaskSpec("tj", "chk-?", k, LEFT, RIGHT, 5 * SEC, P, MP, {}, "", "", "",
                                                      "", _out_schema(kind), f"{root}/dlq/tj", "dead_letter"))
    root = (tmp_path / "seq").as_uri()
    seq: list = []
    parent: dict = {}
    for m, rows in enumerate(epochs):
        params = _params(root, 10 + m, m, parent, backend_name)
        monkeypatch.setattr(ops, "task_params", lambda key, p=params: p)
        reports = []
        for sub in range(P):
            wire = [{"_subtask": sub, BEACON: True}] + _wire_rows(rows, sub, P, seens[m], None)
            got = list(make(root)(iter(pa.Table.from_pylist(wire, schema=WIRE).to_batches(max_chunksize=7))))
            reports += [dataclasses.replace(r, checkpoint_id=10 + m) for r in from_table(pa.Table.from_batches(got))]
        parent = {}
        for r in reports:
            if r.kind.value == "state":
                parent.setdefault(r.name, []).append(r.state.to_dict())
        seq += reports
    backend._RECENT.clear()
    root = (tmp_path / "tag").as_uri()
    entries = [{"checkpoint_id": 10 + m, "epoch": m, "params": _params(root, 10 + m, m, {}, backend_name)}
               for m in range(len(epochs))]
    monkeypatch.setattr(ops, "task_params", lambda key: {TAGGED_KEY: entries})
    tagged = []
    wire_schema = WIRE.append(pa.field(EPOCH_TAG, pa.int64()))
    for sub in range(P):
        wire = [{"_subtask": sub, BEACON: True}] + [r for m, rows in enumerate(epochs)
                                                     for r in _wire_rows(rows, sub, P, seens[m], m)]
        got = list(make(root)(iter(pa.Table.from_pylist(wire, schema=wire_schema).to_batches(max_chunksize=7))))
        tagged += from_table(pa.Table.from_batches(got))
    want, have = _contents(seq), _contents(tagged)
    assert sorted(want) == sorted(have)
    for c in want:
        for what in want[c]:
            assert have[c][what] == want[c][what], f"checkpoint {c}: {what}"
    assert any(want[c]["output"] for c in want) and any(want[c]["dead"] for c in want)


def _out_schema(kind: str) -> pa.Schema:
    step = interval_join_step if kind == "interval" else temporal_join_step
    return step(_kernel(kind), LEFT.empty_table(), RIGHT.empty_table(), LEFT.empty_table(),  # type: ignore[arg-type]
                RIGHT.empty_table(), late_watermark_us=None, watermark_us=None).output.schema
