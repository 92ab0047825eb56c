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
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from pipeline import settings
from pipeline.quality.suites import SUITES, SuiteSpec, build_gx_suite

__all__ = ["Engine", "engine", "warm_up", "build_data_docs"]

log = logging.getLogger("epochal.quality")

_LOCK = threading.Lock()
_ENGINE: Engine | None = None
_WARM: threading.Thread | None = None
DATASOURCE = "epochal"


def _quiet() -> None:
    """No usage statistics, no progress bars, and GX loggers at WARNING (some modules set INFO themselves)."""
    settings.environ().setdefault("GX_ANALYTICS_ENABLED", "False")
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
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )
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
    index = os.path.join(os.path.abspath(docs_dir), "index.html")
    try:
        _add_overview(index, results)
    except Exception as e:  # noqa: BLE001 - the GX site is still there
        log.warning("data docs: could not add the Epochal overview to %s: %s", index, e)
    return urls.get("epochal") or f"file://{index}"


_OVERVIEW_CSS = """
#epochal-overview{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:16px 24px;color:#222}
#epochal-overview h2{font-size:20px;margin:8px 0}
#epochal-overview p{margin:4px 0 12px;color:#555;font-size:13px}
#epochal-overview table{border-collapse:collapse;font-size:13px;margin-bottom:18px}
#epochal-overview th,#epochal-overview td{border:1px solid #ddd;padding:4px 10px;text-align:left}
#epochal-overview th{background:#f3f4f6}
#epochal-overview .ok{color:#0a7d32;font-weight:600}
#epochal-overview .fail{color:#b42318;font-weight:700}
#epochal-overview tr.snap td{background:#eef2ff;font-weight:600}
"""


def _add_overview(index_path: str, results) -> None:
    """Insert a static table of the validations (no CDN assets needed) at the top of ``index.html``."""
    import glob
    import html
    root = os.path.dirname(index_path)
    by_snap: dict[str, list] = {}
    for suite_name, dataset, run_name, doc in results:
        by_snap.setdefault(run_name, []).append((suite_name, dataset, doc))
    area = {s.name: s.area for s in SUITES}

    def snap_key(name: str) -> int:
        tail = name.rsplit("-", 1)[-1]
        return int(tail) if tail.isdigit() else -1

    rows = []
    for snap in sorted(by_snap, key=snap_key, reverse=True):
        items = by_snap[snap]
        meta = (items[0][2].get("meta") or {}).get("epochal", {})
        ok_all = all(d.get("success") for _, _, d in items)
        run_time = ((items[0][2].get("meta") or {}).get("run_id") or {}).get("run_time", "")
        rows.append(f'<tr class="snap"><td colspan="6">{html.escape(str(meta.get("job", "")))} {html.escape(snap)} '
                    f'({html.escape(str(meta.get("mode", "")))} validation, {html.escape(str(run_time)[:19])}) - '
                    f'<span class="{"ok" if ok_all else "fail"}">{"PASSED" if ok_all else "FAILED"}</span></td></tr>')
        for suite_name, dataset, doc in sorted(items, key=lambda x: ([s.name for s in SUITES].index(x[0])
                                                                      if x[0] in area else 99)):
            st = doc.get("statistics") or {}
            pages = sorted(glob.glob(os.path.join(root, "validations", suite_name, snap, "*", "*.html")))
            link = os.path.relpath(pages[-1], root) if pages else ""
            name = f'<a href="{html.escape(link)}">{html.escape(suite_name)}</a>' if link else html.escape(suite_name)
            ok = bool(doc.get("success"))
            failed = [r.get("expectation_config", {}).get("description") or r.get("expectation_config", {}).get("type")
                      for r in doc.get("results", []) if not r.get("success")]
            rows.append(f'<tr><td>{name}</td><td>{html.escape(area.get(suite_name, ""))}</td>'
                        f'<td>{html.escape(dataset)}</td>'
                        f'<td class="{"ok" if ok else "fail"}">{"passed" if ok else "FAILED"}</td>'
                        f'<td>{st.get("successful_expectations", "")}/{st.get("evaluated_expectations", "")}</td>'
                        f'<td>{html.escape("; ".join(str(f) for f in failed[:3]))}</td></tr>')
    block = (f'<div id="epochal-overview"><style>{_OVERVIEW_CSS}</style>'
             '<h2>Epochal data quality: latest validations</h2>'
             '<p>Suites on restored operator state, sink output, checkpoint metadata and recovery correctness. '
             'Results are stored next to each checkpoint under '
             '<code>&lt;checkpoint root&gt;/&lt;job&gt;/validation/</code>.</p>'
             '<table><tr><th>suite</th><th>area</th><th>dataset</th><th>status</th><th>passed</th>'
             '<th>failed expectations</th></tr>' + "".join(rows) + "</table></div>")
    with open(index_path, encoding="utf-8") as f:
        text = f.read()
    if 'id="epochal-overview"' in text:
        return
    pos = text.find("<body")
    pos = text.find(">", pos) + 1 if pos >= 0 else 0
    with open(index_path, "w", encoding="utf-8") as f:
        f.write(text[:pos] + block + text[pos:])
