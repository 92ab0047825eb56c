"""Every suite passes on good state; results are stored next to the checkpoint; restore and per-epoch hooks."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import failed_suites, make_runner

pytestmark = [pytest.mark.spark]


def test_every_suite_passes_on_good_state(deployment, docs_dir):
    from pipeline.quality import SUITES, validate_job
    from pipeline.quality.validate import REPLAY_SUITE
    runner = make_runner(deployment)
    result = validate_job(runner, None, docs_dir=docs_dir)
    assert result.success, result.summary()
    # every suite, except the replay suite of process operators (this job has none; tests/batch cover it)
    SUITES = tuple(s for s in SUITES if s.name != REPLAY_SUITE)
    assert {s.suite for s in result.suites} == {s.name for s in SUITES}
    assert not any(s.skipped for s in result.suites), result.summary()
    assert all(s.rows > 0 for s in result.suites), [(s.suite, s.rows) for s in result.suites]
    assert result.evaluated == sum(len(s.expectations) for s in SUITES)
    assert result.snapshot == "chk-3" and "PASSED" in result.summary()
    # JSON results next to the checkpoint: one GX result per suite + summary.json
    vdir = deployment / "ckpt" / "orders_payments" / "validation" / "chk-3"
    stored = {p.stem for p in vdir.glob("*.json")}
    assert stored == {s.name for s in SUITES} | {"summary"}
    summary = json.loads((vdir / "summary.json").read_text())
    assert summary["success"] is True and summary["snapshot"] == "chk-3"
    gx = json.loads((vdir / "epochal_recovery_key_groups.json").read_text())
    assert gx["success"] is True and gx["suite_name"] == "epochal_recovery_key_groups"
    assert gx["meta"]["epochal"]["snapshot"] == "chk-3"
    # Data Docs site for the latest validations
    index = Path(docs_dir) / "index.html"
    assert index.exists() and "epochal-overview" in index.read_text()
    assert result.docs_uri and result.docs_uri.endswith("index.html")
    # what was validated
    assert result.figures["state_rows"] > 0 and result.figures["sink_rows"] > 0
    rec = result.figures["recomputed"]   # rows of each object in the batch evaluation of the job
    assert rec["sink/paid_orders"] == result.figures["sink_rows"] - rec["sink/merchant_revenue"]
    assert result.figures["not_checked"] == {}   # the demo is fully modelled by the generic batch evaluation


def test_older_checkpoint_and_savepoint_by_uri(deployment, docs_dir):
    from pipeline.quality import validate_job
    runner = make_runner(deployment)
    older = validate_job(runner, "2", docs_dir=docs_dir, build_docs=False)
    assert older.success, older.summary()
    assert older.snapshot == "chk-2"
    sp = runner.savepoint()
    res = validate_job(runner, sp, docs_dir=docs_dir)
    assert res.success, res.summary()
    assert res.snapshot.startswith("sp-")
    assert (deployment / "ckpt" / "orders_payments" / "validation" / res.snapshot / "summary.json").exists()


def test_restore_is_validated_automatically(deployment):
    """JobRunner.restore runs every suite on the new restore point (here with another parallelism)."""
    runner = make_runner(deployment)
    restored = runner.restore("3", parallelism=3)
    assert restored["validation"]["success"], restored["validation"]["summary"]
    cid = restored["checkpoint_id"]
    summary = json.loads((deployment / "ckpt" / "orders_payments" / "validation" / f"chk-{cid}" / "summary.json")
                         .read_text())
    assert summary["mode"] == "restore" and summary["success"] is True
    state_files = next(s for s in summary["suites"] if s["suite"] == "epochal_state_files")
    assert state_files["rows"] == 3 * 3  # left, right, agg for each of the 3 new subtasks


def test_restore_of_a_broken_checkpoint_fails(deployment, docs_dir):
    """Restoring a checkpoint whose state is wrong (though its checksums match) raises ValidationError:
    the restore task fails. ``validate_restored`` is the hook the runtime calls."""
    import corrupt

    from pipeline.exceptions import ValidationError
    from pipeline.quality import validate_restored
    corrupt.skew_total(deployment, 3)
    runner = make_runner(deployment)
    with pytest.raises(ValidationError) as e:
        runner.restore("3")
    assert "aggregate state equals the recomputed per-group totals" in str(e.value)
    restored = {"checkpoint_id": runner.coordinator.store.latest().checkpoint_id, "from": "3"}
    with pytest.raises(ValidationError):
        validate_restored(runner, restored, docs_dir=docs_dir)


def test_cheap_per_epoch_subset(deployment):
    """validate_after_epoch: only when PIPELINE_VALIDATE_AFTER_EPOCH is set; metadata suites, no Spark."""
    import corrupt

    from pipeline.exceptions import ValidationError
    from pipeline.quality import validate_after_epoch
    off = make_runner(deployment)
    cp = off.coordinator.store.latest()
    assert validate_after_epoch(off, cp.metadata) is None
    on = make_runner(deployment, validate_after_epoch=True)
    result = validate_after_epoch(on, cp.metadata)
    assert result.success and result.mode == "epoch", result.summary()
    assert {s.area for s in result.suites} == {"metadata"}
    assert on._spark is None, "the per-epoch subset must not start Spark"
    assert (deployment / "ckpt" / "orders_payments" / "validation" / "chk-3" / "epoch" / "summary.json").exists()
    corrupt.checksum_mismatch(deployment, 3)
    with pytest.raises(ValidationError):
        validate_after_epoch(on, cp)
    result = validate_after_epoch(on, cp, raise_on_failure=False)
    assert failed_suites(result) == {"epochal_checkpoint_files"}


def test_local_and_spark_engines_build_identical_datasets(deployment):
    """The same executor code summarises the data with Spark or in a driver thread pool (``engine="local"``,
    used for small snapshots when no Spark session runs): the datasets the suites see are identical."""
    import corrupt

    from pipeline.quality.collect import collect
    from pipeline.quality.validate import resolve_snapshot
    corrupt.duplicate_state_key(deployment, 3)          # include failure paths (duplicates, drill-down)
    runner = make_runner(deployment)
    snap = resolve_snapshot(runner, None)
    local = collect(runner, snap, engine="local")
    spark = collect(runner, snap, engine="spark")
    assert local.figures["engine"] == "local" and spark.figures["engine"] == "spark"
    assert set(local.datasets) == set(spark.datasets)
    for name, a in local.datasets.items():
        a = a.astype(str)
        b = spark.datasets[name].astype(str)
        a = a.sort_values(list(a.columns)).reset_index(drop=True)
        b = b.sort_values(list(b.columns)).reset_index(drop=True)
        diff = a.compare(b) if a.shape == b.shape and list(a.columns) == list(b.columns) else (a.shape, b.shape)
        assert a.equals(b), f"{name}: {diff}"
    assert local.examples["state_duplicates"] and local.examples["state_duplicates"][0]["key"] == \
        spark.examples["state_duplicates"][0]["key"]


def test_a_failed_recomputation_fails_instead_of_skipping(deployment, monkeypatch):
    """If the sources cannot be recomputed, recovery correctness is unproven: the validation fails."""
    from pipeline.quality import recovery, validate_job

    def unreachable(self, specs, max_parallelism):
        raise OSError("source bucket unreachable")

    monkeypatch.setattr(recovery.BatchPlan, "materialize", unreachable)
    result = validate_job(make_runner(deployment), None, build_docs=False)
    assert not result.success
    errors = {s.suite for s in result.suites if s.error}
    assert errors == {"epochal_recovery_key_groups", "epochal_recovery_totals", "epochal_recovery_conservation"}
    assert "source bucket unreachable" in result.summary()
    assert {s.suite for s in result.suites if not s.success} == errors


def test_a_corrupted_checkpoint_fails_every_level_that_checks_it(deployment):
    """A state file rewritten with other bytes (checksum and size mismatch) fails in every mode that claims to check
    the checkpoint's files: ``validate`` (full) and the per-epoch subset fail ``epochal_checkpoint_files``; a
    ``restore`` refuses the checkpoint before anything is restored, naming the file, at every validation level
    (``none`` included: the restore itself checks the files it restores)."""
    import corrupt

    from pipeline.exceptions import CorruptCheckpointError
    from pipeline.quality import validate_after_epoch, validate_job
    uri = corrupt.checksum_mismatch(deployment, 3)
    runner = make_runner(deployment, validate_after_epoch=True)
    full = validate_job(runner, 3, store_results=False, build_docs=False, replay=False)
    assert not full.success and "epochal_checkpoint_files" in failed_suites(full), full.summary()
    epoch = validate_after_epoch(runner, runner.coordinator.store.get(3), raise_on_failure=False)
    assert epoch is not None and "epochal_checkpoint_files" in failed_suites(epoch), epoch.summary()
    for level in ("none", "cheap", "full"):
        with pytest.raises(CorruptCheckpointError) as e:
            make_runner(deployment).restore("3", validate=level)
        assert uri in str(e.value) and "checkpoint 3" in str(e.value), (level, e.value)
