"""``epochal bootstrap``: a job's state and output at barrier n from one batch job, written as a savepoint; restore
from it and run the remaining epochs; the result equals (a) the batch plan at the final barrier and (b) a run
that processed every epoch from the start. Jobs of our own (never the demo), real local Spark, file://."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))

from batch_jobs import join_agg  # noqa: E402
from boot_jobs import (  # noqa: E402
    append_agg_job,
    dedup_join,
    process_job,
    sensor_windows,
    unique_join,
    window_of_updates,
    write_limits,
)
from data import E_US, T0, generate  # noqa: E402

from pipeline.exceptions import BootstrapRefusedError, ConfigError  # noqa: E402

pytestmark = [pytest.mark.spark]
CLOCK = "2027-01-01T00:00:00Z"
FIRST = T0 // E_US          # the first epoch of the generated data
#: the full profile (EPOCHAL_BOOTSTRAP_FULL=1, ~4 min): both jobs, 6 epochs, the recovery suites on the result;
#: the default CI profile: the many-to-many join job over 4 epochs, compared with the full run and the batch plan
FULL = os.environ.get("EPOCHAL_BOOTSTRAP_FULL", "") not in ("", "0")


def _runner(root: Path, src: Path, job, **kw):
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    kw.setdefault("clock_now", CLOCK)
    cfg = load_config(env={}, source_uri=src.as_uri(), checkpoint_uri=(root / "ckpt").as_uri(),
                      sink_uri=(root / "sink").as_uri(), epoch_seconds=60, **kw)
    return JobRunner(job, cfg, echo=lambda m: None)


def _sorted(t: pa.Table) -> pa.Table:
    cols = sorted(c for c in t.column_names)
    t = t.select(cols)
    return t.sort_by([(c, "ascending") for c in cols if not pa.types.is_boolean(t.schema.field(c).type)])


def _sinks(r) -> dict[str, pa.Table]:
    return {t: _sorted(r.table(t).read()) for t in r.job.sink_tables()}


def _state(r, location: str | None = None) -> dict[str, pa.Table]:
    """Every state table of the latest checkpoint (or the one at ``location``; all subtasks, ``_kg`` and
    ``_matched`` included)."""
    md = (r.snapshot(location) if location else r.snapshot()).metadata
    out: dict[str, list] = {}
    for uid, hs in md.operators.items():
        for h in hs:
            out.setdefault(f"{uid}/{h.name}", [])
            if h.file is not None:
                out[f"{uid}/{h.name}"].append(pq.read_table(h.file.uri.replace("file://", "")))
    return {k: _sorted(pa.concat_tables(v)) if v else None for k, v in out.items()}  # type: ignore[misc]


def _bootstrap_then_run(root: Path, src: Path, job, epoch: int, parallelism: int = 2):
    from pipeline.batch.bootstrap.savepoint import bootstrap
    r = _runner(root, src, job, parallelism=parallelism)
    d = bootstrap(r, epoch=epoch)
    assert d["epoch"] == epoch and d["savepoint"].startswith((root / "ckpt").as_uri())
    sp = r.snapshot(d["savepoint"]).metadata
    assert sp.kind == "savepoint" and sp.epoch == epoch and sp.parent_id is None
    assert {u for u in sp.operators} == set(job.operator_uids())
    assert sp.extra["source_files"]                     # the source inventory of the read files
    # the sink tables hold the batch output at barrier n already (committed, before any restore)
    committed = {t: r.table(t).read().num_rows for t in job.sink_tables()}
    assert committed == {t: d["objects"][f"sink/{t}"] for t in job.sink_tables()}
    r2 = _runner(root, src, job, parallelism=3)          # restore with another parallelism
    res = r2.restore(d["savepoint"], parallelism=3, validate=FULL)   # the post-restore suites: full profile
    assert res["epoch"] == epoch
    rep = r2.run()
    assert len(rep.to_dict()["checkpoints_completed"]) >= 2
    return r2, d


def _check_against_batch(r, tmp: Path, suites: bool) -> None:
    """(a) the final checkpoint's sinks equal the batch plan at its barrier, and the recovery suites pass."""
    from pipeline.batch import write_batch
    from pipeline.quality import validate_job
    out = write_batch(r, None, str(tmp / "batch"))
    assert out["unchecked"] == {k: v for k, v in out["unchecked"].items() if k.startswith("state/")}
    for t in r.job.sink_tables():
        want = _sorted(pq.read_table(tmp / "batch" / "sink" / t))
        got = r.table(t).read()
        assert _sorted(got.select(want.column_names).cast(want.schema)).equals(want), t
    if not suites:
        return
    v = validate_job(r, None, build_docs=False, store_results=False)
    failed = [s.suite for s in v.suites if not s.success and s.skipped is None]
    assert failed == [], v.summary()


