"""A failed savepoint deletes only what it wrote (never the target's prior content); savepoint targets are
contained by configuration and refused (exit 2) before any side effect (issue 15, defects 1 and 6)."""
from __future__ import annotations

import pytest

from pipeline.checkpoint.coordinator import CheckpointCoordinator
from pipeline.checkpoint.failure import CheckpointFailureReason
from pipeline.config import load_config
from pipeline.exceptions import CheckpointDeclinedError, CheckpointError, ConfigError
from pipeline.fileio import join_uri
from pipeline.runtime.driver.savepoints import check_target
from pipeline.testing.doubles import FlakyFileIO


def _trigger(coord, location):
    return coord.trigger(epoch=1, barrier_time="2024-01-01T00:01:00Z", expected_tasks={"op": 1}, parent_id=None,
                         max_parallelism=8, parallelism=1, kind="savepoint", location=location)


@pytest.mark.unit
def test_failed_savepoint_keeps_the_targets_prior_content(any_root):
    fio, root = any_root
    target = join_uri(root, "ckpt", "job", "savepoints", "mine")
    user_files = [join_uri(target, "README.txt"), join_uri(target, "old", "data.bin")]
    for u in user_files:
        fio.write_bytes(u, b"the user's own bytes")
    coord = CheckpointCoordinator(FlakyFileIO(fio, lambda op, uri: op == "write_bytes"
                                               and uri.endswith("/_metadata")), join_uri(root, "ckpt"), "job")
    pending = _trigger(coord, target)
    fio.write_bytes(join_uri(target, "state", "op", "kg-0.parquet"), b"written by the savepoint")
    coord.acknowledge_task(pending, "op", 0)
    with pytest.raises(CheckpointError):
        coord.complete(pending)  # the _metadata PUT fails: the savepoint is aborted
    left = sorted(f.uri for f in fio.list(target))
    assert left == sorted(user_files), left
    assert all(fio.read_bytes(u) == b"the user's own bytes" for u in user_files)


@pytest.mark.unit
def test_abort_of_a_fresh_savepoint_removes_everything_it_wrote(any_root):
    fio, root = any_root
    target = join_uri(root, "ckpt", "job", "savepoints", "fresh")
    coord = CheckpointCoordinator(fio, join_uri(root, "ckpt"), "job")
    pending = _trigger(coord, target)
    fio.write_bytes(join_uri(target, "state", "x"), b"1")
    coord.abort(pending, CheckpointFailureReason.CHECKPOINT_COORDINATOR_SHUTDOWN)
    assert fio.list(target) == []


@pytest.mark.unit
def test_target_holding_a_metadata_is_refused_before_an_id_is_claimed(any_root):
    fio, root = any_root
    target = join_uri(root, "ckpt", "job", "savepoints", "taken")
    fio.write_bytes(join_uri(target, "_metadata"), b"{}")
    coord = CheckpointCoordinator(fio, join_uri(root, "ckpt"), "job")
    with pytest.raises(CheckpointDeclinedError, match="already holds"):
        _trigger(coord, target)
    assert coord.counter.latest_claimed() is None
    assert fio.read_bytes(join_uri(target, "_metadata")) == b"{}"


@pytest.mark.unit
def test_savepoint_targets_are_contained(tmp_path):
    ck = (tmp_path / "ckpt").as_uri()
    cfg = load_config(env={}, checkpoint_uri=ck)
    ok = check_target(f"{ck}/j/savepoints/before-upgrade", cfg, "j")
    assert ok == f"{ck}/j/savepoints/before-upgrade"
    for bad in (f"{ck}/j/savepoints/../../elsewhere", f"{ck}/other/savepoints/x", f"{ck}/j/savepoints",
                "s3://other-bucket/x", "file://relative/x", "hdfs://nn/x", (tmp_path / "elsewhere").as_uri()):
        with pytest.raises(ConfigError):
            check_target(bad, cfg, "j")
    allowed = (tmp_path / "backups").as_uri()
    cfg2 = load_config(env={"PIPELINE_SAVEPOINT_PREFIXES": f"{allowed}, {ck}/j/savepoints"}, checkpoint_uri=ck)
    assert check_target(f"{allowed}/sp1", cfg2, "j") == f"{allowed}/sp1"
    with pytest.raises(ConfigError):
        check_target(f"{allowed}/../sp1", cfg2, "j")
    s3 = load_config(env={}, checkpoint_uri="s3://bucket/ck")
    assert check_target("s3://bucket/ck/j/savepoints/a/", s3, "j") == "s3://bucket/ck/j/savepoints/a"
    for bad in ("s3://other-bucket/ck/j/savepoints/a", "s3://bucket/ck/j/savepoints/../../x"):
        with pytest.raises(ConfigError):
            check_target(bad, s3, "j")


