"""A join's ``unique`` declaration over data that repeats a key (docs/batch.md "join", docs/operators.md "Declared
uniqueness"). The runtime decides a violation per round against the rows it still holds (``join._duplicates``): a
repeat after the first row left state (matched, partner side unique) or expired is no violation, a row of an
earlier round wins over an older row read in a later round; within a round the oldest ``_ingest_ts`` wins. The batch
plan reproduces it with a per-key fold over (epoch, round) for just the keys that repeat
(``pipeline.batch.evaluation.join_repeats._unique_fold``; ties on ``_ingest_ts`` broken by the other columns, as the kernel does), so
such joins, their dead letters and everything downstream are checked; rows tied in every comparable column that
differ in nested ones, and unaligned / at-least-once lineages, stay "not checked", with the reason.

Default suite (no Spark, ~10 s): the fold against the runtime's kernel ``join_step`` on random rows, every ``how``
and ``unique``. ``EPOCHAL_ROUND_CHECK=1``: the Spark scenarios (every checkpoint validated for three shapes, a
changed state row and dead letter caught, a tie on ``_ingest_ts`` decided as the kernel does, bootstrap then
restore+run equal to epoch by epoch).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))
sys.path.insert(0, str(_HERE.parent / "quality"))

RECOVERY = {"epochal_recovery_key_groups", "epochal_recovery_totals", "epochal_recovery_conservation"}


OPT_IN = pytest.mark.skipif(os.environ.get("EPOCHAL_ROUND_CHECK", "") not in ("1", "full"),
                            reason="opt-in: EPOCHAL_ROUND_CHECK=1 (unique joins with repeated keys through Spark)")


def _runner(tmp: Path, src: Path, job, **kw):
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    kw.setdefault("parallelism", 1)
    kw.setdefault("max_records_per_epoch", 4)     # epochs of more than 4 rows of a source take several rounds
    cfg = load_config(env={}, source_uri=src.as_uri(), checkpoint_uri=(tmp / "ckpt").as_uri(),
                      sink_uri=(tmp / "sink").as_uri(), epoch_seconds=60, retained_checkpoints=10, **kw)
    return JobRunner(job, cfg, echo=lambda m: None)


def _validate(r, cid):
    from pipeline.quality import validate_job
    return validate_job(r, str(cid), build_docs=False, store_results=False)


def _runtime_dead_letters(r, uid: str) -> list[tuple]:
    """``(id, epoch, _ingest_ts)`` of the rows the runtime dead-lettered for join ``uid`` (its JSON lines)."""
    import json
    base = Path(r.config.dead_letter_root.replace("file://", "")) / r.job.name / f"operator={uid}"
    out = []
    for f in sorted(base.rglob("*.jsonl")):
        for x in f.read_text().splitlines():
            if x.strip():
                v = json.loads(x)["values"]
                out.append((str(v.get("ask") or v.get("bid")), int(v["_pepoch"]), v["_ingest_ts"][:19]))
    return sorted(out)


def _plan_dead_letters(r, cid) -> list[tuple]:
    """``(id, epoch, _ingest_ts)`` of the rows the batch plan says the join dead-letters by checkpoint ``cid``."""
    from pipeline.batch import prefix_of
    from pipeline.batch.evaluation.plan import evaluate
    md = next(cp.metadata for cp in r.coordinator.store.list() if cp.checkpoint_id == cid)
    res = evaluate(r, r.job, prefix_of(r, md))
    try:
        assert not res.unchecked, res.unchecked          # decided: nothing "not checked"
        out = []
        for df in res.unique_dead.values():
            c = "ask" if "ask" in df.columns else "bid"
            out += [(str(x[0]), int(x[1]), x[2].isoformat()[:19]) for x in df.select(c, "_pepoch", "_ingest_ts").collect()]
        return sorted(out)
    finally:
        res.release()


@pytest.mark.spark
@OPT_IN
@pytest.mark.parametrize("unique,how,window", [("both", "inner", False), ("left", "full", False),
                                               ("right", "left", False), ("both", "inner", True),
                                               ("left", "full", True)])
def test_repeated_unique_keys_are_checked_at_every_checkpoint(tmp_path, unique, how, window):
    """Keys repeated on a unique side after match-and-leave, after TTL expiry, twice in one round, across the rounds
    of a backlog (epochs of more than 4 rows take several rounds), on the left and the right: every checkpoint
    validates against the batch evaluation with nothing unchecked, and the plan's dead letters are the runtime's.
    With a window reading the join's rows, the fold carries each row's watermark channels (checked too)."""
    import unique_jobs
    src = unique_jobs.write_shapes(tmp_path / "src", window=window)
    r = _runner(tmp_path, src, unique_jobs.build_shapes(unique, how, window=window))
    r.run(epochs=unique_jobs.SHAPE_EPOCHS)
    cps = sorted(r.coordinator.store.list(), key=lambda cp: cp.checkpoint_id)
    assert len(cps) == unique_jobs.SHAPE_EPOCHS and any(cp.metadata.stats.rounds > 1 for cp in cps)
    for cp in cps:
        v = _validate(r, cp.checkpoint_id)
        assert v.success, v.summary()
        assert not v.figures.get("not_checked"), v.figures.get("not_checked")
        assert {"state/uj/left", "state/uj/right", "sink/pairs", "state/per_k/agg"} <= set(v.figures["recomputed"])
        if window:
            assert {"sink/per_min"} <= set(v.figures["recomputed"]), v.figures["recomputed"]
    dead = _runtime_dead_letters(r, "uj")
    assert dead and dead == _plan_dead_letters(r, cps[-1].checkpoint_id)


@pytest.mark.spark
@OPT_IN
def test_a_changed_state_row_or_dead_letter_of_a_folded_join_fails(tmp_path, monkeypatch):
    """The check can fail: a dropped row of the join's state (a key that repeats) fails the validation, naming the
    object; a dropped or changed dead letter no longer equals the plan's."""
    import json

    import corrupt
    import pyarrow.compute as pc
    import unique_jobs
    src = unique_jobs.write_shapes(tmp_path / "src")
    r = _runner(tmp_path, src, unique_jobs.build_shapes("both", "full"))
    r.run(epochs=unique_jobs.SHAPE_EPOCHS)
    cp = r.coordinator.store.latest()
    assert cp is not None
    dead = _runtime_dead_letters(r, "uj")
    assert dead == _plan_dead_letters(r, cp.checkpoint_id)
    files = sorted((Path(r.config.dead_letter_root.replace("file://", "")) / r.job.name / "operator=uj").rglob("*.jsonl"))
    lines = files[0].read_text().splitlines()
    files[0].write_text("\n".join(lines[1:]) + ("\n" if lines[1:] else ""))
    assert _runtime_dead_letters(r, "uj") != _plan_dead_letters(r, cp.checkpoint_id)
    rec = json.loads(lines[0])
    rec["values"]["ask" if "ask" in rec["values"] else "bid"] = "changed"
    files[0].write_text("\n".join([json.dumps(rec)] + lines[1:]) + "\n")
    assert _runtime_dead_letters(r, "uj") != _plan_dead_letters(r, cp.checkpoint_id)
    # a state row of a repeated key dropped (k3's held ask: its repeats were dead letters, it is still held)
    monkeypatch.setattr(corrupt, "JOB", "uq_shapes")
    corrupt.change_state(tmp_path, cp.checkpoint_id, "uj", "left",
                         lambda t: t.filter(pc.not_equal(t["k"], "k3")), consistent=True)
    v = _validate(_runner(tmp_path, src, unique_jobs.build_shapes("both", "full")), cp.checkpoint_id)
    assert not v.success
    bad = [e for s in v.suites if s.suite in RECOVERY for e in s.expectations if not e.success]
    assert any(x.get("object") == "state/uj/left" for e in bad for x in e.examples), v.summary()


