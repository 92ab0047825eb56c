"""Data quality of restored state and committed output, with Great Expectations (1.x).

Public API (importing this package is cheap: GX, Spark and pandas load on first use)::

    from pipeline.quality import validate_job
    result = validate_job(runner, "7")          # checkpoint id, savepoint URI, or None for the latest
    print(result.summary()); result.success; result.to_dict()

* :func:`validate_job` - every suite (metadata, state, sink, recovery) on one checkpoint or savepoint;
* :func:`validate_restored` - after ``JobRunner.restore``; raises ValidationError on failure;
* :func:`validate_after_epoch` - the cheap per-epoch subset when ``PIPELINE_VALIDATE_AFTER_EPOCH=true``;
* :class:`QualityValidator` - the runtime's default validator (after each epoch, after each restore);
* :data:`SUITES` / :func:`export_suites` - the suites, exported as GX JSON to ``include/gx``.

See ``docs/quality.md``.
"""
from __future__ import annotations

from typing import Any

__all__ = ["validate_job", "validate_restored", "validate_after_epoch", "QualityValidator", "ValidationResult",
           "SuiteOutcome", "ExpectationOutcome", "SUITES", "export_suites"]

_LAZY = {
    "validate_job": ("pipeline.quality.validate", "validate_job"),
    "validate_restored": ("pipeline.quality.validate", "validate_restored"),
    "validate_after_epoch": ("pipeline.quality.validate", "validate_after_epoch"),
    "QualityValidator": ("pipeline.quality.validator", "QualityValidator"),
    "ValidationResult": ("pipeline.quality.result", "ValidationResult"),
    "SuiteOutcome": ("pipeline.quality.result", "SuiteOutcome"),
    "ExpectationOutcome": ("pipeline.quality.result", "ExpectationOutcome"),
    "SUITES": ("pipeline.quality.suites", "SUITES"),
    "export_suites": ("pipeline.quality.suites", "export_suites"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib
        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pipeline.quality' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))
