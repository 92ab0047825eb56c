"""Entry points: validate a checkpoint or savepoint on demand, after a restore, or (cheaply) after an epoch.

* :func:`validate_job` - the CLI (``epochal validate``) and the data-quality DAG: every suite;
* :func:`validate_restored` - called by ``JobRunner.restore`` / the restore DAG: every suite on the new
  restore point; raises :class:`~pipeline.exceptions.ValidationError` (fails the task) on failure;
* :func:`validate_after_epoch` - called by the runtime after each completed checkpoint when
  ``PIPELINE_VALIDATE_AFTER_EPOCH=true``: the cheap metadata subset (no Spark, no source reading).

Results are stored next to the checkpoint, ``<checkpoint root>/<job>/validation/<chk-<id>|sp-<id>>/``
(one GX result JSON per suite plus ``summary.json``), and a Data Docs site is built under
``EPOCHAL_DATA_DOCS_DIR`` (default ``$EPOCHAL_HOME/data_docs`` or ``./.epochal/data_docs``).
"""
from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from pipeline.exceptions import CheckpointError, ValidationError
from pipeline.fileio import join_uri
from pipeline.layout import JobLayout, snapshot_name
from pipeline.quality import engine as eng
from pipeline.quality.collect import Snapshot, collect
from pipeline.quality.docs_site import make_offline, publish_site, site_uri
from pipeline.quality.replay import process_objects, replay_checkpoint
from pipeline.quality.result import ExpectationOutcome, SuiteOutcome, ValidationResult
from pipeline.quality.suites import SUITES, SuiteSpec
from pipeline.runtime.driver import progress
from pipeline.runtime.spark.task_requests import RequestSpan

__all__ = ["validate_job", "validate_restored", "validate_after_epoch", "resolve_snapshot", "default_docs_dir",
           "validation_root"]

log = logging.getLogger("epochal.quality")

ALL_AREAS = ("metadata", "state", "sink", "recovery")
DOCS_HISTORY = 5   # validated snapshots shown in Data Docs besides the current one


def _publish_docs(runner, site_dir: str) -> str | None:
    """Offline styling + copy to ``<checkpoint root>/<job>/data_docs/`` (served in the Airflow UI)."""
    make_offline(site_dir)
    target = site_uri(runner.config.checkpoint_uri, runner.job.name)
    publish_site(site_dir, runner.ckpt_fio, target)
    return join_uri(target, "index.html")


def default_docs_dir() -> str:
    if os.environ.get("EPOCHAL_DATA_DOCS_DIR"):
        return os.environ["EPOCHAL_DATA_DOCS_DIR"]
    home = Path(os.environ.get("EPOCHAL_HOME", Path.cwd() / ".epochal"))
    return str((home / "data_docs").resolve())


def validation_root(runner) -> str:
    return JobLayout(runner.job_root).validation()


def resolve_snapshot(runner, checkpoint: str | int | None):
    """The CompletedCheckpoint to validate: latest completed (None), an id, or a savepoint/checkpoint URI."""
    store = runner.coordinator.store
    if checkpoint is None or str(checkpoint).strip() in ("", "latest"):
        cp = store.latest()
        if cp is None:
            raise CheckpointError(f"job {runner.job.name!r} has no completed checkpoint to validate "
                                  f"(under {store.checkpoints_uri})")
    else:
        cp = runner.load_snapshot(str(checkpoint))
    if cp.metadata.job != runner.job.name:
        raise CheckpointError(f"{cp.describe()} belongs to job {cp.metadata.job!r}, not {runner.job.name!r}")
    name = snapshot_name(cp.checkpoint_id, savepoint=cp.is_savepoint)
    return Snapshot(cp, name)