@pytest.mark.spark
@OPT_IN
def test_a_tie_on_ingest_ts_is_broken_by_the_other_columns_as_the_kernel_does(tmp_path):
    """Two asks of one key in one round with the same ``_ingest_ts`` (``a6`` and ``a6t``): the kernel keeps the first
    by the other columns in column order (``ask``: "a6" < "a6t"); the plan ranks them the same way, so the join is
    checked and its dead letters are the runtime's."""
    import unique_jobs
    src = unique_jobs.write_shapes(tmp_path / "src", tie=True)
    r = _runner(tmp_path, src, unique_jobs.build_shapes("both", "inner"))
    r.run(epochs=2)
    cp = r.coordinator.store.latest()
    v = _validate(r, cp.checkpoint_id)
    assert v.success, v.summary()
    assert not v.figures.get("not_checked"), v.figures.get("not_checked")
    dead = _runtime_dead_letters(r, "uj")
    assert "a6t" in {d[0] for d in dead} and "a6" not in {d[0] for d in dead}
    assert dead == _plan_dead_letters(r, cp.checkpoint_id)


@pytest.mark.spark
@OPT_IN
def test_repeated_unique_keys_in_an_unaligned_lineage_are_not_checked_with_the_reason(tmp_path):
    """Unaligned checkpoints: rows parked at the join or drained from a backlog meet the kernel in a later checkpoint
    than their own epoch's, with a cutoff recorded only in metadata retention deletes - the join and what it feeds
    are reported not checked, naming why; the validation still passes (never a false failure), and the rest of the
    job would be compared."""
    import unique_jobs
    src = unique_jobs.write_shapes(tmp_path / "src")
    r = _runner(tmp_path, src, unique_jobs.build_shapes("both", "inner"), unaligned=True)
    r.run(epochs=2)
    cp = r.coordinator.store.latest()
    v = _validate(r, cp.checkpoint_id)
    assert v.success, v.summary()
    nc = v.figures.get("not_checked") or {}
    assert {"state/uj/left", "state/uj/right", "sink/pairs", "state/per_k/agg", "sink/per_k"} <= set(nc), nc
    assert all("unaligned checkpoints" in nc[o] and "join uj" in nc[o] for o in ("state/uj/left", "sink/pairs")), nc


