"""The quality package's :class:`~pipeline.runtime.driver.validation.RecoveryValidator`: the Great Expectations suites
after every epoch (the cheap subset) and after every restore. ``import pipeline`` registers it as the default.

The methods import :mod:`pipeline.quality.validate` when first called: it loads pandas and Great Expectations,
which a Spark Python worker or an Airflow DAG parse must not pay for.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["QualityValidator"]


class QualityValidator:
    """Validates with :func:`~pipeline.quality.validate.validate_after_epoch` and
    :func:`~pipeline.quality.validate.validate_restored` (``docs_dir``: where the Data Docs site goes)."""

    def __init__(self, *, docs_dir: str | None = None) -> None:
        self.docs_dir = docs_dir

    def after_epoch(self, runner: Any, metadata: Any) -> None:
        from pipeline.quality.validate import validate_after_epoch  # import cost (pandas, GX): see module doc
        validate_after_epoch(runner, metadata)

    def after_restore(self, runner: Any, result: Mapping[str, Any]) -> Any:
        from pipeline.quality.validate import validate_restored  # import cost (pandas, GX): see module doc
        return validate_restored(runner, result, docs_dir=self.docs_dir)

    def __repr__(self) -> str:
        return f"QualityValidator(docs_dir={self.docs_dir!r})"
