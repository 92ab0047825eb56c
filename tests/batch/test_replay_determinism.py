"""Determinism under replay (pipeline/quality/replay.py): for a job with a ``process`` operator, checkpoint n-1
is restored in a scratch location, epoch n re-run with checkpoint n's barriers, and the state and staged output
compared with checkpoint n's. Jobs of our own (tests/batch/replay_jobs.py), real local Spark, file://.

Default profile (~30 s once Spark runs, ~65 s with its start): the replay itself on a deterministic job
(identical, nothing of the job touched, scratch removed), a module-level counter in the output (caught, naming
the object and the checkpoint, with example rows), the job's first checkpoint (not checked, said so).
``EPOCHAL_REPLAY_FULL=1`` adds an unseeded random draw in the state and ``validate`` end to end (the replay
suite, the rewritten NOT CHECKED messages, ``replay=False``)."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(_HERE))

import replay_jobs as rj  # noqa: E402
from data import generate  # noqa: E402

pytestmark = [pytest.mark.spark]
CLOCK = "2027-01-01T00:00:00Z"
FULL = os.environ.get("EPOCHAL_REPLAY_FULL", "") not in ("", "0")


def _runner(root: Path, job):
    from pipeline.config import load_config
    from pipeline.runtime.driver.runner import JobRunner
    cfg = load_config(env={}, source_uri=(root / "src").as_uri(), checkpoint_uri=(root / "ckpt").as_uri(),
                      sink_uri=(root / "sink").as_uri(), clock_now=CLOCK, epoch_seconds=60, parallelism=2)
    return JobRunner(job, cfg, echo=lambda m: None)


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


def _scratch_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("epochal-replay-bt_replay*")}


def test_deterministic_process_job_replays_identically_and_touches_nothing(tmp_path):
    from pipeline.quality.replay import replay_checkpoint
    generate(tmp_path / "src", seed=3, epochs=3)
    r = _runner(tmp_path, rj.process_job())
    r.run(epochs=2)
    cp = r.coordinator.store.latest()
    assert cp.metadata.parent_id is not None
    before = {d: _tree(tmp_path / d) for d in ("ckpt", "sink")}
    scratch_before = _scratch_dirs()
    res = replay_checkpoint(r, cp)
    assert res.not_checked == {}, res.messages()
    objs = {o.obj: o for o in res.objects}
    assert set(objs) == {"state/totals/proc", "state/per-k/agg", "sink/running", "sink/per_k"}
    assert all(o.equal for o in objs.values()), res.messages()
    assert objs["sink/running"].rows_checkpoint > 0 and objs["state/totals/proc"].rows_checkpoint > 0
    assert res.success and "4 objects identical" in res.messages()[0]
    # the job's checkpoints, shared state, barrier log and sinks are only read; the scratch roots are gone
    assert {d: _tree(tmp_path / d) for d in ("ckpt", "sink")} == before
    assert _scratch_dirs() == scratch_before


def test_module_level_counter_in_the_output_is_caught(tmp_path):
    from pipeline.quality.replay import replay_checkpoint
    generate(tmp_path / "src", seed=4, epochs=3)
    r = _runner(tmp_path, rj.process_job(rj.counter_fn, "bt_replay_counter"))
    r.run(epochs=2)
    cp = r.coordinator.store.latest()
    res = replay_checkpoint(r, cp)
    assert not res.success
    bad = {o.obj: o for o in res.objects if not o.equal}
    assert set(bad) == {"sink/running"}          # the counter only reaches the output rows
    o = bad["sink/running"]
    assert o.only_checkpoint == o.rows_checkpoint > 0 and o.examples_checkpoint and o.examples_replayed
    assert {r_["k"] for r_ in o.examples_checkpoint} <= {r_["k"] for r_ in o.examples_checkpoint + o.examples_replayed}
    msg = "\n".join(res.messages())
    assert f"sink/running of chk-{cp.checkpoint_id} differs after replaying the epoch" in msg
    assert "'seq'" in msg   # example rows with the column that differs


@pytest.mark.skipif(not FULL, reason="full profile only: EPOCHAL_REPLAY_FULL=1")
def test_unseeded_random_state_is_caught(tmp_path):
    from pipeline.quality.replay import replay_checkpoint
    generate(tmp_path / "src", seed=5, epochs=3)
    r = _runner(tmp_path, rj.process_job(rj.random_state_fn, "bt_replay_random"))
    r.run(epochs=2)
    res = replay_checkpoint(r, r.coordinator.store.latest())
    bad = {o.obj for o in res.objects if not o.equal}
    assert "state/totals/proc" in bad, res.messages()
    assert "sink/running" not in bad   # the output does not depend on the random draw
    assert any("state/totals/proc of chk-" in m for m in res.messages())


def test_checkpoint_without_a_replayable_parent_is_reported_not_checked(tmp_path):
    from pipeline.quality.replay import replay_checkpoint
    generate(tmp_path / "src", seed=6, epochs=2)
    r = _runner(tmp_path, rj.process_job(name="bt_replay_first"))
    r.run(epochs=1)
    res = replay_checkpoint(r, r.coordinator.store.latest())   # the job's first epoch: no parent
    assert not res.ran and res.success
    assert any("NOT CHECKED by replay" in m and "has no parent" in m for m in res.messages())


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="full profile only: EPOCHAL_REPLAY_FULL=1")
def test_validate_runs_the_replay_for_process_jobs(tmp_path):
    from pipeline.quality import validate_job
    from pipeline.quality.validate import REPLAY_SUITE
    generate(tmp_path / "src", seed=4, epochs=3)
    r = _runner(tmp_path, rj.process_job(rj.counter_fn, "bt_replay_validate"))
    r.run(epochs=2)
    v = validate_job(r, None, docs_dir=str(tmp_path / "docs"))
    assert not v.success
    suite = next(s for s in v.suites if s.suite == REPLAY_SUITE)
    # a GX suite like the others: its result is stored next to the checkpoint and shown in Data Docs
    assert suite.result_uri and r.ckpt_fio.exists(suite.result_uri)
    assert REPLAY_SUITE in (tmp_path / "docs" / "index.html").read_text()
    assert not suite.success and suite.failed and suite.dataset == "replay"
    assert {r["object"] for e in suite.failed for r in e.unexpected_rows} == {"sink/running"}
    assert all(ex["object"] == "sink/running" and ex["side"] in ("checkpoint", "replay")
               for e in suite.failed for ex in e.examples) and suite.failed[0].examples
    assert not any(m.startswith("NOT CHECKED") and "sink/running" in m for m in v.messages)
    assert any("checked by replay" in m and "sink/running: DIFFERENT" in m for m in v.messages)
    assert v.figures["not_checked"] == {} and "sink/running" in v.figures["replay"]["objects"]
    assert "epochal_replay_determinism" in v.summary()
    # --no-replay: the process objects are reported as not checked, never silently
    v2 = validate_job(r, None, build_docs=False, store_results=False, replay=False)
    assert not any(s.suite == REPLAY_SUITE for s in v2.suites)
    assert any("NOT CHECKED" in m and "sink/running" in m for m in v2.messages)
    assert any("replay disabled" in m for m in v2.messages)


@pytest.mark.s3
@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="full profile only: EPOCHAL_REPLAY_FULL=1")
def test_replay_on_moto_s3(moto_server, s3_root):
    import json
    import subprocess
    env = {**os.environ, "PYTHONPATH": str(_HERE.parents[1]), "GX_ANALYTICS_ENABLED": "False"}
    p = subprocess.run([sys.executable, str(_HERE / "s3_replay_scenario.py"), s3_root], env=env,
                       capture_output=True, text=True, timeout=900)
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert p.returncode == 0 and line, f"{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    out = json.loads(line[len("RESULT "):])
    det, bad = out["bt_replay_s3_det"], out["bt_replay_s3_counter"]
    assert det["scratch"].startswith(s3_root + "/ckpt/_replay/bt_replay_s3_det-c"), det
    assert det["not_checked"] == {} and det["differs"] == [] and det["objects"] == 4, det
    assert bad["differs"] == ["sink/running"], bad
    assert det["unchanged"] and bad["unchanged"] and det["leftover"] == bad["leftover"] == 0, out
