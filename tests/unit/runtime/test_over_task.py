"""The over aggregate's executor task (``pipeline.runtime.operators.over_aggregate``) without Spark, on both state
backends: random epochs of rows routed to their subtasks (with the watermark marker rows every subtask receives),
the parallelism changing between epochs (2 -> 3 -> 1 -> 2: state restored by key group from the previous epoch's
handles), the watermark derived from the markers by every subtask and written by subtask 0. Per epoch the output
rows, the dead-lettered rows and the held state (read back from the snapshot files) equal those of the kernel run
on one in-memory table with the same watermarks (ROWS and RANGE frames); and several epochs in one round (epoch
tags) equal one round per epoch."""
from __future__ import annotations

import dataclasses
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.checkpoint.handles import StateHandle
from pipeline.fileio import LocalFileIO
from pipeline.keygroups import range_for_subtask
from pipeline.operators.over_aggregate import FIRED, OverSpec, output_schema, over_step
from pipeline.operators.retract import SIGN
from pipeline.runtime.operators import task as ops
from pipeline.runtime.operators.over_aggregate import OverTaskSpec, make_over_task
from pipeline.runtime.operators.report_codec import from_ipc, from_table
from pipeline.runtime.operators.round_params import EPOCH_TAG, TAGGED_KEY
from pipeline.runtime.operators.sink_writer import from_changelog
from pipeline.runtime.operators.task import BEACON
from pipeline.runtime.operators.window import CHANNEL, MARKER
from pipeline.sink.deletes import DELETED
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
IN = pa.schema([("k", pa.string()), ("t", TS), ("v", pa.int64()), (KG_COLUMN, pa.int32())])
STATE = IN.append(pa.field(FIRED, pa.bool_()))
WIRE = pa.schema([("k", pa.string()), ("t", TS), ("v", pa.int64()), (KG_COLUMN, pa.int32()),
                  ("_subtask", pa.int32()), (CHANNEL, pa.string()), (MARKER, pa.int64()), (BEACON, pa.bool_())])
WM_SCHEMA = pa.schema([("channel", pa.string()), ("max_event_us", pa.int64())])
PARALLELISM = (2, 3, 1, 2, 2)
AGGS = (("n", "count", None), ("s", "sum", "v"), ("a", "avg", "v"))


def _kg(k: str | None) -> int:
    return 0 if k is None else int(k[1:]) % MP


def _kernel(frame: str) -> OverSpec:
    return OverSpec("k", "t", AGGS, rows=2 if frame == "rows" else None,
                    range_us=30 * SEC if frame == "range" else None, internal=(KG_COLUMN,))


def _params(root, cid: int, epoch: int, parent: dict, backend_name: str) -> dict:
    return {"barrier_us": (epoch + 1) * E_US, "checkpoint": f"chk-{cid}", "parent_handles": parent,
            "state_prefix": f"{root}/chk-{cid}/state/ov", "output_prefix": f"{root}/sink/txn-{cid}",
            "output_name": "out", "file_tag": "r0", "ack_prefix": None, "epoch": epoch, "complete": True,
            "snapshot": SnapshotOptions(checkpoint_id=cid, round=0, shared=f"{root}/shared/ov",
                                        policy=MaterializationPolicy(True, 2, 10.0), backend=backend_name,
                                        job_root=root).to_params()}


def _epochs(rnd: random.Random, n: int = 5):
    out, vid = [], 0
    for m in range(n):
        rows = []
        for _ in range(rnd.randint(0, 30)):
            k = None if rnd.random() < 0.05 else f"k{rnd.randint(0, 9)}"
            rows.append((k, (m * 60 + rnd.randint(-50, 59)) * SEC, vid, rnd.randint(0, 1)))
            vid += 1
        out.append(rows)
    return out


def _table(rows) -> pa.Table:
    return pa.Table.from_pylist([{"k": k, "t": t, "v": v, KG_COLUMN: _kg(k)} for k, t, v, _p in rows], schema=IN)


def _seen(rows) -> dict[str, int]:
    seen: dict[str, int] = {}
    for k, t, _v, p in rows:
        if k is not None:
            seen[f"a/{p}"] = max(seen.get(f"a/{p}", t), t)
    return seen


def _wire_rows(rows, sub: int, P: int, seen: dict[str, int], tag: int | None) -> list[dict]:
    kgr = range_for_subtask(MP, P, sub)
    extra = {} if tag is None else {EPOCH_TAG: tag}
    wire = [{"k": k, "t": t, "v": v, KG_COLUMN: _kg(k), "_subtask": sub, CHANNEL: f"a/{p}", **extra}
            for k, t, v, p in rows if kgr.start <= _kg(k) <= kgr.end]
    return wire + [{"_subtask": sub, CHANNEL: ch, MARKER: t, **extra} for ch, t in seen.items()]


def _spec(frame: str, P: int, root: str) -> OverTaskSpec:
    k = _kernel(frame)
    return OverTaskSpec("ov", "chk-?", k, IN, 5 * SEC, P, MP, {}, "", "", "", "", output_schema(k, IN),
                        f"{root}/dlq/ov", "dead_letter")