@pytest.mark.spark
@OPT_IN
def test_bootstrap_of_repeated_unique_keys_then_restore_run_equals_epoch_by_epoch(tmp_path):
    """Bootstrap at barrier 2 of the shapes (repeats decided by the fold: state with ``_matched``, dead letters),
    restore at parallelism 2, run to the end: sinks, every state table and the dead letters equal an epoch-by-epoch
    run's, and the last checkpoint validates with nothing unchecked. Bootstrap folds each epoch as ONE round (it has
    no round log: what an epoch-by-epoch run without a backlog does), so the reference run reads each epoch in one
    round too (a key repeated within an epoch across a backlog's rounds may be decided otherwise: docs/batch.md)."""
    import test_bootstrap as tb
    import unique_jobs

    from pipeline.batch.bootstrap.savepoint import bootstrap
    src = unique_jobs.write_shapes(tmp_path / "src")
    one = {"max_records_per_epoch": 1000}
    ref = _runner(tmp_path / "ref", src, unique_jobs.build_shapes("left", "full"), **one)
    ref.run(epochs=unique_jobs.SHAPE_EPOCHS)
    first = min(cp.metadata.epoch for cp in ref.coordinator.store.list())
    boot = _runner(tmp_path / "boot", src, unique_jobs.build_shapes("left", "full"), **one)
    d = bootstrap(boot, epoch=first + 2)
    ref_k = next(cp for cp in ref.coordinator.store.list() if cp.metadata.epoch == first + 2)
    tb._same_state(tb._state(ref, ref_k.location), tb._state(boot, d["savepoint"]))
    assert tb._dl_tree(boot)[1] == tb._dl_tree(ref, upto=first + 2)[1]
    assert d["dead_letters"].get("operator=uj")
    r2 = _runner(tmp_path / "boot", src, unique_jobs.build_shapes("left", "full"), parallelism=2, **one)
    r2.restore(d["savepoint"], parallelism=2, validate=False)
    r2.run(epochs=unique_jobs.SHAPE_EPOCHS - 3)
    assert r2.snapshot().metadata.epoch == ref.snapshot().metadata.epoch
    assert tb._sinks(r2) == tb._sinks(ref)
    tb._same_state(tb._state(ref), tb._state(r2))
    assert tb._dl_tree(r2)[1] == tb._dl_tree(ref)[1]
    last = r2.coordinator.store.latest()
    v = _validate(r2, last.checkpoint_id)
    assert v.success and not v.figures.get("not_checked"), v.summary()


