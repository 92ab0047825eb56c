"""Collectors: build the small datasets the suites validate, from storage, Spark and the recomputation.

Cost model (what makes validation of a 2M-order checkpoint take seconds, not minutes):

* **metadata** (driver, no Spark): ``_metadata`` of the snapshot, the retained checkpoints and the
  savepoints, the sink commit logs, and one HEAD (size) per referenced file;
* **data** (one Spark pass): every state file of the snapshot and every committed file of the append
  sinks is read once by an executor, which checksums it, reads its Parquet footer and turns its rows
  into the normal form of :mod:`pipeline.quality.normalize`; Spark aggregates that per key group and per
  group and only those summaries (a few thousand rows) reach the driver. Upsert sinks (compacted per-key
  totals) are small and read on the driver;
* **recovery** (driver, in a thread while Spark works): the recovery model recomputes every object from
  the source files up to the barrier positions; its rows are summarised the same way (key groups are
  recomputed with NumPy, :mod:`pipeline.quality.keygroups`). Key groups whose summaries differ are then
  compared row by row (one extra Spark job per affected object, only on failure) to name missing and
  extra rows.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pandas as pd

from pipeline.layout import checkpoint_dir_name
from pipeline.quality.collect_base import DRILL_KGS, Collected, Snapshot, ordinal
from pipeline.quality.collect_data import DataCollector
from pipeline.quality.collect_metadata import MetadataCollector
from pipeline.quality.collect_recovery import RecoveryCollector
from pipeline.quality.dead_letter_rows import dead_letter_row_diff
from pipeline.quality.recovery import plan_recomputation
from pipeline.quality.runtime_logs import COLUMNS as RUNTIME_LOG_COLUMNS
from pipeline.quality.runtime_logs import runtime_log_rows
from pipeline.quality.source_dead_letters import source_dead_letter_rows
from pipeline.quality.users_read import COLUMNS as USERS_READ_COLUMNS
from pipeline.quality.users_read import dead_letter_rows, open_table_rows

__all__ = ["Snapshot", "Collected", "collect", "ordinal"]

log = logging.getLogger("epochal.quality")


class _Collector(MetadataCollector, DataCollector, RecoveryCollector):
    """Every step, in :func:`collect`'s order: metadata, data pass, recovery."""


def collect(runner, snapshot: Snapshot, *, mode: str = "full", areas: tuple[str, ...] | None = None,
            drill_kgs: int = DRILL_KGS, engine: str = "auto") -> Collected:
    """Build every dataset the suites of ``areas`` need (``mode="epoch"``: metadata only, no Spark).

    Over 80 lines: the datasets of every suite area in the order the suites need them, each a call; the order
    decides what is read once and shared."""
    import dataclasses

    c = _Collector(runner, snapshot, mode=mode, drill_kgs=drill_kgs)
    areas = areas or (("metadata",) if mode == "epoch" else ("metadata", "state", "sink", "recovery"))
    with c.timer("metadata_load"):
        c.load_known()
        c.output_view()
    data_needed = any(a in areas for a in ("state", "sink", "recovery"))
    plan = None
    exp_box: dict[str, Any] = {}
    if data_needed and "recovery" in areas:
        with c.timer("batch_plan"):
            try:
                plan = plan_recomputation(runner, c.md, set(c.objects.specs))
            except Exception as e:  # noqa: BLE001 - cannot prove recovery correctness: a failure, not a skip
                log.exception("batch plan failed")
                exp_box["error"] = f"{type(e).__name__}: {e}"
        if plan is not None:
            for obj, cols in plan.columns.items():  # compare on the batch plan's columns only
                c.objects.specs[obj] = dataclasses.replace(c.objects.specs[obj], columns=cols)
            c.out.figures["not_checked"] = dict(plan.unchecked)
            c.out.messages.extend(plan.messages)

    def run_model() -> None:
        t0 = time.perf_counter()
        try:
            exp_box["value"] = c.recompute(plan)
        except Exception as e:  # noqa: BLE001 - reported as a failed recovery suite
            log.exception("batch evaluation failed")
            exp_box["error"] = f"{type(e).__name__}: {e}"
        c.out.timings["recompute"] = time.perf_counter() - t0

    worker = None
    if data_needed and plan is not None:
        worker = threading.Thread(target=run_model, name="epochal-batch-eval", daemon=True)
        worker.start()
    checksums: dict[str, dict] = {}
    files: list = []
    if data_needed:
        files = c.data_files()
        spark_out = c.data_pass(files, engine)
        with c.timer("upsert_read"):
            up = c.upsert_pass()
        c.data_datasets(spark_out, up, files)
        for uri, r in c.data_file_records.items():
            checksums[uri] = {"exists": r.get("error") not in ("missing",) and not str(r.get("error") or "").startswith(
                "unreadable"), "bytes": r.get("nbytes"), "sha256": r.get("sha256"), "rows": r.get("nrows")}
            if not checksums[uri]["exists"]:
                checksums[uri] = {"exists": False, "bytes": None, "sha256": None, "rows": None}
    if "metadata" in areas:
        c.metadata_datasets(checksums)
    users_rows: list[dict] = []
    if "sink" in areas and mode != "epoch":
        with c.timer("committed_rows"):
            c.committed_rows_dataset()
        with c.timer("open_tables"):
            rows, ex, msgs = open_table_rows(runner)
        users_rows += rows
        c.out.examples["users_read"] = ex
        c.out.messages.extend(msgs)
    if "recovery" in areas and mode != "epoch":   # driver I/O while the batch evaluation runs in its thread
        with c.timer("runtime_logs"):
            _runtime_logs(runner, c)
    if data_needed:
        exp_per_group = None
        recomputed: set[str] | None = None
        if worker is not None:
            with c.timer("recompute_wait"):
                worker.join()
        if "recovery" in areas:
            if "error" in exp_box:  # cannot prove recovery correctness: that is a failure, not a skip
                for d in ("recovery_key_groups", "recovery_conservation", "group_totals:recovery"):
                    c.out.errors[d] = f"recomputation from the sources failed: {exp_box['error']}"
            else:
                exp = exp_box["value"]
                exp_per_group = exp["per_group"]
                recomputed = set(exp["rec"].objects)
                c.recovery_datasets(exp, files)    # (drill-down re-reads the plan's cached sources)
                with c.timer("dead_letters"):
                    dl_rows, dl_examples = _dead_letters(runner, c.md, exp["rec"], plan.result if plan else None)
                    users_rows += dl_rows
                    c.out.examples.setdefault("users_read", []).extend(dl_examples)
                if plan is not None:
                    with c.timer("source_dead_letters"):
                        sl_rows, sl_examples = _source_dead_letters(runner, c.md, plan.result.prefix)
                    c.out.figures["source_dead_letters"] = {
                        r["object"]: {k: r[k] for k in ("rows_expected", "rows_actual", "only_expected", "only_actual")}
                        for r in sl_rows}
                    users_rows += sl_rows
                    c.out.examples.setdefault("users_read", []).extend(sl_examples)
        c.out.datasets["group_totals"] = c.group_totals(exp_per_group, recomputed)
        if "sink" in areas and mode != "epoch":
            c.out.datasets["users_read"] = pd.DataFrame(users_rows, columns=USERS_READ_COLUMNS)
    if plan is not None:
        plan.release()
    return c.out