@pytest.mark.parametrize("frame", ["rows", "range"])
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("backend_name", ["heap", "rocksdb"])
def test_task_over_subtasks_and_rescales_equals_the_kernel(tmp_path, monkeypatch, frame, seed, backend_name):
    epochs = _epochs(random.Random(seed))
    root = (tmp_path / "run").as_uri()
    fio = LocalFileIO()
    ref_state, wm = STATE.empty_table(), WatermarkState()
    parent: dict = {}
    emitted = 0
    for m, rows in enumerate(epochs):
        P = PARALLELISM[m]
        seen = _seen(rows)
        new_wm = wm.advance(seen, 5 * SEC)
        ref = over_step(_kernel(frame), ref_state, _table(rows), late_watermark_us=wm.watermark_us,
                        watermark_us=new_wm.watermark_us)
        ref_state, wm = ref.state, new_wm
        params = _params(root, 10 + m, m, parent, backend_name)
        monkeypatch.setattr(ops, "task_params", lambda key, p=params: p)
        reports = []
        for sub in range(P):
            wire = [{"_subtask": sub, BEACON: True}] + _wire_rows(rows, sub, P, seen, None)
            got = list(make_over_task(_spec(frame, P, root))(
                iter(pa.Table.from_pylist(wire, schema=WIRE).to_batches(max_chunksize=7))))
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
        emitted += len(out)
        assert sorted(x["v"] for x in dead) == sorted(x["v"] for x in ref.late.to_pylist() + ref.bad.to_pylist())
        backend._RECENT.clear()
        held = read_state(fio, [StateHandle.from_dict(h) for h in parent["rows"]], 0, MP - 1, STATE, f"chk-{10 + m}")
        assert sorted(map(repr, held.to_pylist())) == sorted(map(repr, ref_state.to_pylist())), f"epoch {m}: rows"
        assert WatermarkState.from_table(read_state(fio, [StateHandle.from_dict(h) for h in parent["wm"]], 0,
                                                    1 << 30, WM_SCHEMA, "")).watermark_us == wm.watermark_us
    assert emitted > 30


def _contents(reports) -> dict:
    """Per checkpoint id: the output rows, the dead letters and each state's rows (read back from its files)."""
    fio = LocalFileIO()
    out: dict = {}
    for r in reports:
        d = out.setdefault(r.checkpoint_id, {"output": [], "dead": [], "rows": [], "wm": []})
        if r.kind.value == "state" and r.name == "rows":
            d["rows"] += read_state(fio, [r.state], 0, MP - 1, STATE, "t").to_pylist()
        elif r.kind.value == "state" and r.state.file is not None:
            d["wm"] += read_state(fio, [r.state], 0, 1 << 30, WM_SCHEMA, "t").to_pylist()
        elif r.kind.value in ("output", "dead_letter") and r.file is not None:
            d["output" if r.kind.value == "output" else "dead"] += pq.read_table(
                r.file.uri[len("file://"):]).drop_columns(["_watermark_us"] if r.kind.value != "output" else []
                                                          ).to_pylist()
    return {c: {k: sorted(map(repr, v)) for k, v in d.items()} for c, d in out.items()}


@pytest.mark.parametrize("backend_name", ["heap", "rocksdb"])
def test_tagged_round_equals_sequential_rounds(tmp_path, monkeypatch, backend_name):
    """Several epochs in one round (epoch tags, the watermark carried from epoch to epoch in memory): each epoch's
    output, dead letters, states and watermark equal those of its own round."""
    epochs = _epochs(random.Random(3))
    P = 2
    seens = [_seen(rows) for rows in epochs]
    root = (tmp_path / "seq").as_uri()
    seq: list = []
    parent: dict = {}
    for m, rows in enumerate(epochs):
        params = _params(root, 10 + m, m, parent, backend_name)
        monkeypatch.setattr(ops, "task_params", lambda key, p=params: p)
        reports = []
        for sub in range(P):
            wire = [{"_subtask": sub, BEACON: True}] + _wire_rows(rows, sub, P, seens[m], None)
            got = list(make_over_task(_spec("rows", P, root))(
                iter(pa.Table.from_pylist(wire, schema=WIRE).to_batches(max_chunksize=7))))
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
        got = list(make_over_task(_spec("rows", P, root))(
            iter(pa.Table.from_pylist(wire, schema=wire_schema).to_batches(max_chunksize=7))))
        tagged += from_table(pa.Table.from_batches(got))
    want, have = _contents(seq), _contents(tagged)
    assert sorted(want) == sorted(have)
    for c in want:
        for what in want[c]:
            assert have[c][what] == want[c][what], f"checkpoint {c}: {what}"
    assert any(want[c]["output"] for c in want) and any(want[c]["dead"] for c in want)


# -- over an updating stream: the changelog to the sink's writer ----------------------------------------------------