def _clean(v: Any) -> Any:
    """JSON-friendly values (NumPy scalars, NaN)."""
    try:
        import numpy as np
        if isinstance(v, np.generic):
            v = v.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def _outcomes(spec: SuiteSpec, res_dict: Mapping[str, Any], examples: Mapping[str, list]) -> list[ExpectationOutcome]:
    out = []
    for r in res_dict.get("results", []):
        cfg = r.get("expectation_config", {})
        kwargs = {k: v for k, v in (cfg.get("kwargs") or {}).items() if k != "batch_id"}
        result = r.get("result") or {}
        meta = cfg.get("meta") or {}
        exc = (r.get("exception_info") or {})
        success = bool(r.get("success"))
        rows = tuple(_clean(x) for x in (result.get("unexpected_index_list") or [])
                     if isinstance(x, dict)) if not success else ()
        if not success and not rows and result.get("partial_unexpected_list"):
            rows = tuple({"value": _clean(v)} for v in result["partial_unexpected_list"][:5])
        category = meta.get("examples")
        ex = tuple(examples.get(category, [])) if (not success and category) else ()
        out.append(ExpectationOutcome(
            suite=spec.name, expectation=cfg.get("type", "?"), success=success,
            description=cfg.get("description") or "", kwargs=_clean(kwargs),
            observed=_clean(result.get("observed_value")), unexpected_count=result.get("unexpected_count"),
            element_count=result.get("element_count"), unexpected_rows=rows[:20], examples=ex[:5],
            exception=exc.get("exception_message") if exc.get("raised_exception") else None))
    return out


def _write_json(fio, uri: str, doc: Any) -> None:
    fio.write_bytes(uri, (json.dumps(_clean(doc), indent=1, default=str, sort_keys=True) + "\n").encode("utf-8"))


def _previous_results(runner, current: str, limit: int) -> list[tuple[str, str, str, dict]]:
    """Stored GX results of the latest ``limit`` validated snapshots other than ``current``."""
    fio = runner.ckpt_fio
    root = validation_root(runner)
    try:
        names = [n for n in fio.list_dirs(root) if n != current and n.split("-", 1)[-1].isdigit()]
    except Exception:  # noqa: BLE001
        return []
    names.sort(key=lambda n: int(n.split("-", 1)[1]), reverse=True)
    by_name = {s.name: s for s in SUITES}
    out = []
    for n in names[:limit]:
        for fi in fio.list(join_uri(root, n), recursive=False):
            fname = fi.uri.rsplit("/", 1)[-1]
            suite_name = fname[:-5] if fname.endswith(".json") else ""
            if suite_name in by_name:
                try:
                    out.append((suite_name, by_name[suite_name].dataset, n, json.loads(fio.read_bytes(fi.uri))))
                except Exception:  # noqa: BLE001 - skip unreadable history
                    continue
    return out


def validate_job(runner, checkpoint: str | int | None = None, *, mode: str = "full",
                 areas: tuple[str, ...] | None = None, store_results: bool = True, build_docs: bool | None = None,
                 docs_dir: str | None = None, engine: str = "auto", replay: bool | None = None) -> ValidationResult:
    """Run the expectation suites on checkpoint/savepoint ``checkpoint`` (default: the latest completed one).

    ``mode``: ``full`` (every suite), ``restore`` (the same, after a restore) or ``epoch`` (the cheap
    metadata subset: no Spark, no source reading). Results go to ``<job root>/validation/<snapshot>/`` and a
    Data Docs site (``docs_dir``, default :func:`default_docs_dir`) unless disabled.

    ``engine`` summarises the data files: ``spark`` (executors summarise, Spark counts keys across files),
    ``local`` (the same code in a driver thread pool) or ``auto``: Spark when a session is already running
    or the snapshot's data files exceed ``EPOCHAL_QUALITY_LOCAL_MAX_BYTES`` (256 MiB), else local.

    ``replay``: check **determinism under replay** (:mod:`pipeline.quality.replay`: checkpoint n-1 restored in a
    scratch location, epoch n re-run, state and staged output compared) for the objects the batch plan cannot
    model because of a ``process`` operator. ``None`` (default): on in ``full`` validations of a job that has
    ``process`` operators (costs one epoch), off otherwise (a restore point has no processed epoch to replay);
    ``True`` forces it, ``False`` skips it (those objects are then reported as not checked).

    ``figures["s3_requests"]``: the validation's S3 requests up to its summary's write (that one PUT excluded),
    the driver's and the executors' (:class:`~pipeline.runtime.spark.task_requests.RequestSpan`; a Spark session
    started by the validation is counted from its first task).
    

    Over 8 parameters: the CLI's validate options, all keywords with documented defaults."""
    with RequestSpan(session=lambda: runner.ctx.spark_session) as span:
        return _validate_job(runner, span, checkpoint, mode=mode, areas=areas, store_results=store_results,
                             build_docs=build_docs, docs_dir=docs_dir, engine=engine, replay=replay)