@pytest.mark.unit
def test_unfinished_savepoint_dirs_are_cleaned_later(any_root):
    fio, root = any_root
    coord = CheckpointCoordinator(fio, join_uri(root, "ckpt"), "job")
    sp = join_uri(root, "ckpt", "job", "savepoints")
    killed = join_uri(sp, "sp-1-20240101T000000Z")      # killed before its _metadata
    done = join_uri(sp, "sp-2-20240101T000100Z")        # completed
    mine = join_uri(sp, "before-upgrade")               # a user-named target: never touched
    for d in (killed, done, mine):
        fio.write_bytes(join_uri(d, "_pending.json"), b"{}")
        fio.write_bytes(join_uri(d, "state", "x.parquet"), b"x")
    fio.write_bytes(join_uri(done, "_metadata"), b"{}")
    coord.counter.next(at_least=3)  # newest claim 3: ids below it are not running
    coord.cleanup_garbage()
    assert fio.list(killed) == []
    assert len(fio.list(done)) == 3 and len(fio.list(mine)) == 2


@pytest.mark.unit
def test_a_symlink_inside_the_prefix_pointing_outside_is_refused_before_anything_is_written(tmp_path):
    """Issue 34, item 1: the target is checked after resolving symlinks. ``savepoints/escape`` is a symlink to a
    directory outside every allowed prefix: lexically inside, really outside. Refused (exit 2) by the check and
    by ``JobRunner.savepoint`` before any side effect: nothing written outside, no checkpoint id claimed."""
    from pipeline.jobs import get_job
    from pipeline.runtime.driver.runner import JobRunner

    ck = (tmp_path / "ckpt").as_uri()
    cfg = load_config(env={}, checkpoint_uri=ck, source_uri=(tmp_path / "src").as_uri(),
                      sink_uri=(tmp_path / "sink").as_uri())
    outside = tmp_path / "outside"
    outside.mkdir()
    sp_dir = tmp_path / "ckpt" / "orders_payments" / "savepoints"
    sp_dir.mkdir(parents=True)
    (sp_dir / "escape").symlink_to(outside, target_is_directory=True)
    (sp_dir / "dangling").symlink_to(tmp_path / "outside-not-yet", target_is_directory=True)
    (sp_dir / "inner").mkdir()
    (sp_dir / "alias").symlink_to(sp_dir / "inner", target_is_directory=True)  # inside -> inside: fine
    base = f"{ck}/orders_payments/savepoints"
    for bad in (f"{base}/escape", f"{base}/escape/sp1", f"{base}/dangling/sp1"):
        with pytest.raises(ConfigError, match="symlinks"):
            check_target(bad, cfg, "orders_payments")
    assert check_target(f"{base}/alias/sp1", cfg, "orders_payments") == f"{base}/alias/sp1"
    # a checkpoint root reached through a symlink (e.g. /tmp -> /private/tmp) is not "outside" itself
    (tmp_path / "ckpt-link").symlink_to(tmp_path / "ckpt", target_is_directory=True)
    ck_link = (tmp_path / "ckpt-link").as_uri()
    cfg_link = load_config(env={}, checkpoint_uri=ck_link)
    assert check_target(f"{ck_link}/orders_payments/savepoints/sp1", cfg_link, "orders_payments")
    with pytest.raises(ConfigError, match="symlinks"):
        check_target(f"{ck_link}/orders_payments/savepoints/escape/sp1", cfg_link, "orders_payments")
    # an allowed prefix of PIPELINE_SAVEPOINT_PREFIXES with a symlink in it: the same rule
    backups = tmp_path / "backups"
    backups.mkdir()
    (backups / "out").symlink_to(outside, target_is_directory=True)
    cfg2 = load_config(env={"PIPELINE_SAVEPOINT_PREFIXES": backups.as_uri()}, checkpoint_uri=ck)
    with pytest.raises(ConfigError, match="symlinks"):
        check_target(f"{backups.as_uri()}/out/sp1", cfg2, "orders_payments")

    runner = JobRunner(get_job("orders_payments"), cfg)
    with pytest.raises(ConfigError, match="symlinks"):
        runner.savepoint(f"{base}/escape/sp1")
    assert list(outside.iterdir()) == []
    assert runner.ctx.coordinator.counter.latest_claimed() is None
