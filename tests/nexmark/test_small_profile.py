"""The Nexmark runner's small profile (default suite): a few thousand events, a join query, an aggregate query
(q15: count_distinct, FILTER), the side-table join q13, a top-N query (q19: the 10 highest bids per auction, an
updating stream) and an aggregate over an updating stream (q4) SIGKILLed once and resumed, and a stateless query, each compared exactly with its DuckDB reference
through the real CLI; q11 (session windows) is opt-in.

The full suite is ``python -m benchmarks.nexmark.run`` (benchmarks/nexmark/README.md)."""
from __future__ import annotations

import importlib
import json
import os

import pytest

from benchmarks.nexmark import run
from benchmarks.nexmark.queries import QUERIES, NotExpressible

pytestmark = [pytest.mark.spark, pytest.mark.e2e, pytest.mark.slow]

COMMON = ["--events", "3000", "--rate", "100", "--partitions", "2", "--epoch-seconds", "10", "--read", "direct",
          "--no-measure", "--json", "--seed", "3"]


def _run(capsys, *args: str) -> dict:
    rc = run.main([*COMMON, *args])
    out = json.loads(capsys.readouterr().out)
    out["rc"] = rc
    return out


def test_join_query_exact_after_a_sigkill(capsys, tmp_path):
    out = _run(capsys, "--queries", "q3", "--kills", "1", "--workdir", str(tmp_path))
    (r,) = out["results"]
    assert r["status"] == "exact", r
    assert r["kills_landed"] == 1 and r["runs"] >= 2
    assert r["output_rows"] == r["reference_rows"] > 0
    assert out["rc"] == 0


def _not_expressible() -> list[str]:
    """The queries that still raise NotExpressible (fewer as operators land)."""
    out = []
    for q in QUERIES:
        try:
            importlib.import_module(f"benchmarks.nexmark.queries.{q}").job()
        except NotExpressible:
            out.append(q)
    return out


def test_every_query_is_expressible_and_a_stateless_one_is_exact(capsys, tmp_path):
    """All 23 queries (q0-q22) build as written; the runner still reports a query that raises NotExpressible as
    "not expressible yet", never as skipped (benchmarks/nexmark/README.md)."""
    assert len(QUERIES) == 23 and _not_expressible() == []
    out = _run(capsys, "--queries", "q21", "--kills", "0", "--workdir", str(tmp_path))
    by_q = {r["query"]: r for r in out["results"]}
    assert by_q["q21"]["status"] == "exact", by_q["q21"]
    assert by_q["q21"]["output_rows"] == by_q["q21"]["reference_rows"] > 1000


def test_aggregate_over_an_updating_stream_exact_after_a_sigkill(capsys, tmp_path):
    """q4: the average per category of each auction's highest bid, an aggregate over a running aggregate's
    changelog (docs/operators.md "Updating streams")."""
    out = _run(capsys, "--queries", "q4", "--kills", "1", "--workdir", str(tmp_path))
    (r,) = out["results"]
    assert r["status"] == "exact", r
    assert r["kills_landed"] == 1 and r["output_rows"] == r["reference_rows"] > 0


@pytest.mark.skipif(os.environ.get("EPOCHAL_DELETES_FULL") != "1",
                    reason="opt-in: EPOCHAL_DELETES_FULL=1 (q5 took 56 s at load 11, 158 s at load 15: over the small profile's 40 s budget)")
def test_retracting_join_exact_after_a_sigkill(capsys, tmp_path):
    """q5: the per-window counts joined with the per-window maximum, a running aggregate: a retracting join whose
    filtered pairs an upsert sink deletes (docs/operators.md "Updating streams")."""
    out = _run(capsys, "--queries", "q5", "--kills", "1", "--workdir", str(tmp_path))
    (r,) = out["results"]
    assert r["status"] == "exact", r
    assert r["kills_landed"] == 1 and r["output_rows"] == r["reference_rows"] > 0


def test_aggregate_with_count_distinct_and_filters_exact_after_a_sigkill(capsys, tmp_path):
    """q15: a running aggregate per day with count_distinct and FILTER (WHERE ...) (docs/operators.md "Aggregate")."""
    out = _run(capsys, "--queries", "q15", "--kills", "1", "--workdir", str(tmp_path))
    (r,) = out["results"]
    assert r["status"] == "exact", r
    assert r["kills_landed"] == 1 and r["output_rows"] == r["reference_rows"] > 0


def test_side_table_join_exact_after_a_sigkill(capsys, tmp_path):
    """q13: a lookup join with the bounded side table ``side_input`` (docs/operators.md "Lookup join")."""
    out = _run(capsys, "--queries", "q13", "--kills", "1", "--workdir", str(tmp_path))
    (r,) = out["results"]
    assert r["status"] == "exact", r
    assert r["kills_landed"] == 1 and r["output_rows"] == r["reference_rows"] > 1000
    assert len(list((tmp_path / "q13" / "ckpt" / "nexmark_q13" / "lookups" / "side_input").glob("epoch-*.json"))) > 1


@pytest.mark.skipif(os.environ.get("EPOCHAL_SESSION") != "1" and os.environ.get("EPOCHAL_SESSION_FULL") != "1",
                    reason="opt-in (EPOCHAL_SESSION=1): about 2.5 min on the loaded 2-core machine")
def test_session_window_query_exact_after_a_sigkill(capsys, tmp_path):
    """q11: bids per bidder per session (10 s gap; docs/operators.md "Session windows"). At 100 events/s no
    bidder pauses 10 s within the input, so this profile stretches the same events over 300 s (5 epochs of 60 s):
    a few hundred sessions close."""
    out = _run(capsys, "--queries", "q11", "--kills", "1", "--workdir", str(tmp_path), "--rate", "10",
               "--epoch-seconds", "60")
    (r,) = out["results"]
    assert r["status"] == "exact", r
    assert r["kills_landed"] == 1 and r["output_rows"] == r["reference_rows"] > 100
def test_top_n_exact_after_a_sigkill(capsys, tmp_path):
    """q19: ``top_n`` per auction, n=10, in an upsert sink keyed by (auction, rank_number) (docs/operators.md
    "Top-N and keep-last")."""
    out = _run(capsys, "--queries", "q19", "--kills", "1", "--workdir", str(tmp_path))
    (r,) = out["results"]
    assert r["status"] == "exact", r
    assert r["kills_landed"] == 1 and r["output_rows"] == r["reference_rows"] > 1000


@pytest.mark.skipif(os.environ.get("EPOCHAL_OVER_FULL") != "1",
                    reason="opt-in (EPOCHAL_OVER_FULL=1): about 2.5 min on the loaded 2-core machine")
def test_over_aggregate_over_an_updating_stream_exact_after_a_sigkill(capsys, tmp_path):
    """q6: per seller the average of its last 10 winning bids, an over aggregate over top-1 per auction's updating
    stream, in an upsert sink keyed by the auction (docs/operators.md "Over aggregate")."""
    out = _run(capsys, "--queries", "q6", "--kills", "1", "--workdir", str(tmp_path))
    (r,) = out["results"]
    assert r["status"] == "exact", r
    assert r["kills_landed"] == 1 and r["output_rows"] == r["reference_rows"] > 100