def _dead_letters(runner, md, rec, result) -> tuple[list[dict], list[dict]]:
    """The dead letters on disk vs the batch evaluation, per operator the plan counts them for (a window's late and
    unassignable records, a join's ``unique`` violations): row by row (:mod:`pipeline.quality.dead_letter_rows`),
    by count where the rows cannot be derived (:mod:`pipeline.quality.users_read`). Returns rows and examples."""
    expected: dict[str, int] = {}
    for label, n in (getattr(rec, "counts", None) or {}).items():
        uid = label.split(": ", 1)[0]
        expected[uid] = expected.get(uid, 0) + int(n)
    try:
        rows, examples, left = dead_letter_row_diff(runner, md, result, sorted(expected))
    except Exception as e:  # noqa: BLE001 - rows that cannot be compared are a failure, named, never a pass
        log.exception("dead-letter rows could not be compared")
        why = f"{type(e).__name__}: {e}"
        rows = [{"object": f"dead_letters/{uid}", "kind": f"dead letters (rows could not be compared: {why})",
                 "version": checkpoint_dir_name(md.checkpoint_id), "rows_expected": n, "rows_actual": 0, "only_expected": max(1, n),
                 "only_actual": 0} for uid, n in sorted(expected.items())]
        examples, left = [], []
    return rows + dead_letter_rows(runner, md, expected, left), examples


def _source_dead_letters(runner, md, prefix) -> tuple[list[dict], list[dict]]:
    """The sources' dead letters on disk vs the records the runtime's reader rejects in the prefix
    (:mod:`pipeline.quality.source_dead_letters`); a comparison that cannot run is a failure, named."""
    try:
        return source_dead_letter_rows(runner, md, prefix)
    except Exception as e:  # noqa: BLE001 - records that cannot be compared are a failure, named, never a pass
        log.exception("source dead letters could not be compared")
        return [{"object": "dead_letters/source=*", "kind": f"source dead letters (could not be compared: "
                 f"{type(e).__name__}: {e})", "version": checkpoint_dir_name(md.checkpoint_id), "rows_expected": 0,
                 "rows_actual": 0, "only_expected": 1, "only_actual": 0}], []


def _runtime_logs(runner, c) -> None:
    """Dataset ``runtime_logs``: the barrier, round and lag logs checked independently
    (:mod:`pipeline.quality.runtime_logs`); a check that cannot run is a failing row, never a pass."""
    known = {cp.checkpoint_id: cp.metadata for cp in [*c.retained, *c.savepoints, c.snap.completed]}
    try:
        rows, messages, unchecked = runtime_log_rows(runner, c.md, known)
    except Exception as e:  # noqa: BLE001 - named in the failing row
        log.exception("runtime logs could not be checked")
        rows, messages, unchecked = [{"file": "barriers/", "checkpoint": checkpoint_dir_name(c.md.checkpoint_id), "source": "-",
                                      "partition": "-", "logged": "-", "expected": f"{type(e).__name__}: {e}",
                                      "ok": False}], [], 0
    if unchecked:
        messages.append(f"NOT CHECKED independently: {unchecked} runtime log entr(ies) (no source file or no known "
                        "checkpoint to check them against)")
    c.out.datasets["runtime_logs"] = pd.DataFrame(rows, columns=RUNTIME_LOG_COLUMNS)
    c.out.examples["runtime_logs"] = [r for r in rows if not r["ok"]][:5]
    c.out.messages.extend(messages)