def _validate_job(runner, span: RequestSpan, checkpoint: str | int | None, *, mode: str,
                  areas: tuple[str, ...] | None, store_results: bool, build_docs: bool | None,
                  docs_dir: str | None, engine: str, replay: bool | None) -> ValidationResult:
    """Over 8 parameters: :func:`validate_job`'s options passed through with its request span."""
    t0 = time.perf_counter()
    eng.warm_up()
    snap = resolve_snapshot(runner, checkpoint)
    if areas is None:
        areas = ("metadata",) if mode == "epoch" else ALL_AREAS
    collected = collect(runner, snap, mode="epoch" if mode == "epoch" else "full", areas=areas, engine=engine)
    replayed = _replay(runner, snap, collected, mode, areas, replay)
    progress.step("running the Great Expectations suites")
    t_ge = time.perf_counter()
    gx = eng.engine()
    collected.timings["gx_setup"] = time.perf_counter() - t_ge
    run_time = datetime.now(timezone.utc).isoformat()
    out_dir = join_uri(validation_root(runner), snap.name)
    if mode == "epoch":  # the cheap subset never overwrites a full validation's results
        out_dir = join_uri(out_dir, "epoch")
    suites: list[SuiteOutcome] = []
    docs_inputs: list[tuple[str, str, str, dict]] = []
    t_v = time.perf_counter()
    specs = [s for s in SUITES if s.area in areas and (mode != "epoch" or s.per_epoch)
             and (s.name != REPLAY_SUITE or replayed)]
    for spec in specs:
        skip_key = f"{spec.dataset}:{spec.area}"
        error = collected.errors.get(skip_key) or collected.errors.get(spec.dataset)
        if error is not None:
            suites.append(SuiteOutcome(spec.name, spec.area, spec.dataset, False, 0, skipped="not run", error=error))
            continue
        reason = collected.skipped.get(skip_key) or collected.skipped.get(spec.dataset)
        df = collected.datasets.get(spec.dataset)
        if reason is None and df is None:
            reason = f"dataset {spec.dataset} was not collected"
        if reason is not None or df is None:
            suites.append(SuiteOutcome(spec.name, spec.area, spec.dataset, True, 0, skipped=reason))
            continue
        res = gx.validate(spec, df)
        doc = res.to_json_dict()
        doc.setdefault("meta", {})["run_id"] = {"run_name": snap.name, "run_time": run_time}
        doc["meta"]["epochal"] = {"job": runner.job.name, "snapshot": snap.name, "mode": mode,
                                  "location": snap.location, "dataset": spec.dataset}
        uri = join_uri(out_dir, f"{spec.name}.json") if store_results else None
        if uri is not None:
            _write_json(runner.ckpt_fio, uri, doc)
        docs_inputs.append((spec.name, spec.dataset, snap.name, doc))
        outcomes = _outcomes(spec, doc, collected.examples)
        suites.append(SuiteOutcome(spec.name, spec.area, spec.dataset, bool(res.success), int(len(df)),
                                   tuple(outcomes), uri))
    collected.timings["gx_validate"] = time.perf_counter() - t_v
    success = all(s.success for s in suites)
    summary_uri = join_uri(out_dir, "summary.json") if store_results else None
    docs_uri = None
    if build_docs is None:
        build_docs = mode != "epoch"
    if build_docs:
        progress.step("building Data Docs")
        t_d = time.perf_counter()
        try:
            history = _previous_results(runner, snap.name, DOCS_HISTORY) if store_results else []
            site_dir = docs_dir or os.path.join(default_docs_dir(), runner.job.name)  # one site per job
            docs_uri = eng.build_data_docs(site_dir, docs_inputs + history)
            docs_uri = _publish_docs(runner, site_dir) or docs_uri
        except Exception as e:  # noqa: BLE001 - docs are a view; never fail a validation because of them
            log.warning("could not build Data Docs: %s", e)
            collected.messages.append(f"Data Docs not built: {e}")
        collected.timings["data_docs"] = time.perf_counter() - t_d
    md = snap.md
    collected.figures["s3_requests"] = span.requests().to_dict()
    result = ValidationResult(
        job=runner.job.name, snapshot=snap.name, checkpoint_id=md.checkpoint_id, epoch=md.epoch,
        location=snap.location, mode=mode, success=success, suites=tuple(suites),
        duration_s=time.perf_counter() - t0, timings=dict(collected.timings), figures=_clean(collected.figures),
        messages=tuple(collected.messages), result_uri=summary_uri, docs_uri=docs_uri)
    if summary_uri is not None:
        _write_json(runner.ckpt_fio, summary_uri, result.to_dict())
    # the caller shows the summary (the CLI prints it, restore and the Airflow tasks echo it): logged once
    log.debug("%s", result.summary())
    return result


