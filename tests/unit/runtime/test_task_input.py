"""How an operator task takes its input apart (no Spark): the subtask beacon (``subtask_of``), a tagged round's rows
split per epoch (``split_epochs``: batch by batch, a batch of one epoch kept as it is, a mixed one sorted and sliced;
never a copy of the whole input), and the opt-in
task profiler (``EPOCHAL_TASK_PROFILE``). Each is checked against the plain row-by-row meaning on random inputs."""
from __future__ import annotations

import os
import random

import pyarrow as pa
import pytest

from pipeline.runtime.operators.round_params import EPOCH_TAG
from pipeline.runtime.operators.task import BEACON, split_epochs, subtask_of
from pipeline.runtime.operators.task_profile import PROFILE_ENV, profiled, summarize
from pipeline.state.backend import KG_COLUMN

pytestmark = pytest.mark.unit


def _rows(rng: random.Random, n: int, epochs: list[int | None], beacon_at: int | None, subtask: int = 3,
          keyed: bool = False) -> pa.Table:
    """Random rows of one subtask; ``keyed``: routed by key group (the beacon is the row with key group
    ``-1 - subtask``, no flag column), else flagged ``_beacon`` with a ``_subtask`` column."""
    if keyed:
        rows = [{"k": f"k{rng.randrange(50)}", "v": i, EPOCH_TAG: rng.choice(epochs), KG_COLUMN: rng.randrange(128)}
                for i in range(n)]
        beacon = {"k": None, "v": None, EPOCH_TAG: None, KG_COLUMN: -1 - subtask}
        schema = pa.schema([("k", pa.string()), ("v", pa.int64()), (EPOCH_TAG, pa.int64()), (KG_COLUMN, pa.int32())])
    else:
        rows = [{"k": f"k{rng.randrange(50)}", "v": i, EPOCH_TAG: rng.choice(epochs), BEACON: None, "_subtask": None}
                for i in range(n)]
        beacon = {"k": None, "v": None, EPOCH_TAG: None, BEACON: True, "_subtask": subtask}
        schema = pa.schema([("k", pa.string()), ("v", pa.int64()), (EPOCH_TAG, pa.int64()), (BEACON, pa.bool_()),
                            ("_subtask", pa.int32())])
    if beacon_at is not None:
        rows.insert(beacon_at, beacon)
    t = pa.Table.from_pylist(rows, schema=schema)
    cuts = sorted(rng.sample(range(1, max(2, t.num_rows)), min(3, max(0, t.num_rows - 1))))
    return pa.concat_tables([t.slice(a, b - a) for a, b in zip([0] + cuts, cuts + [t.num_rows])])  # chunked


def _is_beacon(r: dict) -> bool:
    return bool(r.get(BEACON)) or (r.get(KG_COLUMN) is not None and r[KG_COLUMN] < 0)


@pytest.mark.parametrize("keyed", [False, True], ids=["flagged", "keyed"])
@pytest.mark.parametrize("seed", range(8))
def test_split_epochs_is_the_per_epoch_filter(seed, keyed):
    rng = random.Random(seed)
    n = rng.randrange(0, 300)
    epochs: list[int | None] = [7, 9, 8, 12] + ([None] if seed % 3 == 0 else [])
    t = _rows(rng, n, epochs, beacon_at=rng.randrange(n + 1) if seed % 4 else None, keyed=keyed)
    beacon, parts, data_rows = split_epochs(t)
    rows = t.to_pylist()
    data = [r for r in rows if not _is_beacon(r)]
    assert data_rows == len(data)
    for e in (7, 8, 9, 12):
        want = [{k: v for k, v in r.items() if k != EPOCH_TAG} for r in data if r[EPOCH_TAG] == e]
        got = parts[e].to_pylist() if e in parts else []
        assert got == want  # same rows, arrival order kept
    assert set(parts) <= {7, 8, 9, 12}
    assert sum(p.num_rows for p in parts.values()) == sum(1 for r in data if r[EPOCH_TAG] is not None)
    if seed % 4:
        assert beacon is not None and beacon.to_pylist() == (
            [{"k": None, "v": None, KG_COLUMN: -4}] if keyed else [{"k": None, "v": None, BEACON: True, "_subtask": 3}])
    else:
        assert beacon is None
    assert split_epochs(None) == (None, {}, 0)