# -- no Spark: the plan's per-key fold against the runtime's kernel --------------------------------------------------
E_US = 60_000_000


def _kernel_run(rows: list[dict], *, unique: str, how: str, ttl_s: int | None, n: int):
    """The runtime's kernel (``join_step``) over ``rows`` round by round: every epoch ``0..n`` runs its rounds (an
    epoch without rows one empty round: expiry), with the aligned cutoff ``end(m) - ttl``. Returns (pairs, bad,
    lone, state) as sets of row ids (``state``: ``(id, matched)``)."""
    import pyarrow as pa

    from pipeline.operators.join import JoinType, Uniqueness, join_step
    ts = pa.timestamp("us", tz="UTC")
    schema = {s: pa.schema([("k", pa.string()), (f"{s}id", pa.int64()), ("_ingest_ts", ts), ("_pepoch", pa.int64())])
              for s in "lr"}
    out_schema = pa.schema([("k", pa.string()), ("lid", pa.int64()), ("rid", pa.int64()), ("_ingest_ts", ts)])

    def table(s, rs):
        return pa.table({"k": [r["k"] for r in rs], f"{s}id": [r["id"] for r in rs],
                         "_ingest_ts": pa.array([r["t"] for r in rs], ts), "_pepoch": [r["p"] for r in rs]},
                        schema=schema[s])
    state = {"l": table("l", []), "r": table("r", [])}
    pairs, bad, lone = set(), set(), set()
    ttl = ttl_s * 1_000_000 if ttl_s else None
    for m in range(n + 1):
        rounds = sorted({r["r"] for r in rows if r["p"] == m}) or [0]
        for rnd in rounds:
            new = {s: table(s, [r for r in rows if r["side"] == s and r["p"] == m and r["r"] == rnd]) for s in "lr"}
            cutoff = pa.scalar((m + 1) * E_US - ttl, ts) if ttl is not None else None
            res = join_step(state["l"], state["r"], new["l"], new["r"], key="k", cutoff=cutoff, how=JoinType(how),
                            unique=Uniqueness(unique if unique else "none"), output_schema=out_schema, ttl_us=ttl,
                            epoch_us=E_US)
            state = {"l": res.left, "r": res.right}
            for lid, rid in zip(res.output["lid"].to_pylist(), res.output["rid"].to_pylist()):
                if lid is not None and rid is not None:
                    pairs.add((lid, rid))
                else:
                    lone.add(lid if lid is not None else rid)
            bad |= set(res.violations_left["lid"].to_pylist()) | set(res.violations_right["rid"].to_pylist())
    st = {(i, bool(mt)) for s in "lr" for i, mt in zip(state[s][f"{s}id"].to_pylist(), state[s]["_matched"].to_pylist())}
    return pairs, bad, lone, st