UIN = pa.schema([("u", pa.string()), ("k", pa.string()), ("t", TS), ("v", pa.int64()), (KG_COLUMN, pa.int32())])
UWIRE = pa.schema([*UIN, ("_subtask", pa.int32()), (CHANNEL, pa.string()), (MARKER, pa.int64()), (BEACON, pa.bool_()),
                   (SIGN, pa.int32())])
UAGGS = (("s", "sum", "v"), ("n", "count", None))


def _window(current: dict) -> dict:
    """Per upstream key ``u``: its row and SQL's SUM/COUNT over ROWS 2 PRECEDING of its partition ``k`` (order: t, u,
    v), over the current rows."""
    out = {}
    for k in {r[1] for r in current.values()}:
        part = sorted((r for r in current.values() if r[1] == k), key=lambda r: (r[2], r[0], r[3]))
        for p, r in enumerate(part):
            win = part[max(0, p - 2):p + 1]
            out[r[0]] = {"u": r[0], "k": r[1], "t": r[2], "v": r[3], "s": sum(x[3] for x in win), "n": len(win)}
    return out


@pytest.mark.parametrize("backend_name", ["heap", "rocksdb"])
def test_changelog_through_the_writer_deletes_vanished_rows(tmp_path, monkeypatch, backend_name):
    """Over a retract changelog (rows replaced, moved to another partition, or vanishing), chained: the task's rows
    flowing on, applied per round by the sink writer's :func:`from_changelog` (tombstones for keys only retracted),
    leave exactly SQL's window over the current rows in an upsert sink keyed by ``u``, over subtasks rescaled
    2 -> 3 -> 1 -> 2 on both backends; vanished rows are deleted and the rows after them shifted."""
    rnd = random.Random(7)
    kernel = OverSpec("k", "t", UAGGS, rows=2, internal=(KG_COLUMN,))
    out_schema = output_schema(kernel, UIN)
    flow = out_schema.append(pa.field(SIGN, pa.int32()))
    root = (tmp_path / "run").as_uri()
    current: dict[str, tuple] = {}
    sink: dict[str, dict] = {}
    parent: dict = {}
    deleted = 0
    for m, P in enumerate((2, 3, 1, 2, 2, 3)):
        log = []
        for _ in range(rnd.randint(5, 25)):
            u = f"u{rnd.randint(0, 19)}"
            if u in current:
                log.append((*current.pop(u), -1))
            if rnd.random() < 0.7:   # else the row vanishes (a top-N row pushed out)
                current[u] = (u, f"k{rnd.randint(0, 3)}", (60 + rnd.randint(0, 30)) * SEC, rnd.randint(0, 9))
                log.append((*current[u], 1))
        if m == 3:   # partition key k0 empties: every row of it vanishes
            log += [(*current.pop(u), -1) for u in [u for u, r in current.items() if r[1] == "k0"]]
        params = {**_params(root, 10 + m, m, parent, backend_name), "ack_prefix": f"{root}/acks/{m}"}
        monkeypatch.setattr(ops, "task_params", lambda key, p=params: p)
        spec = OverTaskSpec("ov", "chk-?", kernel, UIN, 0, P, MP, {}, "", "", "", "", out_schema,
                            f"{root}/dlq/ov", "dead_letter", flow_schema=flow, changelog=True)
        rows = []
        for sub in range(P):
            kgr = range_for_subtask(MP, P, sub)
            wire = [{"_subtask": sub, BEACON: True}] + [
                {"u": u, "k": k, "t": t, "v": v, KG_COLUMN: _kg(k), "_subtask": sub, SIGN: sign}
                for u, k, t, v, sign in log if kgr.start <= _kg(k) <= kgr.end]
            got = list(make_over_task(spec)(iter(pa.Table.from_pylist(wire, schema=UWIRE).to_batches(
                max_chunksize=5))))
            rows += [pa.Table.from_batches(got, schema=flow)] if got else []
        parent = {}
        for sub in range(P):
            for r in from_ipc(LocalFileIO().read_bytes(f"{root}/acks/{m}/{sub:05d}.arrow")):
                if r.kind.value == "state":
                    parent.setdefault(r.name, []).append(r.state.to_dict())
                assert r.kind.value != "output" or r.file is None   # no sink of its own: the writer's
        staged = from_changelog(pa.concat_tables(rows) if rows else flow.empty_table(), out_schema, ["u"], ())
        for r in staged.to_pylist():
            if r.pop(DELETED):
                deleted += sink.pop(r["u"]) is not None
            else:
                sink[r["u"]] = {c: r[c] for c in ("u", "k", "t", "v", "s", "n")}
        want = _window({u: (u, k, int(t.timestamp() * SEC) if hasattr(t, "timestamp") else t, v)
                        for u, (u, k, t, v) in current.items()})
        have = {u: {**r, "t": int(r["t"].timestamp() * SEC)} for u, r in sink.items()}
        assert have == want, f"round {m}"
    assert deleted > 3
