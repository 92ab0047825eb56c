"""Each suite fails on deliberately broken storage (corruptions written directly with pyarrow/json).

For each corruption: the validation fails, the suites that must notice do, with the expectation, the
object/key group and example rows named; "consistent" corruptions (checksums patched as if the runtime had
written the bad data) leave the checksum suite green, so the data-level suites are what caught them.
"""
from __future__ import annotations

import corrupt
import pytest
from conftest import failed_expectations, failed_suites, make_runner

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _validate(root, docs_dir):
    from pipeline.quality import validate_job
    result = validate_job(make_runner(root), None, docs_dir=docs_dir, build_docs=False)
    assert not result.success, "the corruption went unnoticed:\n" + result.summary()
    return result


def test_duplicated_key(deployment, docs_dir):
    corrupt.duplicate_state_key(deployment, 3)
    r = _validate(deployment, docs_dir)
    assert ("epochal_state_key_groups", "dup_keys") in failed_expectations(r)
    assert ("epochal_recovery_key_groups", "rows, expected_rows") in failed_expectations(r)
    assert "epochal_checkpoint_files" not in failed_suites(r)
    e = next(e for e in r.failed_expectations if e.columns == "dup_keys")
    assert e.unexpected_rows[0]["object"] == "state/merchant_revenue_agg/agg"
    assert e.examples and e.examples[0]["count"] == 2 and e.examples[0]["key"]
    assert "keys are unique per operator, state and key group" in r.summary()


def test_dropped_row(deployment, docs_dir):
    corrupt.drop_state_row(deployment, 3)
    r = _validate(deployment, docs_dir)
    assert ("epochal_recovery_key_groups", "missing_rows") in failed_expectations(r)
    assert ("epochal_recovery_conservation", "accounted, input_rows") in failed_expectations(r)
    assert failed_suites(r) <= {"epochal_recovery_key_groups", "epochal_recovery_conservation"}
    missing = next(e for e in r.failed_expectations if e.columns == "missing_rows")
    assert missing.unexpected_rows[0]["object"] == "state/paid_orders_join/left"
    assert missing.examples[0]["order_id"].startswith("o-") and missing.examples[0]["_actual"] == 0


def test_skewed_total(deployment, docs_dir):
    corrupt.skew_total(deployment, 3, delta=100.0)
    r = _validate(deployment, docs_dir)
    assert ("epochal_recovery_totals", "state, expected") in failed_expectations(r)
    assert ("epochal_sink_totals", "upsert, state") in failed_expectations(r)
    e = next(e for e in r.failed_expectations if e.columns == "state, expected")
    row = e.unexpected_rows[0]
    assert row["measure"] == "revenue" and row["state"] - row["expected"] == 100_00  # in cents


def test_missing_state_file(deployment, docs_dir):
    uri = corrupt.delete_state_file(deployment, 3)
    r = _validate(deployment, docs_dir)
    assert ("epochal_checkpoint_files", "exists") in failed_expectations(r)
    assert ("epochal_state_files", "readable") in failed_expectations(r)
    e = next(e for e in r.failed_expectations if e.columns == "exists")
    assert e.unexpected_rows[0]["uri"] == uri and e.unexpected_rows[0]["owner"] == "chk-3"


def test_checksum_mismatch(deployment, docs_dir):
    uri = corrupt.checksum_mismatch(deployment, 3)
    r = _validate(deployment, docs_dir)
    assert failed_suites(r) == {"epochal_checkpoint_files"}, r.summary()
    e = next(e for e in r.failed_expectations if e.columns == "actual_sha256, expected_sha256")
    assert e.unexpected_rows[0]["uri"] == uri


def test_epoch_committed_twice(deployment, docs_dir):
    new_id = corrupt.commit_epoch_twice(deployment, "paid_orders")
    r = _validate(deployment, docs_dir)
    fe = failed_expectations(r)
    assert ("epochal_sink_commits", "checkpoint_known") in fe
    assert ("epochal_committed_files", "table, sha256") in fe   # the same bytes committed twice to one table
    assert ("epochal_sink_key_groups", "dup_keys") in fe
    assert ("epochal_recovery_key_groups", "extra_rows") in fe
    e = next(e for e in r.failed_expectations if e.columns == "checkpoint_known")
    assert e.unexpected_rows[0] == {"table": "paid_orders", "commit_id": new_id, "checkpoint_known": False}


def test_at_least_once_replay_after_crash(deployment, docs_dir):
    corrupt.at_least_once_replay(deployment, 3)
    r = _validate(deployment, docs_dir)
    fe = failed_expectations(r)
    assert ("epochal_state_key_groups", "after_barrier") in fe      # post-barrier data in snapshot n
    assert ("epochal_sink_key_groups", "dup_keys") in fe            # replayed output committed again
    assert ("epochal_sink_totals", "upsert, append") in fe          # merchant_revenue no longer agrees
    assert ("epochal_recovery_key_groups", "extra_rows") in fe
    assert ("epochal_recovery_conservation", "accounted, input_rows") in fe
    # the checkpoint metadata itself is consistent: only the data shows the double counting
    assert not {"epochal_checkpoint_files", "epochal_sink_commits"} & failed_suites(r)
    dup = next(e for e in r.failed_expectations if e.suite == "epochal_sink_key_groups")
    assert any("part-replay" in f for ex in dup.examples for f in ex["files"])
