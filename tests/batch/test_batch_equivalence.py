"""Batch equivalence: the runtime's state and committed output equal the batch evaluation of the job at
every completed checkpoint (jobs of our own, real local Spark), and the batch evaluation itself equals an
independent pandas brute force of the documented rules (docs/batch.md)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.insert(0, str(_HERE.parent / "quality"))

from batch_jobs import join_agg  # noqa: E402
from data import E_US, generate  # noqa: E402

from pipeline.job import JoinNode  # noqa: E402

pytestmark = [pytest.mark.spark]
CLOCK = "2027-01-01T00:00:00Z"
RECOVERY = {"epochal_recovery_key_groups", "epochal_recovery_totals", "epochal_recovery_conservation"}


def _runner(root: Path, job, **kw):
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    cfg = load_config(env={}, source_uri=(root / "src").as_uri(), checkpoint_uri=(root / "ckpt").as_uri(),
                      sink_uri=(root / "sink").as_uri(), clock_now=CLOCK, epoch_seconds=60, **kw)
    return JobRunner(job, cfg, echo=lambda m: None)


def _run_and_validate(root: Path, job, parallelism: int = 2) -> list:
    """Run epoch by epoch; validate every completed checkpoint; returns the results."""
    from pipeline.quality import validate_job
    r = _runner(root, job, parallelism=parallelism)
    results = []
    for _ in range(8):
        if not r.run(epochs=1).completed:
            break
        results.append(validate_job(r, None, build_docs=False, store_results=False))
    assert len(results) >= 4
    return results


def _recovery_failures(v) -> list[str]:
    return [f"{v.snapshot}: {s.suite}: " + "; ".join(f"{e.description} {list(e.unexpected_rows)[:2]}"
                                                    for e in s.expectations if not e.success)
            for s in v.suites if s.suite in RECOVERY and not s.success]


def test_runtime_equals_batch_evaluation_at_every_checkpoint(tmp_path):
    """Unique keys, a late partner beyond the TTL, an idle partition that delivers its rows late, an aggregate
    over the join and one over a raw source."""
    generate(tmp_path / "src", seed=3, idle={(1, 2)})
    results = _run_and_validate(tmp_path, join_agg())
    for v in results:
        assert _recovery_failures(v) == []
        assert v.figures.get("not_checked") == {}
        assert {s.suite for s in v.suites if s.suite in RECOVERY and s.skipped is None} == RECOVERY
        assert v.figures["recomputed"]["sink/pairs"] > 0


def test_many_to_many_runtime_equals_batch_evaluation(tmp_path):
    generate(tmp_path / "src", seed=5, repeated=True)
    for v in _run_and_validate(tmp_path, join_agg(ttl_seconds=150)):
        assert _recovery_failures(v) == []


def test_corrupted_state_and_output_are_caught_with_example_rows(tmp_path, monkeypatch):
    """A value in the join state and one committed output row of the append sink are changed (checksums and the
    commit log patched consistently, as a buggy writer would leave them): the executor-side comparison with the
    batch evaluation finds both and names the expected and the actual rows (one validation for both, to keep the
    default suite's time)."""
    import json

    import corrupt
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.quality import validate_job
    generate(tmp_path / "src", seed=3)
    r = _runner(tmp_path, join_agg())
    r.run(epochs=3)
    monkeypatch.setattr(corrupt, "JOB", "bt_join_agg")
    cid = corrupt.latest_checkpoint(tmp_path)

    def bump(t):
        i = t.schema.get_field_index("x")
        return t.set_column(i, "x", pc.add(t["x"], pa.scalar(1.0)))

    corrupt.change_state(tmp_path, cid, "lr-join", "left", bump, consistent=True)
    head = json.loads(sorted((tmp_path / "sink" / "bt_join_agg" / "pairs" / "_commits").glob("*.json"))[-1]
                      .read_text())
    uri = next(f["uri"] for f in head["files"] if f["rows"])
    victim = {}

    def wrong_y(t):
        ys = t["y"].to_pylist()
        victim.update(k=t["k"][0].as_py(), y=ys[0])
        ys[0] = ys[0] + 1000
        return t.set_column(t.schema.get_field_index("y"), "y", pa.array(ys, t.schema.field("y").type))

    corrupt._patch_handle_everywhere(tmp_path, uri, corrupt.rewrite_parquet(uri, wrong_y))
    v = validate_job(_runner(tmp_path, join_agg()), str(cid), build_docs=False, store_results=False)
    assert not v.success
    bad = [e for s in v.suites if s.suite == "epochal_recovery_key_groups" for e in s.expectations if not e.success]
    assert {e.kwargs.get("column") for e in bad} >= {"missing_rows", "extra_rows"}, v.summary()
    ex = [x for e in bad for x in e.examples]
    assert any(x.get("object") == "state/lr-join/left" for x in ex), ex
    sink = [x for x in ex if x.get("object") == "sink/pairs" and x.get("k") == victim["k"]]
    assert any(x.get("y") == victim["y"] and (x["_expected"], x["_actual"]) == (1, 0) for x in sink), ex
    assert any(x.get("y") == victim["y"] + 1000 and (x["_expected"], x["_actual"]) == (0, 1) for x in sink), ex


# ------------------------------------------------------------------------- brute force (no runtime)
def _read_all(root: Path, source: str) -> pd.DataFrame:
    parts = []
    for f in sorted((root / source).glob("partition=*/*.parquet")):
        parts.append(pq.read_table(f).to_pandas())
    df = pd.concat(parts, ignore_index=True)
    df["t"] = (df["_ingest_ts"] - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(microseconds=1)
    df["e"] = df["t"] // E_US
    return df


@pytest.mark.parametrize("repeated", [False, True])
def test_batch_evaluation_equals_pandas_brute_force(tmp_path, repeated):
    from pipeline.batch import Prefix, evaluate, join_semantics
    generate(tmp_path / "src", seed=9, repeated=repeated, epochs=5)
    ttl = 150
    job = join_agg(ttl_seconds=ttl)
    r = _runner(tmp_path, job)
    L, R = _read_all(tmp_path / "src", "lefts"), _read_all(tmp_path / "src", "rights")
    n = int(max(L["e"].max(), R["e"].max()))
    ends = {s: {p: (len(list((tmp_path / "src" / s / f"partition={p}").glob("*.parquet"))), 0) for p in (0, 1)}
            for s in ("lefts", "rights")}
    res = evaluate(r, job, Prefix(n, 60, ends, {}))
    # brute force of docs/batch.md, pair by pair
    Rf = R[R["tag"] != "drop"].rename(columns={"tag": "rtag"})
    pairs = L.merge(Rf, on="k", suffixes=("_l", "_r"))
    m = np.maximum(pairs["e_l"], pairs["e_r"])
    pairs = pairs[np.minimum(pairs["t_l"], pairs["t_r"]) >= (m + 1) * E_US - ttl * 1_000_000]
    exp = pairs[["k", "grp", "x", "y", "rtag"]].sort_values(["k", "x", "y", "rtag"]).reset_index(drop=True)
    got = res.sinks["pairs"].toPandas()[["k", "grp", "x", "y", "rtag"]].sort_values(
        ["k", "x", "y", "rtag"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, exp, check_dtype=False)
    assert len(exp) > 10
    tot = exp.groupby("grp").agg(n=("k", "size"), xs=("x", "sum"), ys=("y", "sum"), ymax=("y", "max")).reset_index()
    gt = res.states["state/per-grp/agg"].toPandas().sort_values("grp").reset_index(drop=True)
    pd.testing.assert_frame_equal(gt[["grp", "n", "xs", "ys", "ymax"]], tot, check_dtype=False)
    cutoff = (n + 1) * E_US - ttl * 1_000_000
    _, unique = join_semantics(job.operator("lr-join"))
    left = L[L["t"] >= cutoff]
    if unique in ("right", "both"):
        left = left[~left.set_index(["k", "x", "t"]).index.isin(pairs.set_index(["k", "x", "t_l"]).index)]
    got_left = res.states["state/lr-join/left"].toPandas()
    assert sorted(zip(got_left["k"], got_left["x"])) == sorted(zip(left["k"], left["x"]))
    raw = L.groupby("grp").agg(rows=("k", "size"), xmin=("x", "min")).reset_index()
    rt = res.states["state/raw-per-k/agg"].toPandas().sort_values("grp").reset_index(drop=True)
    pd.testing.assert_frame_equal(rt[["grp", "rows", "xmin"]], raw, check_dtype=False)


def test_unmodelled_parts_are_reported_not_skipped(tmp_path):
    """An append sink of an aggregate (a changelog) is not modelled: the result says so."""
    from batch_jobs import LEFT

    from pipeline import Job
    from pipeline.quality import validate_job
    generate(tmp_path / "src", seed=1, epochs=2)
    job = Job("bt_changelog", max_parallelism=8)
    job.source("lefts", LEFT, key="k").aggregate(uid="cnt", key="grp", aggs={"n": ("count", None)}).sink("changes")
    job.source("rights", __import__("batch_jobs").RIGHT, key="k")
    r = _runner(tmp_path, job)
    r.run(epochs=2)
    v = validate_job(r, None, build_docs=False, store_results=False)
    assert "sink/changes" in v.figures["not_checked"]
    assert any("NOT CHECKED" in m and "sink/changes" in m for m in v.messages)
    assert _recovery_failures(v) == []


@pytest.mark.parametrize("how,unique", [("full", None), ("left", None), ("inner", "left")])
def test_outer_and_unique_joins_equal_pandas_brute_force(tmp_path, how, unique):
    """The rules for ``how=`` and ``unique=`` (docs/batch.md) of the batch evaluation, against pandas."""
    import dataclasses

    from pipeline.batch import Prefix, evaluate

    generate(tmp_path / "src", seed=4, repeated=unique is None, epochs=5)
    ttl = 150
    job = join_agg(ttl_seconds=ttl)
    i = next(i for i, n in enumerate(job.nodes) if isinstance(n, JoinNode))
    job.nodes[i] = dataclasses.replace(job.nodes[i], how=how, unique=unique or "none")
    L, R = _read_all(tmp_path / "src", "lefts"), _read_all(tmp_path / "src", "rights")
    n = int(max(L["e"].max(), R["e"].max()))
    ends = {s: {p: (len(list((tmp_path / "src" / s / f"partition={p}").glob("*.parquet"))), 0) for p in (0, 1)}
            for s in ("lefts", "rights")}
    res = evaluate(_runner(tmp_path, job), job, Prefix(n, 60, ends, {}))
    Rf = R[R["tag"] != "drop"].rename(columns={"tag": "rtag"})
    L = L.assign(lid=range(len(L)))
    Rf = Rf.assign(rid=range(len(Rf)))
    pairs = L.merge(Rf, on="k", suffixes=("_l", "_r"))
    m = np.maximum(pairs["e_l"], pairs["e_r"])
    pairs = pairs[np.minimum(pairs["t_l"], pairs["t_r"]) >= (m + 1) * E_US - ttl * 1_000_000]
    cutoff = (n + 1) * E_US - ttl * 1_000_000
    rows = [pairs[["k", "grp", "x", "y", "rtag"]]]
    if how in ("left", "full"):
        lonely = L[~L["lid"].isin(pairs["lid"]) & (L["t"] < cutoff)]
        rows.append(lonely[["k", "grp", "x"]].assign(y=np.nan, rtag=None))
    if how in ("right", "full"):
        lonely = Rf[~Rf["rid"].isin(pairs["rid"]) & (Rf["t"] < cutoff)]
        rows.append(lonely[["k", "y", "rtag"]].assign(grp=None, x=np.nan))
    exp = pd.concat(rows, ignore_index=True)[["k", "grp", "x", "y", "rtag"]]
    got = res.sinks["pairs"].toPandas()[["k", "grp", "x", "y", "rtag"]]

    def canon(df):
        return sorted(tuple("<null>" if pd.isna(v) else (round(float(v), 6) if isinstance(v, (int, float, np.number))
                                                         else v) for v in r) for r in df.itertuples(index=False))

    assert canon(got) == canon(exp)
    assert len(exp) > len(pairs) or how == "inner"
    right = Rf[Rf["t"] >= cutoff]
    if unique in ("left", "both"):
        right = right[~right["rid"].isin(pairs["rid"])]
    got_r = res.states["state/lr-join/right"].toPandas()
    assert sorted(zip(got_r["k"], got_r["y"])) == sorted(zip(right["k"], right["y"]))
    left = L[L["t"] >= cutoff]
    got_l = res.states["state/lr-join/left"].toPandas()
    assert sorted(zip(got_l["k"], got_l["x"])) == sorted(zip(left["k"], left["x"]))


def _read_positions(root: Path, source: str) -> pd.DataFrame:
    """Every row of ``source`` with its position (partition, seq, row), as the batch evaluation orders them."""
    parts = []
    for f in sorted((root / source).glob("partition=*/*.parquet")):
        df = pq.read_table(f).to_pandas()
        parts.append(df.assign(part=int(f.parent.name.split("=")[1]), seq=int(f.stem), row=range(len(df))))
    df = pd.concat(parts, ignore_index=True)
    df["t"] = (df["_ingest_ts"] - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(microseconds=1)
    df["e"] = df["t"] // E_US
    return df


@pytest.mark.parametrize("how", ["full"])
def test_unique_both_join_with_violations_equals_the_kernel(tmp_path, how):
    """``unique="both"`` over repeated keys (docs/batch.md "join"): the plan folds the repeated keys by the kernel's
    per-round rule; its output, lonely outer rows, both state sides and violation counts equal the runtime's kernel
    (``join_step``) run epoch by epoch over the same rows (one round per epoch: no round log)."""
    import dataclasses

    import pyarrow as pa

    from pipeline.batch import Prefix, evaluate
    from pipeline.operators.join import JoinType, Uniqueness, join_step

    generate(tmp_path / "src", seed=5, repeated=True, epochs=5)
    ttl = 150
    job = join_agg(ttl_seconds=ttl)
    i = next(i for i, n in enumerate(job.nodes) if isinstance(n, JoinNode))
    job.nodes[i] = dataclasses.replace(job.nodes[i], how=how, unique="both")
    L, R = _read_positions(tmp_path / "src", "lefts"), _read_positions(tmp_path / "src", "rights")
    n = int(max(L["e"].max(), R["e"].max()))
    ends = {s: {p: (len(list((tmp_path / "src" / s / f"partition={p}").glob("*.parquet"))), 0) for p in (0, 1)}
            for s in ("lefts", "rights")}
    res = evaluate(_runner(tmp_path, job), job, Prefix(n, 60, ends, {}))
    assert not res.unchecked, res.unchecked
    Rf = R[R["tag"] != "drop"].rename(columns={"tag": "rtag"})
    ts = pa.timestamp("us", tz="UTC")

    def table(df, cols):   # the kernel's input: the stream's columns in order, then the own epoch p(x) = min(e, n)
        t = pa.Table.from_pandas(df[cols + ["_ingest_ts"]], preserve_index=False)
        t = t.set_column(t.schema.get_field_index("_ingest_ts"), "_ingest_ts", t["_ingest_ts"].cast(ts))
        return t.append_column("_pepoch", pa.array(np.minimum(df["e"], n).astype("int64")))
    lcols = [c for c in pq.read_schema(next((tmp_path / "src" / "lefts").glob("partition=*/*.parquet"))).names
             if c != "_ingest_ts"]
    out_schema = pa.schema([("k", pa.string()), ("grp", pa.string()), ("x", pa.float64()), ("y", pa.float64()),
                            ("rtag", pa.string())])
    lt, rt = table(L, lcols), table(Rf, ["k", "y", "rtag"])
    st_l, st_r = lt.slice(0, 0), rt.slice(0, 0)
    outs, bad = [], {"left": 0, "right": 0}
    for m in range(int(min(L["e"].min(), R["e"].min())), n + 1):
        nl = lt.filter(pa.compute.equal(lt["_pepoch"], m))
        nr = rt.filter(pa.compute.equal(rt["_pepoch"], m))
        step = join_step(st_l, st_r, nl, nr, key="k", cutoff=pa.scalar((m + 1) * E_US - ttl * 1_000_000, ts),
                         how=JoinType(how), unique=Uniqueness.BOTH, output_schema=out_schema,
                         ttl_us=ttl * 1_000_000, epoch_us=E_US)
        st_l, st_r = step.left, step.right
        outs.append(step.output)
        bad["left"] += step.violations_left.num_rows
        bad["right"] += step.violations_right.num_rows
    exp = pa.concat_tables(outs).to_pandas()[["k", "grp", "x", "y", "rtag"]]
    got = res.sinks["pairs"].toPandas()[["k", "grp", "x", "y", "rtag"]]

    def canon(df):
        return sorted(tuple("<null>" if pd.isna(v) else (round(float(v), 6) if isinstance(v, (int, float, np.number))
                                                         else v) for v in r) for r in df.itertuples(index=False))

    assert canon(got) == canon(exp)
    assert (exp["y"].notna() & exp["x"].notna()).sum() > 5 and exp["y"].isna().any() and exp["x"].isna().any()
    got_l, got_r = res.states["state/lr-join/left"].toPandas(), res.states["state/lr-join/right"].toPandas()
    assert sorted(zip(got_l["k"], got_l["x"])) == sorted(zip(st_l["k"].to_pylist(), st_l["x"].to_pylist()))
    assert sorted(zip(got_r["k"], got_r["y"])) == sorted(zip(st_r["k"].to_pylist(), st_r["y"].to_pylist()))
    assert st_l.num_rows + st_r.num_rows > 0
    flagged = res.matched["state/lr-join/left"].toPandas()
    assert len(flagged) == st_l.num_rows and not flagged["_matched"].any()
    counts = {what.split(":")[1].split()[0]: df.count() for what, df in res.counts.items()}
    assert counts == bad and bad["left"] and bad["right"]      # the data has violations on both sides
    res.release()