@pytest.mark.parametrize("seed", range(6))
def test_split_epochs_keeps_batches_of_one_epoch_without_a_copy(seed):
    """The rows come from the source stage in runs of one epoch (a tagged round's read tasks read the splits epoch by
    epoch), so most batches hold one epoch: those are kept as they are (their buffers, not a copy: a task holds its
    input once), the batches across a run boundary are sorted; the result is the per-epoch filter."""
    rng = random.Random(100 + seed)
    runs = []
    for e in rng.sample([3, 4, 5, 6], 4) * 2:  # two map outputs' runs, interleaved by the shuffle read
        n = rng.randrange(1, 60)
        runs.append(pa.table({"k": [f"k{rng.randrange(9)}-{i}" for i in range(n)],
                              EPOCH_TAG: pa.array([e] * n, pa.int64()), BEACON: pa.nulls(n, pa.bool_()),
                              "_subtask": pa.nulls(n, pa.int32())}))
    whole = pa.concat_tables(runs)
    beacon_at = rng.randrange(whole.num_rows)
    beacon = pa.table({"k": pa.nulls(1, pa.string()), EPOCH_TAG: pa.nulls(1, pa.int64()), BEACON: [True],
                       "_subtask": pa.array([1], pa.int32())})
    t = pa.concat_tables([whole.slice(0, beacon_at), beacon, whole.slice(beacon_at)])
    cuts = sorted(rng.sample(range(1, t.num_rows), 4))  # batches across run boundaries too
    t = pa.concat_tables([t.slice(a, b - a) for a, b in zip([0] + cuts, cuts + [t.num_rows])])
    got_beacon, parts, data_rows = split_epochs(t)
    rows = t.to_pylist()
    assert data_rows == len(rows) - 1 and got_beacon.to_pylist() == [{"k": None, BEACON: True, "_subtask": 1}]
    for e in (3, 4, 5, 6):
        assert parts[e].to_pylist() == [{k: v for k, v in r.items() if k != EPOCH_TAG} for r in rows
                                        if r[EPOCH_TAG] == e]
    inputs = {b.column(0).buffers()[2].address for b in t.to_batches()}
    kept = [b for p in parts.values() for b in p.to_batches() if b.column(0).buffers()[2].address in inputs]
    single = [b for b in t.to_batches() if b.num_rows and b.column(EPOCH_TAG).null_count == 0
              and len(set(b.column(EPOCH_TAG).to_pylist())) == 1]
    assert single and len(kept) >= len(single)  # every batch of one epoch is kept without a copy


@pytest.mark.parametrize("keyed", [False, True], ids=["flagged", "keyed"])
@pytest.mark.parametrize("seed", range(6))
def test_subtask_of_takes_the_one_beacon_out(seed, keyed):
    rng = random.Random(seed)
    n = rng.randrange(0, 200)
    t = _rows(rng, n, [1], beacon_at=rng.randrange(n + 1), subtask=seed, keyed=keyed).drop_columns([EPOCH_TAG])
    subtask, rest = subtask_of(t)
    assert subtask == seed
    want = [{k: v for k, v in r.items() if k != BEACON} for r in t.to_pylist() if not _is_beacon(r)]
    assert (rest.to_pylist() if rest is not None else []) == want
    two = pa.concat_tables([t, t])
    with pytest.raises(RuntimeError, match="exactly one subtask beacon, got 2"):
        subtask_of(two)
    with pytest.raises(RuntimeError, match="no subtask beacon"):
        subtask_of(t.drop_columns([BEACON, "_subtask"] if not keyed else [KG_COLUMN]))


def test_task_profile_writes_a_profile_only_when_asked(tmp_path, monkeypatch):
    def task(batches):
        for b in batches:
            yield b.append_column("w", pa.array([x * 2 for x in b.column(0).to_pylist()]))

    batch = pa.RecordBatch.from_pydict({"v": [1, 2, 3]})
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    plain = list(profiled("op-x", task)(iter([batch])))
    where = tmp_path / "prof"
    monkeypatch.setenv(PROFILE_ENV, str(where))
    traced = list(profiled("op-x", task)(iter([batch, batch])))
    assert [b.to_pydict() for b in plain] == [traced[0].to_pydict()] and len(traced) == 2
    files = os.listdir(where)
    assert len(files) == 1 and files[0].startswith("op-x-") and files[0].endswith(".prof")
    report = summarize(str(where))
    assert "==== op-x: 1 task(s)" in report and "task" in report
