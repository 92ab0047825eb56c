"""Validation results: frozen value objects with a short human summary and a JSON form.

A :class:`ValidationResult` is what :func:`pipeline.quality.validate_job` returns: one
:class:`SuiteOutcome` per suite run, each with one :class:`ExpectationOutcome` per expectation. Failed
expectations carry the rows of the (summary) dataset that broke them, named by their id columns
(checkpoint, operator/state, table, key group, file ...), and example rows of the underlying data where
the suites drilled down (duplicated keys, rows missing from or extra to the recomputation).
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ExpectationOutcome", "SuiteOutcome", "ValidationResult"]

_MAX_SHOWN_FAILURES = 12
_MAX_SHOWN_ROWS = 3


def _short(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, default=str, sort_keys=True) if not isinstance(value, str) else value
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class ExpectationOutcome:
    """One expectation of one suite, evaluated on one dataset."""

    suite: str
    expectation: str                      # GX type, e.g. expect_column_values_to_be_between
    success: bool
    description: str
    kwargs: Mapping[str, Any]             # column(s) and bounds (without batch_id)
    observed: Any = None                  # observed_value for aggregate expectations
    unexpected_count: int | None = None
    element_count: int | None = None
    unexpected_rows: tuple[Mapping[str, Any], ...] = ()   # offending summary rows (id columns + values)
    examples: tuple[Mapping[str, Any], ...] = ()          # example data rows behind the failure
    exception: str | None = None

    @property
    def columns(self) -> str:
        k = self.kwargs
        if "column" in k:
            return str(k["column"])
        if "column_A" in k:
            return f"{k['column_A']}, {k['column_B']}"
        if "column_list" in k:
            return ", ".join(map(str, k["column_list"]))
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "expectation": self.expectation, "success": self.success,
                "description": self.description, "kwargs": dict(self.kwargs), "observed": self.observed,
                "unexpected_count": self.unexpected_count, "element_count": self.element_count,
                "unexpected_rows": [dict(r) for r in self.unexpected_rows],
                "examples": [dict(r) for r in self.examples], "exception": self.exception}


@dataclass(frozen=True, slots=True)
class SuiteOutcome:
    """One suite run on one dataset (a GX validation)."""

    suite: str
    area: str                             # metadata | state | sink | recovery
    dataset: str                          # the GX data asset (summary table) validated
    success: bool
    rows: int                             # rows of the validated dataset
    expectations: tuple[ExpectationOutcome, ...] = ()
    result_uri: str | None = None         # the stored GX result JSON
    skipped: str | None = None            # why the suite did not run (e.g. no oracle for the job)
    error: str | None = None              # why its dataset could not be built (the suite fails)

    @property
    def failed(self) -> tuple[ExpectationOutcome, ...]:
        return tuple(e for e in self.expectations if not e.success)

    def to_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "area": self.area, "dataset": self.dataset, "success": self.success,
                "rows": self.rows, "evaluated": len(self.expectations), "failed": len(self.failed),
                "result_uri": self.result_uri, "skipped": self.skipped, "error": self.error,
                "expectations": [e.to_dict() for e in self.expectations]}


@dataclass(frozen=True, slots=True)
class ValidationResult:
    """The outcome of validating one checkpoint or savepoint of a job."""

    job: str
    snapshot: str                         # chk-<id> or sp-<id>
    checkpoint_id: int
    epoch: int
    location: str                         # the snapshot's directory
    mode: str                             # full | epoch (cheap per-epoch subset) | restore
    success: bool
    suites: tuple[SuiteOutcome, ...] = ()
    duration_s: float = 0.0
    timings: Mapping[str, float] = field(default_factory=dict)
    figures: Mapping[str, Any] = field(default_factory=dict)   # sizes of what was validated
    messages: tuple[str, ...] = ()
    result_uri: str | None = None         # <job root>/validation/<snapshot>/summary.json
    docs_uri: str | None = None           # Data Docs index.html

    @property
    def failed_expectations(self) -> list[ExpectationOutcome]:
        return [e for s in self.suites for e in s.failed]

    @property
    def evaluated(self) -> int:
        return sum(len(s.expectations) for s in self.suites)

    def summary(self) -> str:
        """A short, readable report: status line, then each failed expectation with where and examples."""
        failed = self.failed_expectations
        ran = [s for s in self.suites if not s.skipped or s.error]
        bad_suites = [s for s in ran if not s.success]
        status = "PASSED" if self.success else "FAILED"
        head = (f"Data quality of job {self.job}, {self.snapshot} (epoch {self.epoch}, {self.mode} validation): "
                f"{status} - {self.evaluated - len(failed)}/{self.evaluated} expectations passed in "
                f"{len(ran) - len(bad_suites)}/{len(ran)} suites, {self.duration_s:.1f} s")
        lines = [head]
        for s in self.suites:
            if s.error:
                lines.append(f"  FAIL {s.suite}: {s.error}")
            elif s.skipped:
                lines.append(f"  skip {s.suite}: {s.skipped}")
            elif s.success:
                lines.append(f"  ok   {s.suite} ({len(s.expectations)} expectations on {s.rows} {s.dataset} rows)")
            else:
                lines.append(f"  FAIL {s.suite} ({len(s.failed)} of {len(s.expectations)} expectations failed on "
                             f"{s.rows} {s.dataset} rows)")
        shown = 0
        shown_examples: set[str] = set()
        for e in failed:
            if shown == _MAX_SHOWN_FAILURES:
                lines.append(f"  ... and {len(failed) - shown} more failed expectations (see {self.result_uri})")
                break
            shown += 1
            where = f"{e.expectation}({e.columns})" if e.columns else e.expectation
            count = ""
            if e.unexpected_count is not None:
                count = f": {e.unexpected_count} of {e.element_count} rows unexpected"
            elif e.observed is not None:
                count = f": observed {_short(e.observed, 80)}"
            lines.append(f"  x [{e.suite}] {e.description} -- {where}{count}")
            if e.exception:
                lines.append(f"      error: {_short(e.exception, 300)}")
            for r in e.unexpected_rows[:_MAX_SHOWN_ROWS]:
                lines.append(f"      at {_short(r, 400)}")
            sig = _short(list(e.examples[:_MAX_SHOWN_ROWS]), 10_000)
            if e.examples and sig not in shown_examples:
                shown_examples.add(sig)
                for r in e.examples[:_MAX_SHOWN_ROWS]:
                    lines.append(f"      e.g. {_short(r, 240)}")
        for m in self.messages:
            lines.append(f"  note: {m}")
        if self.result_uri:
            lines.append(f"  results: {self.result_uri}")
        if self.docs_uri:
            lines.append(f"  data docs: {self.docs_uri}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "snapshot": self.snapshot, "checkpoint_id": self.checkpoint_id,
                "epoch": self.epoch, "location": self.location, "mode": self.mode, "success": self.success,
                "evaluated": self.evaluated, "failed": len(self.failed_expectations),
                "duration_s": round(self.duration_s, 3), "timings": {k: round(v, 3) for k, v in self.timings.items()},
                "figures": dict(self.figures), "messages": list(self.messages), "result_uri": self.result_uri,
                "docs_uri": self.docs_uri, "suites": [s.to_dict() for s in self.suites]}
