"""Great Expectations (1.x) plumbing: one ephemeral context per process, pandas batches, Data Docs.

GX is imported lazily (it takes seconds) and silenced: no progress bars, no usage statistics, warnings
only. Each suite is validated with one ``Batch.validate`` call on its (small) summary DataFrame, with
``result_format=COMPLETE`` and the suite's id columns as ``unexpected_index_column_names`` so that a
failure names the checkpoint/operator/table/key group it concerns.

Data Docs are built by a fresh ephemeral context into a local directory from the validation results of
this run plus the stored results of the latest validated snapshots (read back from the checkpoint
storage), so the site always shows the latest validations, whichever machine ran them.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Iterable, Mapping

import pandas as pd

from pipeline.quality.suites import SUITES, SuiteSpec, build_gx_suite

__all__ = ["Engine", "engine", "warm_up", "build_data_docs"]

log = logging.getLogger("epochal.quality")

_LOCK = threading.Lock()
_ENGINE: "Engine | None" = None
_WARM: threading.Thread | None = None
DATASOURCE = "epochal"


def _quiet() -> None:
    """No usage statistics, no progress bars, and GX loggers at WARNING (some modules set INFO themselves)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    for name, lg in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith("great_expectations") and isinstance(lg, logging.Logger) and lg.level < logging.WARNING:
            lg.setLevel(logging.WARNING)


def warm_up() -> None:
    """Start importing GX in a background thread (it overlaps with Spark work)."""
    global _WARM
    with _LOCK:
        if _WARM is None and _ENGINE is None:
            _quiet()

            def imp() -> None:
                try:
                    import great_expectations  # noqa: F401
                    import great_expectations.expectations  # noqa: F401
                except Exception:  # noqa: BLE001 - the real import reports it
                    pass

            _WARM = threading.Thread(target=imp, name="epochal-gx-import", daemon=True)
            _WARM.start()


def _new_context():
    _quiet()
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig
    _quiet()  # again: importing GX modules resets some logger levels
    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    return ctx


class Engine:
    """A GX context with one pandas asset per dataset and every Epochal suite registered."""

    def __init__(self) -> None:
        self.ctx = _new_context()
        ds = self.ctx.data_sources.add_pandas(DATASOURCE)
        self.batch_defs: dict[str, Any] = {}
        for dataset in sorted({s.dataset for s in SUITES}):
            asset = ds.add_dataframe_asset(dataset)
            self.batch_defs[dataset] = asset.add_batch_definition_whole_dataframe(dataset)
        self.suites = {s.name: self.ctx.suites.add(build_gx_suite(s)) for s in SUITES}

    def validate(self, spec: SuiteSpec, df: pd.DataFrame):
        """Validate ``df`` against suite ``spec``; returns the GX ExpectationSuiteValidationResult."""
        batch = self.batch_defs[spec.dataset].get_batch(batch_parameters={"dataframe": df})
        ids = [c for c in spec.id_columns if c in df.columns]
        fmt: dict[str, Any] = {"result_format": "COMPLETE", "partial_unexpected_count": 20}
        if ids and len(df):
            fmt["unexpected_index_column_names"] = ids
        return batch.validate(self.suites[spec.name], result_format=fmt)


def engine() -> Engine:
    global _ENGINE
    if _WARM is not None:
        _WARM.join()
    with _LOCK:
        if _ENGINE is None:
            _ENGINE = Engine()
        return _ENGINE


def build_data_docs(docs_dir: str, results: Iterable[tuple[str, str, str, Mapping[str, Any]]]) -> str:
    """Build the Data Docs site in ``docs_dir`` from ``(suite, dataset, run_name, result JSON dict)``.

    Returns the ``file://`` URI of the site's ``index.html``.
    """
    from great_expectations.core.expectation_validation_result import ExpectationSuiteValidationResultSchema
    from great_expectations.core.run_identifier import RunIdentifier
    from great_expectations.data_context.types.resource_identifiers import (ExpectationSuiteIdentifier,
                                                                          ValidationResultIdentifier)
    os.makedirs(docs_dir, exist_ok=True)
    ctx = _new_context()
    try:
        ctx.delete_data_docs_site("local_site")
    except Exception:  # noqa: BLE001 - not present in this GX version
        pass
    ctx.add_data_docs_site("epochal", {
        "class_name": "SiteBuilder", "show_how_to_buttons": False,
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": os.path.abspath(docs_dir)},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"}})
    for s in SUITES:
        ctx.suites.add(build_gx_suite(s))
    schema = ExpectationSuiteValidationResultSchema()
    for suite_name, dataset, run_name, doc in results:
        try:
            res = schema.load(dict(doc))
            run_time = (doc.get("meta") or {}).get("run_id", {}).get("run_time") or \
                (doc.get("meta") or {}).get("validation_time")
            key = ValidationResultIdentifier(
                expectation_suite_identifier=ExpectationSuiteIdentifier(name=suite_name),
                run_id=RunIdentifier(run_name=run_name, run_time=run_time),
                batch_identifier=f"{DATASOURCE}-{dataset}")
            ctx.validation_results_store.set(key, res)
        except Exception as e:  # noqa: BLE001 - one unreadable old result must not break the site
            log.warning("data docs: skipping result of %s (%s): %s", suite_name, run_name, e)
    urls = ctx.build_data_docs(site_names=["epochal"])
    return urls.get("epochal") or f"file://{os.path.abspath(docs_dir)}/index.html"
