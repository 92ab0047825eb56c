"""Adapter between the Airflow tasks and the data-quality package.

The Great Expectations suites live in :mod:`pipeline.quality` (entry point
``validate_job(runner, checkpoint) -> result`` with ``.success``, ``.summary()`` and ``.to_dict()``). It is
imported lazily, at call time. Where it is not installed (or not there yet), the restore DAG still validates:
:func:`consistency_checks` runs oracle-free checks of the checkpoint and the committed output:

* the checkpoint's files exist with their recorded size and SHA-256;
* restore positions are at or before the barrier, per source partition;
* every sink table's committed lineage is unbroken and includes the checkpoint;
* upsert tables hold one row per key; no null keys;
* for the demo job: ``paid_orders`` has no duplicate ``order_id`` and ``merchant_revenue`` agrees with it
  (counts and sums per merchant).
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["QualityOutcome", "validate_checkpoint", "consistency_checks"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class QualityOutcome:
    """A validation result, whatever produced it."""

    success: bool
    summary: str
    engine: str                              # "great_expectations" | "consistency"
    checkpoint: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"success": self.success, "summary": self.summary, "engine": self.engine,
                "checkpoint": self.checkpoint, "details": dict(self.details)}


def _quality_entry_point():
    try:
        from pipeline.quality import validate_job  # issue 5: Great Expectations suites
    except ImportError:
        return None
    return validate_job


def validate_checkpoint(runner, checkpoint: str | int | None = None, *, mode: str = "full") -> QualityOutcome:
    """Validate ``checkpoint`` (id or savepoint URI; None = newest) with the quality suites if available,
    else with :func:`consistency_checks`. ``mode``: ``full``, ``restore`` (after a restore) or ``epoch``
    (the cheap per-epoch subset)."""
    ref = None if checkpoint is None else str(checkpoint)
    validate_job = _quality_entry_point()
    if validate_job is None:
        log.info("pipeline.quality is not available: running the oracle-free consistency checks")
        return consistency_checks(runner, ref)
    kwargs: dict[str, Any] = {}
    try:
        params = inspect.signature(validate_job).parameters
    except (TypeError, ValueError):
        params = {}
    if "mode" in params:
        kwargs["mode"] = mode
    result = validate_job(runner, ref, **kwargs)
    summary = result.summary() if callable(getattr(result, "summary", None)) else str(getattr(result, "summary", ""))
    details = result.to_dict() if callable(getattr(result, "to_dict", None)) else {}
    return QualityOutcome(success=bool(result.success), summary=summary, engine="great_expectations",
                          checkpoint=ref, details=details)


def consistency_checks(runner, checkpoint: str | None = None) -> QualityOutcome:
    """Oracle-free checks of a completed checkpoint and the job's committed output (see module doc)."""
    import pyarrow.compute as pc

    from pipeline.exceptions import EpochalError
    from pipeline.sink.table import CommittedTable
    problems: list[str] = []
    checks: list[str] = []
    store = runner.coordinator.store
    if checkpoint is None:
        cp = store.latest()
        if cp is None:
            return QualityOutcome(False, f"job {runner.job.name!r} has no completed checkpoint", "consistency")
    else:
        cp = runner.load_snapshot(checkpoint)
    md = cp.metadata
    label = f"{md.kind} {md.checkpoint_id} of job {md.job!r}"
    from pipeline.fileio import file_io_for
    problems += cp.problems(file_io_for(cp.location))
    checks.append("files exist with size and SHA-256")
    for src, parts in md.positions.items():
        for p, pos in parts.items():
            bar = md.barriers.get(src, {}).get(p)
            if bar is not None and (pos.seq, pos.row) > (bar.seq, bar.row) and md.alignment == "aligned":
                problems.append(f"{label}: source {src} partition {p}: restore position {pos} is past barrier {bar}")
    checks.append("positions at or before barriers")
    tables: dict[str, Any] = {}
    latest = store.latest()
    head_id = latest.checkpoint_id if latest is not None else None
    for sink in runner.job.sinks():
        t = CommittedTable(runner.sink_fio, runner.config.sink_uri, runner.job.name, sink.table)
        try:
            chain = t.lineage()
            data = t.read()
        except EpochalError as e:
            problems.append(f"table {sink.table}: {e}")
            continue
        ids = [e.checkpoint_id for e in chain]
        if md.kind == "checkpoint" and head_id == md.checkpoint_id and md.checkpoint_id not in ids:
            problems.append(f"table {sink.table}: {label} is not on the committed lineage {ids[-5:]}")
        tables[sink.table] = data
        if sink.key and data.num_rows:
            for k in sink.key:
                nulls = data[k].null_count
                if nulls:
                    problems.append(f"table {sink.table}: {nulls} rows with a null key {k}")
            dup = data.group_by(list(sink.key)).aggregate([([], "count_all")])
            dup = dup.filter(pc.greater(dup["count_all"], 1))
            if dup.num_rows:
                problems.append(f"table {sink.table}: {dup.num_rows} duplicated keys, e.g. {dup.slice(0, 3).to_pylist()}")
    checks.append("committed lineage unbroken; one row per key in upsert tables")
    paid, rev = tables.get("paid_orders"), tables.get("merchant_revenue")
    if paid is not None and paid.num_rows and "order_id" in paid.column_names:
        dup = paid.group_by(["order_id"]).aggregate([([], "count_all")])
        dup = dup.filter(pc.greater(dup["count_all"], 1))
        if dup.num_rows:
            problems.append(f"table paid_orders: {dup.num_rows} order_id values committed more than once, "
                            f"e.g. {dup.slice(0, 3).to_pylist()}")
        checks.append("paid_orders: order_id unique")
        if rev is not None:
            exp = paid.group_by(["merchant_id"]).aggregate([([], "count_all"), ("paid_amount", "sum")])
            exp_map = {r["merchant_id"]: (r["count_all"], round(r["paid_amount_sum"] or 0.0, 2)) for r in exp.to_pylist()}
            got_map = {r["merchant_id"]: (int(r["paid_orders"]), round(float(r["revenue"] or 0.0), 2))
                       for r in rev.select(["merchant_id", "paid_orders", "revenue"]).to_pylist()} if rev.num_rows else {}
            bad = [m for m in set(exp_map) | set(got_map)
                   if m not in exp_map or m not in got_map or exp_map[m][0] != got_map[m][0]
                   or abs(exp_map[m][1] - got_map[m][1]) > 0.005 * max(1, exp_map[m][0])]
            if bad:
                ex = sorted(bad)[:3]
                problems.append(f"merchant_revenue disagrees with paid_orders for {len(bad)} merchants, e.g. "
                                + ", ".join(f"{m}: expected {exp_map.get(m)} got {got_map.get(m)}" for m in ex))
            checks.append("merchant_revenue agrees with paid_orders")
    ok = not problems
    summary = (f"consistency checks of {label}: {'PASSED' if ok else 'FAILED'} ({len(checks)} checks"
               + (f"; problems: {' | '.join(problems[:5])}" if problems else "") + ")")
    return QualityOutcome(ok, summary, "consistency", checkpoint=str(md.checkpoint_id),
                          details={"checks": checks, "problems": problems,
                                   "rows": {t: d.num_rows for t, d in tables.items()}})