def _fold_run(rows: list[dict], *, unique: str, how: str, ttl_s: int | None, n: int,
              opaque: tuple[bool, bool] = (False, False)):
    """The batch plan's fold (:func:`pipeline.batch.evaluation.join_repeats._unique_fold`) per key over the same rows; ``__o`` as the plan
    ranks it: among a round's rows of a key and side with equal ``_ingest_ts``, by the other columns (here the id)."""
    import pandas as pd

    from pipeline.batch.evaluation.join_repeats import _unique_fold
    ttl = ttl_s * 1_000_000 if ttl_s else None
    fold = _unique_fold(E_US, ttl, (how in ("left", "full"), how in ("right", "full")),
                        (unique in ("left", "both"), unique in ("right", "both")),
                        (n + 1) * E_US - ttl if ttl is not None else None, opaque)
    pairs, bad, lone, st, ties = set(), set(), set(), set(), 0
    for _k, g in pd.DataFrame(rows).groupby("k"):
        o = g.groupby(["side", "p", "r", "t"])["id"].rank(method="dense").astype("int64")
        pdf = pd.DataFrame({"__side": (g["side"] == "r").astype("int64"), "__id": g["id"], "__t": g["t"],
                            "__o": o if not any(opaque) else 1, "_pepoch": g["p"], "__rr": g["r"]})
        pdf = pdf.sample(frac=1.0, random_state=len(pdf))    # Spark hands a group's rows over in any order
        for kind, lid, rid, _m, _r, matched in fold(pdf).itertuples(index=False):
            one = lid if not pd.isna(lid) else rid
            if kind == "pair":
                pairs.add((int(lid), int(rid)))
            elif kind == "bad":
                bad.add(int(one))
            elif kind == "lone":
                lone.add(int(one))
            elif kind == "state":
                st.add((int(one), bool(matched)))
            else:
                ties += 1
    return pairs, bad, lone, st, ties


@pytest.mark.parametrize("unique", ["left", "right", "both"])
@pytest.mark.parametrize("how", ["inner", "left", "full"])
def test_the_plans_fold_equals_the_kernel_for_repeated_unique_keys(unique, how):
    """Random rows of 3 keys on both sides (repeats on both), 0-5 epochs of 1-3 rounds, with and without TTL, ties on
    ``_ingest_ts`` included (broken by the other columns, as the kernel does): the plan's fold gives the kernel's
    pairs, violations (dead letters), lonely outer rows and state (with ``_matched``). A side whose tied rows differ
    only in columns the kernel does not compare (nested) is reported undecided instead."""
    import random
    rng = random.Random(f"{unique}-{how}")
    tied = 0
    for case in range(48):
        n = rng.randint(0, 5)
        ttl_s = rng.choice([None, 45, 90, 150])
        rows = []
        for i in range(rng.randint(1, 14)):
            p = rng.randint(0, n)
            rows.append({"id": i, "side": rng.choice("lr"), "k": rng.choice(["a", "b", "c"]), "p": p,
                         "r": rng.randint(0, 2), "t": p * E_US + rng.choice([0, 12, 30, 48, 59]) * 1_000_000})
        want = _kernel_run(rows, unique=unique, how=how, ttl_s=ttl_s, n=n)
        *got, ties = _fold_run(rows, unique=unique, how=how, ttl_s=ttl_s, n=n)
        assert not ties and tuple(got) == want, (case, ttl_s, n, rows)
        sides = {"left": "l", "right": "r", "both": "lr"}[unique]
        tied += any(a["id"] < b["id"] and a["side"] == b["side"] and a["side"] in sides
                    and (a["k"], a["p"], a["r"], a["t"]) == (b["k"], b["p"], b["r"], b["t"]) for a in rows for b in rows)
    assert tied >= 2          # the tie-break by the other columns was exercised


def test_tied_rows_that_differ_only_in_nested_columns_are_undecided():
    """Two rows of one key, side and round with the same ``_ingest_ts`` and the same comparable columns: when the side
    has nested columns (``opaque``) the kernel keeps the first to arrive - the fold reports a tie; otherwise the rows
    are interchangeable and it decides."""
    rows = [{"id": 0, "side": "l", "k": "a", "p": 0, "r": 0, "t": 5_000_000},
            {"id": 1, "side": "l", "k": "a", "p": 0, "r": 0, "t": 5_000_000}]
    *_, ties = _fold_run(rows, unique="left", how="inner", ttl_s=None, n=0, opaque=(True, False))
    assert ties == 1
    pairs, bad, lone, st, ties = _fold_run(rows, unique="left", how="inner", ttl_s=None, n=0, opaque=(False, False))
    assert ties == 0 and bad == {1} and st == {(0, False)}