_FULL_ONLY = pytest.mark.skipif(not FULL, reason="full profile only: EPOCHAL_BOOTSTRAP_FULL=1")
_CASES = [pytest.param(join_agg, 5, True, id="m2m-join-agg"),
          pytest.param(dedup_join, 7, True, id="dedup-join", marks=_FULL_ONLY),
          # keys unique on both sides (no violation: the runtime dead-letters those), the one-merge-join plan
          pytest.param(unique_join, 3, False, id="unique-join", marks=_FULL_ONLY)]


@pytest.mark.parametrize("make,seed,repeated", _CASES)
def test_bootstrap_restore_run_equals_full_run_and_batch(tmp_path, make, seed, repeated):
    src = tmp_path / "src"
    generate(src, seed=seed, epochs=6 if FULL else 4, n_left=160 if FULL else 80, repeated=repeated)
    job = make()
    full = _runner(tmp_path / "full", src, job, parallelism=2)
    full.run()
    boot, _ = _bootstrap_then_run(tmp_path / "boot", src, make(), FIRST + (2 if FULL else 1))
    assert boot.snapshot().metadata.epoch == full.snapshot().metadata.epoch
    # (b) the same sinks and the same state (every column, _kg and _matched included) as the full run
    assert _sinks(boot) == _sinks(full)
    assert all(t.num_rows for t in _sinks(full).values())
    s_full, s_boot = _state(full), _state(boot)
    assert sum(t.num_rows for t in s_full.values() if t is not None) > 0
    assert s_boot.keys() == s_full.keys()
    for k in s_full:
        assert (s_boot[k] is None) == (s_full[k] is None), k
        if s_full[k] is not None:
            assert s_boot[k].equals(s_full[k].select(s_boot[k].column_names).cast(s_boot[k].schema)), k
    _check_against_batch(boot, tmp_path, suites=FULL)


