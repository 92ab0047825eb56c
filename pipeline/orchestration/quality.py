"""Adapter between the Airflow tasks and the data-quality package.

The Great Expectations suites live in :mod:`pipeline.quality` (entry point
``validate_job(runner, checkpoint) -> result`` with ``.success``, ``.summary()`` and ``.to_dict()``). It is
imported lazily, at call time. Where it is not installed (or not there yet), the restore DAG still validates:
:func:`consistency_checks` runs oracle-free checks of the checkpoint and the committed output:

* the checkpoint's files exist with their recorded size and SHA-256;
* restore positions are at or before the barrier, per source partition;
* every sink table's committed lineage is unbroken and includes the checkpoint;
* upsert tables hold one row per key; no null keys;
* what the job's graph implies, for any job (:func:`_graph_checks`): an append sink of a join declaring both sides
  unique holds each key once, and an aggregate's upsert sink agrees with the append sink of the same stream
  (for the demo: ``merchant_revenue`` recomputed from ``paid_orders``).

Lazy imports: :mod:`pipeline.quality` (pandas, Great Expectations) and the runtime pieces are imported at call
time, inside the functions, for the reason above.
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipeline.barriers.events import AlignmentLabel, CheckpointType

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
    else with :func:`consistency_checks`. ``mode``: ``full``, ``restore`` (after a restore), ``cheap`` (after a
    restore, without the comparison with the batch evaluation) or ``epoch`` (the cheap per-epoch subset)."""
    ref = None if checkpoint is None else str(checkpoint)
    validate_job = _quality_entry_point()
    if validate_job is None:
        log.info("pipeline.quality is not available: running the oracle-free consistency checks")
        return consistency_checks(runner, ref)
    kwargs: dict[str, Any] = {}
    try:
        params: Mapping[str, Any] = inspect.signature(validate_job).parameters
    except (TypeError, ValueError):
        params = {}
    if mode == "cheap" and "areas" in params:   # after a restore, without the source read (docs/quality.md)
        kwargs["areas"] = ("metadata", "state", "sink")
        mode = "restore"
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
            if bar is not None and (pos.seq, pos.row) > (bar.seq, bar.row) and md.alignment == AlignmentLabel.ALIGNED:
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
        if md.kind == CheckpointType.CHECKPOINT and head_id == md.checkpoint_id and md.checkpoint_id not in ids:
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
    p2, c2 = _graph_checks(runner.job, tables)
    problems += p2
    checks += c2
    ok = not problems
    summary = (f"consistency checks of {label}: {'PASSED' if ok else 'FAILED'} ({len(checks)} checks"
               + (f"; problems: {' | '.join(problems[:5])}" if problems else "") + ")")
    return QualityOutcome(ok, summary, "consistency", checkpoint=str(md.checkpoint_id),
                          details={"checks": checks, "problems": problems,
                                   "rows": {t: d.num_rows for t, d in tables.items()}})


def _graph_checks(job, tables: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """Checks that follow from the job's graph alone, for any job:

    * an append sink fed directly by a join that declares both sides unique holds each join key at most once;
    * an upsert sink of an aggregate whose input stream is also committed as an append sink agrees with that
      sink: the aggregate recomputed from the append sink's rows (count, sum, min, max per key) equals the
      upsert sink's rows (sums to 0.005 per row, floating point).
    """
    import pyarrow.compute as pc

    from pipeline.job import AggregateNode, JoinNode
    problems: list[str] = []
    checks: list[str] = []
    sinks = job.sinks()
    for s in sinks:
        parent = job.nodes[s.parent]
        data = tables.get(s.table)
        if s.mode != "append" or data is None or not data.num_rows:
            continue
        if isinstance(parent, JoinNode) and parent.unique == "both" and parent.on in data.column_names:
            dup = data.group_by([parent.on]).aggregate([([], "count_all")])
            dup = dup.filter(pc.greater(dup["count_all"], 1))
            if dup.num_rows:
                problems.append(f"table {s.table}: {dup.num_rows} {parent.on} values committed more than once "
                                f"(join {parent.uid} declares both sides unique), e.g. {dup.slice(0, 3).to_pylist()}")
            checks.append(f"{s.table}: {parent.on} unique (join {parent.uid}, unique=both)")
    for s in sinks:
        agg = job.nodes[s.parent]
        out = tables.get(s.table)
        if s.mode != "upsert" or not isinstance(agg, AggregateNode) or out is None:
            continue
        base, maps = job.chain_to(agg.parent)
        if maps or agg.filters:  # filtered aggregates (FILTER (WHERE ...)): not recomputed here
            continue  # the aggregate reads a filtered/projected stream: no committed table holds exactly its input
        source_sinks = [t for t in sinks if t.parent == base and t.mode == "append" and tables.get(t.table) is not None]
        if not source_sinks:
            continue
        src = source_sinks[0]
        rows = tables[src.table]
        fns = {"count": "count_all", "sum": "sum", "min": "min", "max": "max"}
        if agg.key not in rows.column_names or any(f not in fns or (c is not None and c not in rows.column_names)
                                                    for _o, f, c in agg.aggs):
            continue
        spec: list[tuple[Any, str]] = [([], "count_all") if f == "count" else (c, fns[f]) for _o, f, c in agg.aggs]
        exp = rows.group_by([agg.key]).aggregate(spec) if rows.num_rows else None
        exp_map = {}
        if exp is not None:
            for r in exp.to_pylist():
                exp_map[r[agg.key]] = tuple(r["count_all"] if f == "count" else r[f"{c}_{fns[f]}"]
                                            for _o, f, c in agg.aggs)
        got_map = {r[agg.key]: tuple(r[o] for o, _f, _c in agg.aggs) for r in out.to_pylist()}
        n_map = ({r[agg.key]: r["count_all"] for r in rows.group_by([agg.key]).aggregate([([], "count_all")]).to_pylist()}
                 if rows.num_rows else {})

        def same(a, b, n: int) -> bool:  # floating sums: 0.005 per row summed
            if a is None or b is None:
                return a is b
            return abs(float(a) - float(b)) <= 0.005 * max(1, n)
        bad = [k for k in set(exp_map) | set(got_map)
               if k not in exp_map or k not in got_map
               or not all(same(x, y, n_map.get(k, 1)) for x, y in zip(exp_map[k], got_map[k]))]
        if bad:
            ex = sorted(bad, key=str)[:3]
            problems.append(f"table {s.table} disagrees with {src.table} (aggregate {agg.uid} recomputed from it) "
                            f"for {len(bad)} keys, e.g. " + ", ".join(f"{k}: expected {exp_map.get(k)} got "
                                                                      f"{got_map.get(k)}" for k in ex))
        checks.append(f"{s.table} agrees with {src.table} (aggregate {agg.uid})")
    return problems, checks