REPLAY_SUITE = "epochal_replay_determinism"
_NOT_CHECKED = "NOT CHECKED against the batch evaluation: "


def _replay(runner, snap, collected, mode: str, areas: tuple[str, ...], replay: bool | None) -> bool:
    """Determinism under replay for the process-dependent objects; rewrites their NOT CHECKED messages and
    ``figures["not_checked"]`` with the replay's result, and puts the ``replay`` dataset (one row per object,
    validated by the GX suite :data:`REPLAY_SUITE`, so it is stored and in Data Docs like every suite) into
    ``collected``. False when the job has no process operator or the replay is off (the messages say so)."""
    tainted = process_objects(runner.job)
    if not tainted or "recovery" not in areas:
        return False
    if replay is None and mode == "restore":
        collected.messages.append("NOT CHECKED by replay: the job's process operators (a restore point has no "
                                  "processed epoch to replay; the next checkpoint's validation replays it)")
        return False
    if replay is None:
        replay = mode == "full"
    if not replay:
        collected.messages.append("NOT CHECKED by replay: the job's process operators (replay disabled; "
                                  "`epochal validate --replay` checks determinism under replay)")
        return False

    def is_tainted(obj: str) -> bool:
        return any(obj == t or obj.startswith(t + "/") for t in tainted)

    progress.step("replaying the validated epoch (determinism of process operators)")
    t0 = time.perf_counter()
    res = replay_checkpoint(runner, snap.completed)
    collected.timings["replay"] = time.perf_counter() - t0
    by_obj = {o.obj: o for o in res.objects}
    head = f"epoch {res.epoch} replayed from chk-{res.parent_id}"
    not_checked = dict(collected.figures.get("not_checked") or {})
    messages = []
    for m in dict.fromkeys(collected.messages):   # in order, once (the plan's messages may come twice)
        if m == "not checked: ProcessNode nodes are not modelled yet" and res.ran:
            continue
        obj, _, why = m[len(_NOT_CHECKED):].partition(": ") if m.startswith(_NOT_CHECKED) else ("", "", "")
        if not obj or not is_tainted(obj):
            messages.append(m)
            continue
        o = by_obj.get(obj)
        if o is None and not obj.startswith("sink/"):
            same = [x for x in res.objects if x.obj.startswith(obj + "/")]
            o = same[0] if len(same) == 1 else None
        if o is not None:
            not_checked.pop(obj, None)
            verdict = "identical" if o.equal else "DIFFERENT"
            messages.append(f"checked by replay instead of the batch evaluation: {obj}: {verdict} ({head})")
        else:
            reason = "; ".join(res.not_checked.values()) or "the replay did not produce this object"
            messages.append(f"NOT CHECKED: {obj}: batch evaluation: {why}; replay: {reason}")
    collected.messages[:] = messages + res.messages()
    collected.figures["not_checked"] = not_checked
    collected.figures["replay"] = {"checkpoint": res.checkpoint, "parent_id": res.parent_id,
                                   "objects": {o.obj: {"rows": o.rows_checkpoint, "only_checkpoint": o.only_checkpoint,
                                                       "only_replayed": o.only_replayed} for o in res.objects},
                                   "not_checked": dict(res.not_checked), "duration_s": res.duration_s}
    if not res.ran:
        collected.skipped["replay"] = "not checked: " + "; ".join(res.not_checked.values())
        return True
    collected.datasets["replay"] = pd.DataFrame(
        [{"object": o.obj, "rows_checkpoint": o.rows_checkpoint, "rows_replayed": o.rows_replayed,
          "only_checkpoint": o.only_checkpoint, "only_replayed": o.only_replayed} for o in res.objects],
        columns=["object", "rows_checkpoint", "rows_replayed", "only_checkpoint", "only_replayed"])
    collected.examples["replay_diff"] = [
        {"object": o.obj, "side": side, **row}
        for o in res.objects if not o.equal
        for side, rows in (("checkpoint", o.examples_checkpoint), ("replay", o.examples_replayed)) for row in rows]
    return True