def _same_state(want: dict, got: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert (got[name] is None) == (want[name] is None), name
        if want[name] is not None:
            assert got[name].equals(want[name].select(got[name].column_names).cast(got[name].schema)), name


def _dead_letters(r, after_epoch: int) -> dict[str, pa.Table]:
    """The operators' dead letters as the user reads them (every Parquet file under
    ``<dead-letter root>/<job>/operator=<uid>/epoch-<m>/``), of the epochs after ``after_epoch``."""
    root = Path(r.config.dead_letter_root.replace("file://", "")) / r.job.name
    out: dict[str, list] = {}
    for f in sorted(root.glob("operator=*/epoch-*/chk-*/*.parquet")):
        if int(f.parent.parent.name.split("-")[1]) > after_epoch:
            out.setdefault(f.parent.parent.parent.name, []).append(pq.read_table(f))
    return {k: _sorted(pa.concat_tables(v)) for k, v in out.items()}


#: the window test's default profile: heap, 4 epochs (34 s on the quiet machine, ~170 s at load 15-19 - 13 objects
#: bootstrapped, a reference run and the post-restore check); EPOCHAL_BOOTSTRAP_WINDOWS=0 skips it;
#: EPOCHAL_BOOTSTRAP_FULL=1: 7 epochs, the rocksdb backend too, and the recovery suites at checkpoint N
WINDOWS = FULL or os.environ.get("EPOCHAL_BOOTSTRAP_WINDOWS", "1") != "0"
_WIN_EPOCHS = 7 if FULL else 4
_BACKENDS = [pytest.param("heap", id="heap"),
             pytest.param("rocksdb", id="rocksdb", marks=_FULL_ONLY)]


@pytest.mark.slow
@pytest.mark.skipif(not WINDOWS, reason="EPOCHAL_BOOTSTRAP_WINDOWS=0 skips it")
@pytest.mark.parametrize("backend", _BACKENDS)
def test_bootstrap_windows_then_restore_run_equals_epoch_by_epoch(tmp_path, backend):
    """Dedup -> sliding final window, tumbling update window over the raw readings, late and out-of-order data,
    partition 1 idle in the bootstrap epoch (its rows arrive with the next file). (a) the reference runs the epochs
    as they arrive; (b) a fresh job bootstraps barrier k (parallelism 2): same committed sinks and state as the
    reference at k; restored at parallelism 3 (the post-restore check validates the savepoint against the batch
    plan), it runs the rest as they arrive: same committed sinks, same dead letters of the epochs after k, same
    state at checkpoint N (records of unfired windows, watermark tables, held keys, join sides). Full profile
    (EPOCHAL_BOOTSTRAP_FULL=1): 7 epochs, rocksdb too, and ``validate`` of checkpoint N."""
    import time

    from state_jobs import IDLE, write_epoch
    from state_jobs import T0 as S_T0

    from pipeline.batch.bootstrap.savepoint import bootstrap
    t0 = time.perf_counter()

    def lap(what: str) -> None:
        print(f"[bootwin] {what}: {time.perf_counter() - t0:.1f} s", flush=True)
    src = tmp_path / "src"
    first = S_T0 // E_US
    k = first + IDLE
    ref = _runner(tmp_path / "ref", src, sensor_windows(), parallelism=2, state_backend=backend)
    boot = _runner(tmp_path / "boot", src, sensor_windows(), parallelism=2, state_backend=backend)
    for m in range(IDLE + 1):
        write_epoch(src, m)
        write_limits(src, m)
    assert ref.run().completed
    lap("reference 0..k")
    assert ref.snapshot().metadata.epoch == k           # partition 1 idle in epoch k: its barrier is cut without it
    d = bootstrap(boot, epoch=k)
    assert {o for o in d["objects"]} >= {"state/slide/win", "state/slide/wm", "state/tumble/win", "state/tumble/wm",
                                         "state/dd/keys", "state/over/win", "state/over/wm",
                                         "state/jl/left", "sink/wins", "sink/wins_u", "sink/firsts", "sink/per_limit"}
    assert all(d["objects"][o] for o in ("state/slide/win", "state/tumble/win", "state/over/win", "sink/wins",
                                         "sink/per_limit"))
    assert _sinks(boot) == _sinks(ref)                  # committed at the bootstrap already
    lap("bootstrap")
    _same_state(_state(ref), _state(boot, d["savepoint"]))   # the state at checkpoint k, every object
    boot = _runner(tmp_path / "boot", src, sensor_windows(), parallelism=3, state_backend=backend)
    res = boot.restore(d["savepoint"], parallelism=3)     # the post-restore check: the savepoint vs the batch plan
    assert res["epoch"] == k and res["validation"]["success"], res["validation"]["summary"]
    lap("restore")
    for m in range(IDLE + 1, _WIN_EPOCHS):
        write_epoch(src, m)
        write_limits(src, m)
        assert ref.run().completed
        assert boot.run().completed
    lap("epochs after k, both")
    assert boot.snapshot().metadata.epoch == ref.snapshot().metadata.epoch == first + _WIN_EPOCHS - 1
    assert _sinks(boot) == _sinks(ref)
    dl_ref, dl_boot = _dead_letters(ref, k), _dead_letters(boot, k)
    assert sum(t.num_rows for t in dl_ref.values()) > 0, "the data should have late records after k"
    assert dl_boot == dl_ref
    s_ref = _state(ref)
    _same_state(s_ref, _state(boot))
    assert s_ref["slide/win"].num_rows and s_ref["tumble/wm"].num_rows
    lap("compared")
    if FULL:   # the recovery suites at checkpoint N of the bootstrapped path (the restore checked checkpoint k)
        _check_against_batch(boot, tmp_path, suites=True)
        lap("batch plan + validate")


def _dl_tree(r, upto: int | None = None) -> tuple[dict[str, bytes], dict[tuple, list[str]]]:
    """The job's dead letters as a user finds them: every source dead-letter file (path -> bytes) and, per
    ``(operator, epoch)``, the operator's dead-letter records (JSON lines without their ``checkpoint`` field, which
    names the writing checkpoint; Parquet rows as JSON, plus the Parquet schema under ``("schema", operator,
    epoch)``); operator epochs after ``upto`` left out."""
    import json
    base = Path(r.config.dead_letter_root.replace("file://", "")) / r.job.name
    src: dict[str, bytes] = {}
    ops: dict[tuple, list[str]] = {}
    for f in sorted(p for p in base.rglob("*") if p.is_file()):
        rel = f.relative_to(base)
        if not rel.parts[0].startswith("operator="):
            src[str(rel)] = f.read_bytes()
            continue
        ep = int(rel.parts[1].split("-")[1])
        if upto is not None and ep > upto:
            continue
        if f.suffix == ".jsonl":
            recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
            ops.setdefault((rel.parts[0], ep), []).extend(
                json.dumps({k: v for k, v in x.items() if k != "checkpoint"}, sort_keys=True) for x in recs)
        else:
            t = pq.read_table(f)
            ops.setdefault((rel.parts[0], ep), []).extend(json.dumps(x, sort_keys=True, default=str)
                                                          for x in t.to_pylist())
            ops.setdefault(("schema", rel.parts[0], ep), []).append(str(t.schema))
    return src, {k: sorted(v) if k[0] != "schema" else sorted(set(v)) for k, v in ops.items()}


def test_bootstrap_dead_letters_equal_epoch_by_epoch(tmp_path, monkeypatch):
    """Bad records in several epochs (null/empty keys, a value that cannot be cast, a null ``_ingest_ts``, a file of
    random bytes, files the barriers cut, a tag repeated against ``unique="right"``, late records and records
    without a window key): a bootstrap at barrier k - after a bootstrap killed before its ``_metadata`` - leaves
    the dead letters of the epochs <= k an epoch-by-epoch run leaves (source files name for name and byte for byte;
    operator records per operator and epoch, no duplicate), counts them in the savepoint's stats, and after the
    restore at another parallelism and the remaining epochs the whole dead-letter location equals the run's.
    Default profile: no killed attempt first (~25 s quiet, ~70 s at load 13); EPOCHAL_BOOTSTRAP_FULL=1 adds it."""
    import json

    from dl_jobs import E_US as DL_E
    from dl_jobs import T0 as DL_T0
    from dl_jobs import dead_letter_job, write_epoch

    from pipeline.batch.bootstrap import savepoint as bmod
    src = tmp_path / "src"
    for m in range(4):
        write_epoch(src, m)
    k = DL_T0 // DL_E + 2
    ref = _runner(tmp_path / "ref", src, dead_letter_job(), parallelism=2)
    ref.run()
    # a bootstrap killed between its dead letters and its _metadata (no abort: a SIGKILL runs none)
    if FULL:
        boot = _runner(tmp_path / "boot", src, dead_letter_job(), parallelism=2)

        def killed(*a, **kw):
            raise RuntimeError("killed before _metadata")
        monkeypatch.setattr(bmod, "abort_pending", lambda coordinator, cause: None)
        monkeypatch.setattr(boot.coordinator, "complete", killed)
        with pytest.raises(RuntimeError, match="killed"):
            bmod.bootstrap(boot, epoch=k)
        monkeypatch.undo()
        assert _dl_tree(boot)[1], "the killed attempt should have left operator dead letters"
    boot = _runner(tmp_path / "boot", src, dead_letter_job(), parallelism=2)
    d = bmod.bootstrap(boot, epoch=k)
    ref_src, ref_ops = _dl_tree(ref, upto=k)
    got_src, got_ops = _dl_tree(boot)
    assert got_ops == ref_ops                            # every operator record of the epochs <= k, once
    assert {kk[0] for kk in ref_ops if kk[0] != "schema"} == {"operator=jt", "operator=wl"}
    assert len({kk[1] for kk in ref_ops if kk[0] == "operator=wl"}) == 3
    assert got_src and all(ref_src.get(f) == b for f, b in got_src.items())   # the run's files, byte for byte
    assert {f.split("/")[1] for f in got_src} == {"partition=0", "partition=1", "partition=2"}
    # counted in the savepoint's stats, as the checkpoints of those epochs count them
    want = {f"{o}": sum(len(v) for kk, v in got_ops.items() if kk[0] == o) for o in ("operator=jt", "operator=wl")}
    want["reads"] = sum(len(b.splitlines()) for b in got_src.values())
    st = boot.snapshot(d["savepoint"]).metadata.stats.dead_letters
    assert {k2: v for k2, v in st.items() if v} == want == d["dead_letters"]
    r2 = _runner(tmp_path / "boot", src, dead_letter_job(), parallelism=3)
    r2.restore(d["savepoint"], parallelism=3, validate=False)
    r2.run()
    assert r2.snapshot().metadata.epoch == ref.snapshot().metadata.epoch
    assert _sinks(r2) == _sinks(ref)
    assert _dl_tree(r2) == _dl_tree(ref)                 # the whole location, every epoch
    assert json.dumps(sorted(_dl_tree(ref)[0])) != "[]"


def test_bootstrap_fail_policy_fails_before_any_side_effect(tmp_path):
    """``PIPELINE_BAD_RECORDS=fail``: the first bad record of the epochs <= k fails the bootstrap, naming the file and
    partition, before anything is written (as it would fail that epoch)."""
    from dl_jobs import E_US as DL_E
    from dl_jobs import T0 as DL_T0
    from dl_jobs import dead_letter_job, write_epoch

    from pipeline.batch.bootstrap.savepoint import bootstrap
    from pipeline.exceptions import MalformedInputError
    src = tmp_path / "src"
    for m in range(2):      # (epoch 2 has a file of random bytes, which the listing already refuses under fail)
        write_epoch(src, m)
    r = _runner(tmp_path, src, dead_letter_job(), parallelism=2, bad_records="fail")
    with pytest.raises(MalformedInputError, match=r"malformed input in file://.*/reads/partition=[01]/00000001") as e:
        bootstrap(r, epoch=DL_T0 // DL_E + 1)
    assert "source reads, partition" in str(e.value) and "\n" not in str(e.value)
    _nothing_written(tmp_path)
    assert not (tmp_path / "ckpt" / "_dead_letter").exists()


@pytest.mark.slow
@_FULL_ONLY
def test_bootstrap_operators_over_a_final_window_then_restore_run_equals_epoch_by_epoch(tmp_path):
    """A window over an ``emit="final"`` window's rows and a join of those rows with a source (``dl_jobs.
    window_chain_job``; data with late records, null groups, a file of random bytes): the fired windows' rows carry
    their firing epoch and ``_ingest_ts`` (the end of that epoch minus 1 µs) in the batch plan. Bootstrap at k equals
    the epoch-by-epoch run's checkpoint k (sinks, every state file); restored at parallelism 3 (the post-restore check
    passes) and run on, it equals the run at the end (~130 s at load 14-18: full profile)."""
    from dl_jobs import E_US as DL_E
    from dl_jobs import T0 as DL_T0
    from dl_jobs import window_chain_job, write_epoch

    from pipeline.batch.bootstrap.savepoint import bootstrap
    src = tmp_path / "src"
    for m in range(4):
        write_epoch(src, m)
    k = DL_T0 // DL_E + 2
    ref = _runner(tmp_path / "ref", src, window_chain_job(), parallelism=2)
    ref.run(epochs=3)
    assert ref.snapshot().metadata.epoch == k
    boot = _runner(tmp_path / "boot", src, window_chain_job(), parallelism=2)
    d = bootstrap(boot, epoch=k)
    assert all(d["objects"][o] for o in ("state/w2/win", "state/wj/left", "sink/w2_out", "sink/joined"))
    assert _sinks(boot) == _sinks(ref)
    _same_state(_state(ref), _state(boot, d["savepoint"]))
    r2 = _runner(tmp_path / "boot", src, window_chain_job(), parallelism=3)
    res = r2.restore(d["savepoint"], parallelism=3)
    assert res["validation"]["success"], res["validation"]["summary"]
    ref.run()
    r2.run()
    assert r2.snapshot().metadata.epoch == ref.snapshot().metadata.epoch
    assert _sinks(r2) == _sinks(ref)
    _same_state(_state(ref), _state(r2))


def _nothing_written(root: Path) -> None:
    ck = root / "ckpt"
    assert not any((ck).glob("*/savepoints/*")) and not any(ck.glob("*/barriers/*"))
    assert not (root / "sink").exists() or not any((root / "sink").rglob("*.parquet"))


@pytest.mark.parametrize("make,names", [(window_of_updates, "win-of-win"), (process_job, "user-fn"),
                                        (append_agg_job, "changes")], ids=["window", "process", "changelog"])
def test_bootstrap_refuses_what_it_cannot_derive_exactly(tmp_path, make, names):
    from pipeline.batch.bootstrap.savepoint import bootstrap
    src = tmp_path / "src"
    generate(src, seed=1, epochs=3, n_left=40)
    r = _runner(tmp_path, src, make())
    with pytest.raises(BootstrapRefusedError) as e:
        bootstrap(r, epoch=FIRST + 1)
    assert names in str(e.value) and "\n" not in str(e.value)
    _nothing_written(tmp_path)


def test_bootstrap_validates_before_any_side_effect(tmp_path):
    from pipeline.batch.bootstrap.savepoint import bootstrap
    src = tmp_path / "src"
    generate(src, seed=1, epochs=3, n_left=40)
    r = _runner(tmp_path, src, join_agg())
    with pytest.raises(ConfigError, match="outside the allowed savepoint prefixes"):
        bootstrap(r, epoch=FIRST + 1, target=(tmp_path / "elsewhere").as_uri())
    with pytest.raises(ConfigError, match="max parallelism"):
        bootstrap(r, epoch=FIRST + 1, parallelism=99)
    with pytest.raises(Exception, match="lags"):
        bootstrap(_runner(tmp_path, src, join_agg(), clock_now="2026-01-01T00:00:00Z"), epoch=FIRST + 10)
    with pytest.raises(ConfigError, match=f"before the first epoch with data \\({FIRST}\\)"):
        bootstrap(r, epoch=FIRST - 3)
    _nothing_written(tmp_path)
    # a target that already holds a completed savepoint: refused naming it, before the barrier log is written
    taken = tmp_path / "ckpt" / r.job.name / "savepoints" / "mine"
    taken.mkdir(parents=True)
    (taken / "_metadata").write_text("{}")
    with pytest.raises(ConfigError, match=f"savepoint target {taken.as_uri()} already holds"):
        bootstrap(r, epoch=FIRST + 1, target=taken.as_uri())
    assert not any((tmp_path / "ckpt").glob("*/barriers/*"))
    # a job that already ran is not bootstrapped (its sinks and checkpoints would be shadowed)
    r.run(epochs=1)
    with pytest.raises(BootstrapRefusedError, match="already has completed checkpoints"):
        bootstrap(r, epoch=FIRST + 2)


def _cli(tmp_path: Path, *args: str):
    import subprocess
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_HERE), str(_HERE.parents[1])]),
           "PIPELINE_SOURCE_URI": (tmp_path / "src").as_uri(), "PIPELINE_CHECKPOINT_URI": (tmp_path / "ckpt").as_uri(),
           "PIPELINE_SINK_URI": (tmp_path / "sink").as_uri(), "PIPELINE_CLOCK_NOW": CLOCK,
           "PIPELINE_EPOCH_SECONDS": "60"}
    return subprocess.run([sys.executable, "-m", "pipeline", "bootstrap", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def test_cli_bootstrap_refusal_and_bad_target_exit_2_with_one_line(tmp_path):
    generate(tmp_path / "src", seed=1, epochs=2, n_left=20)
    p = _cli(tmp_path, "--job", "boot_jobs:process_job")
    assert p.returncode == 2, p.stderr
    msg = [ln for ln in p.stderr.splitlines() if ln.startswith("epochal:")]
    assert len(msg) == 1 and "process 'user-fn'" in msg[0], p.stderr
    p = _cli(tmp_path, "--job", "batch_jobs:join_agg", "--target", (tmp_path / "elsewhere").as_uri())
    assert p.returncode == 2 and "outside the allowed savepoint prefixes" in p.stderr, p.stderr
    _nothing_written(tmp_path)


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="full profile only (~95 s): EPOCHAL_BOOTSTRAP_FULL=1")
def test_bootstrap_on_moto_s3(moto_server, s3_root):
    import json
    import subprocess
    env = {**os.environ, "PYTHONPATH": str(_HERE.parents[1]), "GX_ANALYTICS_ENABLED": "False"}
    p = subprocess.run([sys.executable, str(_HERE / "s3_bootstrap_scenario.py"), s3_root], env=env,
                       capture_output=True, text=True, timeout=900)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert p.returncode == 0 and line, f"{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    out = json.loads(line[len("RESULT "):])
    assert out["savepoint"].startswith(s3_root + "/boot/ckpt/bt_join_agg/savepoints/")
    assert out["epoch_boot"] == out["epoch_full"]
    assert out["same_sinks"] and out["same_state"] and all(out["rows"].values()), out