def validate_restored(runner, result: Mapping[str, Any], *, docs_dir: str | None = None) -> ValidationResult:
    """Validate the restore point a ``JobRunner.restore`` just created (``result`` is its return value; its
    ``validate`` entry, ``full`` by default or ``cheap``, chooses the suites).

    Raises ValidationError (with the summary) when a suite fails, so the restore task fails.
    """
    cid = result.get("checkpoint_id") if isinstance(result, Mapping) else None
    level = str(result.get("validate") or "full") if isinstance(result, Mapping) else "full"
    # cheap: the restored files, lineage, commits, state and sink keys - no source read, no batch plan
    areas = ("metadata", "state", "sink") if level == "cheap" else None
    v = validate_job(runner, None if cid is None else str(cid), mode="restore", areas=areas, docs_dir=docs_dir)
    runner.echo(v.summary())
    if not v.success:
        raise ValidationError(f"restore of job {runner.job.name!r} from {result.get('from')} failed validation:\n"
                              + v.summary())
    return v


def validate_after_epoch(runner, completed_metadata, *, raise_on_failure: bool = True) -> ValidationResult | None:
    """The cheap per-epoch subset on a just-completed checkpoint, if ``PIPELINE_VALIDATE_AFTER_EPOCH``.

    ``completed_metadata``: the CheckpointMetadata (or CompletedCheckpoint) of the new checkpoint.
    Returns None when disabled. Metadata suites only: the checkpoint's files exist with their sizes and
    checksums, barriers/positions do not go back from the parent, its sink commits match what it staged.
    """
    if not getattr(runner.config, "validate_after_epoch", False):
        return None
    md = getattr(completed_metadata, "metadata", completed_metadata)
    if md.kind == "checkpoint":
        ref = str(md.checkpoint_id)
    else:  # a savepoint: only a CompletedCheckpoint says where it is
        location: str | None = getattr(completed_metadata, "location", None)
        if location is None:
            return None
        ref = location
    v = validate_job(runner, ref, mode="epoch")
    if v.success:
        runner.echo(f"validation of {v.snapshot}: {v.evaluated} expectations passed ({v.duration_s:.1f} s)")
    else:
        runner.echo(v.summary())
        if raise_on_failure:
            raise ValidationError(f"checkpoint {md.checkpoint_id} of job {runner.job.name!r} failed the per-epoch "
                                  "validation:\n" + v.summary())
    return v
