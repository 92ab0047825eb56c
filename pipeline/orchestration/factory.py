"""DAG factories: the epoch DAG of a job, its manual savepoint and restore DAGs, and an on-demand
data-quality DAG. DAG files in ``dags/`` stay thin: they call one of these and end with ``dag.test()``.

Parse-time work is limited to reading the ``PIPELINE_*`` environment (epoch length, sink URIs for the
Assets) and building the job graph in memory: no I/O, no Spark, no S3. Everything else happens in tasks.

Defaults can be set per deployment with environment variables (all optional):

==================================  =====================================================================
``EPOCHAL_START_DATE``              first data interval of epoch DAGs (ISO-8601 UTC; floored to an epoch
                                    boundary). Default ``2026-01-01T00:00:00Z``.
``EPOCHAL_END_DATE``               optional: the scheduler creates no run for intervals starting after it
                                    (backfills still can), e.g. for a job being retired.
``EPOCHAL_CATCHUP``                 ``true`` lets the scheduler create a run for every past interval since
                                    the start date (default ``false``: the first run catches the job up
                                    itself, one checkpoint per epoch).
``EPOCHAL_DAG_RETRIES``             task retries (default 2)
``EPOCHAL_DAG_RETRY_DELAY_SECONDS`` delay between retries (default 30)
``EPOCHAL_POKE_SECONDS``            how often a waiting ``trigger`` checks again (default: a tenth of the
                                    epoch, 2-15 s: 3 s for 30-s epochs); it also wakes when the epoch's
                                    allowed lateness has just passed
``EPOCHAL_TRIGGER_WAIT_SECONDS``    how long ``trigger`` polls in-process before rescheduling (default 60)
``EPOCHAL_TRIGGER_TIMEOUT_SECONDS`` how long ``trigger`` may wait (default max(1 h, 3 epochs + lateness))
``EPOCHAL_FUSED_EPOCH``            ``false``: epoch DAGs are ``trigger >> process >> commit >> validate`` (four
                                    tasks). Default ``true``: ``trigger >> epoch`` (process + commit + validate
                                    in one task; see :func:`build_epoch_dag`).
``EPOCHAL_SHARED_CONNECT_SESSION``  on Spark Connect, the epoch DAG's tasks of a job attach to one server-side
                                    session, whose Python workers stay warm (default ``true``).
==================================  =====================================================================

Lazy imports: Airflow (``airflow.sdk``, its operators) and the task modules are imported inside the factory
functions and task callables. ``pipeline.orchestration`` then imports without Airflow installed, and the
scheduler's DAG-file parse pays only for what building the graph needs.

Over 400 lines: one builder per DAG kind (epochs, savepoint, restore, quality), sharing the task wiring.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pipeline import settings
from pipeline.master import connect_url, shared_session_url
from pipeline.orchestration.exclusion import (
    ACTIVE_TI_STATES,
    EPOCH_RUNNER_TASKS,
    EPOCH_WORK_TASKS,
    PENDING_RUN_STATES,
    WAITING_TRIGGER_STATES,
)
from pipeline.orchestration.keepup import lag_report, trigger_sleep
from pipeline.orchestration.names import epoch_dag_id, quality_dag_id, restore_dag_id, savepoint_dag_id

if TYPE_CHECKING:  # pragma: no cover
    from airflow.sdk import DAG, Asset

__all__ = ["build_epoch_dag", "build_savepoint_dag", "build_restore_dag", "build_quality_dag", "sink_asset",
           "epoch_dag_id", "savepoint_dag_id", "restore_dag_id", "quality_dag_id", "DEFAULT_START_DATE",
           "ACTIVE_TI_STATES"]

log = logging.getLogger("epochal.airflow")

DEFAULT_START_DATE = "2026-01-01T00:00:00Z"


def _env_bool(name: str, default: bool) -> bool:
    v = (settings.raw(name) or "").strip().lower()
    return default if not v else v in ("1", "true", "yes", "on")


def _env_float(name: str, default: float) -> float:
    v = (settings.raw(name) or "").strip()
    try:
        return float(v) if v else default
    except ValueError:
        from pipeline.exceptions import ConfigError
        raise ConfigError(f"{name}={v!r}: expected a number") from None


def _parse_start(value: str | datetime, epoch_seconds: int) -> datetime:
    if isinstance(value, datetime):
        dt = value
    else:
        dt = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    ts = int(dt.timestamp())
    return datetime.fromtimestamp(ts - ts % epoch_seconds, tz=UTC)  # an epoch boundary


def sink_asset(job: str, table: str, config=None) -> Asset:
    """The Airflow Asset of a sink table: ``name`` ``epochal/<job>/<table>`` (stable, for downstream
    ``schedule=[...]``), ``uri`` the table's location under ``PIPELINE_SINK_URI``."""
    from airflow.sdk import Asset

    from pipeline.fileio import join_uri
    from pipeline.orchestration.settings import load_pipeline_config
    cfg = config or load_pipeline_config()
    return Asset(name=f"epochal/{job}/{table}", uri=join_uri(cfg.sink_uri, job, table), group="epochal",
                 extra={"job": job, "table": table})


def _run_of(context: Mapping[str, Any], epoch_seconds: int):
    from pipeline.orchestration.epoch_runs import EpochRun, epoch_of_events, epoch_of_interval
    dr = context["dag_run"]
    ti = context["ti"]
    rt = getattr(dr, "run_type", None)
    if str(getattr(rt, "value", rt)) == "asset_triggered":  # upstream commits: the epoch of the newest event
        events = context.get("triggering_asset_events") or {}
        times = [getattr(e, "timestamp", None) for evs in events.values() for e in evs]
        epoch = epoch_of_events(epoch_seconds, [t for t in times if t is not None], fallback=dr.run_after)
    else:
        end = getattr(dr, "data_interval_end", None)
        epoch = epoch_of_interval(epoch_seconds, end, fallback=getattr(dr, "logical_date", None) or dr.run_after)
    return EpochRun(dag_id=dr.dag_id, run_id=dr.run_id, epoch=epoch, clear_number=int(getattr(dr, "clear_number", 0) or 0),
                    try_number=int(getattr(ti, "try_number", 1) or 1),
                    run_type=str(getattr(rt, "value", rt) or "manual"))


def _earlier_backfill_run(ti) -> tuple[str, str] | None:
    """``(run_id, state)`` of the newest queued or running backfill run of an interval before this run's (the
    previous run of each state: two look-ups, whatever the DAG's history), None if there is none."""
    for state in ("running", "queued"):
        prev = ti.get_previous_dagrun(state=state)
        if prev is not None and str(getattr(prev.run_type, "value", prev.run_type)) == "backfill":
            return str(prev.run_id), state
    return None


def _orchestrator(job_name: str, *, epoch_session: bool = False):
    """Resolve S3 settings (connection or env) into this task process, then build the orchestrator.

    ``epoch_session``: a task of the epoch DAG. On Spark Connect its tasks attach to one server-side session per
    job (``EPOCHAL_SHARED_CONNECT_SESSION``, on by default; :func:`pipeline.master.shared_session_url`): they run one
    at a time, and the session's Python workers stay warm between epochs. Savepoint, restore and quality tasks keep
    sessions of their own (a restore's validation may run while the epochs go on)."""
    from pipeline.orchestration.settings import apply_s3_settings, load_pipeline_config, resolve_s3_settings
    from pipeline.orchestration.tasks import Orchestrator
    settings.environ().setdefault("EPOCHAL_JVM_LOGS", "python")  # Spark's WARN lines as warnings, not stderr ERRORs
    s3 = resolve_s3_settings()
    apply_s3_settings(s3)
    log.info("%s", s3.describe())
    cfg = load_pipeline_config()
    url = connect_url(cfg.spark_master)
    if epoch_session and url is not None and _env_bool(SHARED_SESSION_ENV, True):
        # a new session every 30 min: a Spark Connect server closes a session after 60 idle minutes by default and
        # then refuses its id for good (closed-session tombstones), so an id must never outlive an idle timeout
        window = int(time.time() // SHARED_SESSION_WINDOW_S)
        cfg = dataclasses.replace(cfg, spark_master=shared_session_url(
            url, f"epochs|{job_name}|{cfg.checkpoint_uri}|{window}"))
    return Orchestrator(job_name, cfg, echo=lambda m: log.info("%s", m))


def approval_enabled(env_name: str, explicit: bool | None) -> bool:
    """Optional human approval (off by default; see :mod:`pipeline.orchestration.approval`)."""
    if explicit is not None:
        return explicit
    return _env_bool(env_name, False)


FUSED_ENV = "EPOCHAL_FUSED_EPOCH"
SHARED_SESSION_ENV = "EPOCHAL_SHARED_CONNECT_SESSION"
SHARED_SESSION_WINDOW_S = 1800  # below the Connect server's idle timeout (spark.connect.session.manager.defaultSessionTimeout, 60 min)
APPROVE_RESTORE_ENV = "EPOCHAL_APPROVE_RESTORE"
APPROVE_REWIND_ENV = "EPOCHAL_APPROVE_REWIND"


@contextlib.contextmanager
def _fail_fast_on_user_errors(*extra: type[BaseException]):
    """A user error (bad params, a wrong checkpoint id or URI, incompatible state) fails the task once with a
    clear message (``AirflowFailException``: no retry); anything else propagates and is retried."""
    from airflow.sdk.exceptions import AirflowFailException

    from pipeline.exceptions import ConfigError, IncompatibleStateError
    try:
        yield
    except (ConfigError, IncompatibleStateError, *extra) as e:  # type: ignore[misc]
        log.error("epochal: %s (a user error: not retried)", e)
        raise AirflowFailException(f"epochal: {e}") from None


def _ops_busy(ti, job_name: str) -> int:
    """Savepoint/restore DAG runs of the job that are queued or running (they go first) - except a restore run that
    is only validating: its ``validate`` task starts once the restore succeeded, and the epoch runs go on from the
    restored checkpoint meanwhile (the proof never holds them back; docs/quality.md "After a restore")."""
    from pipeline.orchestration.exclusion import restore_runs_holding
    restores = int(ti.get_dr_count(dag_id=restore_dag_id(job_name), states=PENDING_RUN_STATES))
    validating = int(ti.get_ti_count(dag_id=restore_dag_id(job_name), task_ids=["validate"],
                                     states=ACTIVE_TI_STATES)) if restores else 0
    return int(ti.get_dr_count(dag_id=savepoint_dag_id(job_name), states=PENDING_RUN_STATES)) + \
        restore_runs_holding(restores, validating)


def _epoch_activity(ti, job_name: str):
    from pipeline.orchestration.exclusion import EpochActivity
    dag_id = epoch_dag_id(job_name)
    return EpochActivity(
        running_runs=int(ti.get_dr_count(dag_id=dag_id, states=["running"])),
        waiting_triggers=int(ti.get_ti_count(dag_id=dag_id, task_ids=["trigger"], states=WAITING_TRIGGER_STATES)),
        active_work_tasks=int(ti.get_ti_count(dag_id=dag_id, task_ids=EPOCH_WORK_TASKS, states=ACTIVE_TI_STATES)))


def _operation_wait_reason(ti, job_name: str, other_dag: str, other_task: str) -> str | None:
    from pipeline.orchestration.exclusion import operation_wait_reason
    other = int(ti.get_ti_count(dag_id=other_dag, task_ids=[other_task], states=ACTIVE_TI_STATES))
    return operation_wait_reason(job_name, _epoch_activity(ti, job_name), other_operation_tasks=other)


def _wait_until_job_free(ti, job_name: str, other_dag: str, other_task: str, poke: float, timeout: float) -> None:
    """Right before a savepoint/restore touches the job: wait (polling) while an epoch run holds it."""
    deadline = time.monotonic() + timeout
    while True:
        reason = _operation_wait_reason(ti, job_name, other_dag, other_task)
        if reason is None:
            return
        log.info("job %s: waiting before the first side effect: %s; checking again every %.0f s, for up to %.0f s",
                 job_name, reason, poke, timeout)
        if time.monotonic() > deadline:
            from pipeline.exceptions import CheckpointError
            raise CheckpointError(f"job {job_name}: still busy after {timeout:.0f} s: {reason}")
        time.sleep(poke)


def default_poke_seconds(epoch_seconds: int) -> float:
    """A waiting ``trigger``'s poke interval unless ``EPOCHAL_POKE_SECONDS`` says otherwise: a tenth of the epoch,
    between 2 and 15 s (a poke lists the sources; a 15-s poke would be half of a 30-s epoch)."""
    return _env_float("EPOCHAL_POKE_SECONDS", min(15.0, max(2.0, epoch_seconds / 10.0)))


def _log_lag(job_name: str, epoch: int, epoch_seconds: int, lateness: float) -> dict[str, Any]:
    """Say in the task log whether the job keeps up (INFO) or falls behind, and by how much (WARNING)."""
    lag = lag_report(job_name, epoch, epoch_seconds, time.time(), lateness)
    log.log(logging.WARNING if lag.behind else logging.INFO, "%s", lag.message())
    return lag.to_dict()


def _default_args(retries: int | None, retry_delay: timedelta | None) -> dict[str, Any]:
    return {
        "owner": "epochal",
        "retries": int(_env_float("EPOCHAL_DAG_RETRIES", 2)) if retries is None else retries,
        "retry_delay": retry_delay if retry_delay is not None
        else timedelta(seconds=_env_float("EPOCHAL_DAG_RETRY_DELAY_SECONDS", 30)),
        "depends_on_past": False,  # ordering is enforced by the trigger sensor (works for backfills too)
    }


def build_epoch_dag(job_name: str, *, dag_id: str | None = None, doc_md: str | None = None,
                    tags: Sequence[str] = (), start_date: str | datetime | None = None,
                    end_date: str | datetime | None = None, catchup: bool | None = None,
                    retries: int | None = None, retry_delay: timedelta | None = None,
                    poke_interval: float | None = None, trigger_timeout: float | None = None,
                    config=None, approve_rewind: bool | None = None, fused: bool | None = None,
                    upstream: Sequence[Asset] = ()) -> DAG:
    """The epoch DAG of ``job_name``: one run per data interval = one checkpointed epoch.

    Schedule = the epoch length (``PIPELINE_EPOCH_SECONDS``), data intervals aligned to epoch boundaries,
    so the run for ``[start, end)`` processes epoch ``n`` whose barrier is ``end``. Tasks (default, ``fused``):
    ``trigger >> epoch``, where the one ``epoch`` task does process, commit (with the job's sink tables as
    outlets: Assets) and validate in one process - one task start, one Spark (Connect) session and one
    scheduler hop after the trigger instead of three, which is what keeps up with 30-s epochs (docs/airflow.md,
    "Keeping up with short epochs"). The trigger stays a task of its own: it is the sensor that waits, and what
    keeps savepoints and restores out of a started epoch. ``max_active_runs=1`` and the ``trigger`` sensor
    keep epochs in order whatever created the runs (scheduler, manual trigger, backfill).

    ``fused=False`` (or ``EPOCHAL_FUSED_EPOCH=false``): ``trigger >> process >> commit >> validate`` (see
    :mod:`pipeline.orchestration.tasks`), ``commit`` with the Assets as outlets. Either way the run's last step
    logs whether the job keeps up with its epochs or falls behind, and by how much
    (:mod:`pipeline.orchestration.keepup`).

    ``upstream``: the sink Assets of the jobs whose tables this job reads as lake sources
    (:func:`sink_asset`); the DAG is then scheduled on their events (Airflow's data-aware scheduling) instead
    of the clock: each run processes every epoch that is ready when an upstream job commits, and a run for an
    epoch already processed finds the job up to date (it never rewinds; docs/how-to/lake-sources.md).

    Over 80 lines: one DAG definition, task by task, as Airflow reads it; Over 8 parameters: Airflow's DAG arguments
    (schedule, dates, catchup, retries, pools, ...), all keywords."""
    from airflow.sdk import DAG, DeltaDataIntervalTimetable, PokeReturnValue, task
    from airflow.sdk.exceptions import AirflowSkipException

    from pipeline.jobs import get_job
    from pipeline.orchestration.settings import load_pipeline_config
    cfg = config or load_pipeline_config()
    job = get_job(job_name)
    E = cfg.epoch_seconds
    dag_id = dag_id or epoch_dag_id(job.name)
    assets = {t: sink_asset(job.name, t, cfg) for t in job.sink_tables()}
    start = _parse_start(start_date or settings.raw("EPOCHAL_START_DATE") or DEFAULT_START_DATE, E)
    end_raw = end_date or settings.raw("EPOCHAL_END_DATE") or None
    end = _parse_start(end_raw, E) if end_raw else None
    catchup = _env_bool("EPOCHAL_CATCHUP", False) if catchup is None else catchup
    fused = _env_bool(FUSED_ENV, True) if fused is None else fused
    poke = poke_interval if poke_interval is not None else default_poke_seconds(E)
    lateness = float(cfg.allowed_lateness_seconds)
    wait_window = _env_float("EPOCHAL_TRIGGER_WAIT_SECONDS", 60)
    timeout = trigger_timeout if trigger_timeout is not None else _env_float(
        "EPOCHAL_TRIGGER_TIMEOUT_SECONDS", max(3600.0, 3.0 * E + cfg.allowed_lateness_seconds))

    with DAG(
        dag_id=dag_id,
        schedule=list(upstream) if upstream else DeltaDataIntervalTimetable(timedelta(seconds=E)),
        start_date=start,
        end_date=end,
        catchup=catchup,
        max_active_runs=1,
        default_args=_default_args(retries, retry_delay),
        tags=list(dict.fromkeys(["epochal", f"job:{job.name}", "epochs", *tags])),
        doc_md=doc_md,
        description=(f"Epochal: job {job.name}'s ready epochs when {', '.join(a.name for a in upstream)} commit"
                     if upstream else f"Epochal: one checkpointed epoch of job {job.name} per {E}s data interval"),
    ) as dag:

        @task.sensor(task_id="trigger", mode="reschedule", poke_interval=poke, timeout=timeout,
                     retries=max(5, int(_default_args(retries, retry_delay)["retries"])),
                     doc_md="Wait for the previous interval and for the epoch's data, then log barrier n "
                            "write-ahead and report the head checkpoint.")
        def trigger(**context):
            # Poll in-process for up to EPOCHAL_TRIGGER_WAIT_SECONDS before giving the worker slot back
            # (reschedule): waits are short in the common case, and each reschedule is a scheduler round
            # trip (on SQLite under load, also a chance for a spurious "state changed externally" retry,
            # hence the extra retries of this idempotent task).
            from pipeline.exceptions import JobStoppedError
            from pipeline.orchestration.epoch_runs import wait_reason
            run = _run_of(context, E)
            ti = context["ti"]
            deadline = time.monotonic() + wait_window
            orch = None
            while True:
                prev = ti.get_previous_dagrun()
                prev_state = str(getattr(prev.state, "value", prev.state)) if prev is not None else None
                prev_type = str(getattr(prev.run_type, "value", prev.run_type)) if prev is not None else None
                active = ti.get_ti_count(dag_id=run.dag_id, task_ids=EPOCH_RUNNER_TASKS, states=ACTIVE_TI_STATES)
                reason = wait_reason(previous_state=prev_state, previous_run_type=prev_type,
                                     this_run_type=run.run_type, active_process_tasks=int(active),
                                     active_operations=_ops_busy(ti, job.name),
                                     earlier_backfill_run=_earlier_backfill_run(ti))
                if reason:
                    log.info("epoch %s: waiting: %s", run.epoch, reason)
                else:
                    try:
                        with _fail_fast_on_user_errors():
                            orch = orch or _orchestrator(job_name, epoch_session=True)
                            res = orch.trigger(run)
                    except JobStoppedError as e:
                        raise AirflowSkipException(str(e)) from None
                    if res is not None:
                        if _ops_busy(ti, job.name):  # an operation arrived meanwhile: it goes first
                            log.info("epoch %s: waiting: a savepoint or restore of this job was just triggered",
                                     run.epoch)
                        else:
                            return PokeReturnValue(is_done=True, xcom_value=res.to_dict())
                # waiting for the data: wake as soon as the allowed lateness has passed, not a poke later
                nap = poke if reason else trigger_sleep(run.epoch, E, lateness, time.time(), poke)
                if time.monotonic() + nap > deadline:
                    return PokeReturnValue(is_done=False)
                time.sleep(nap)

        @task(task_id="process", doc_md="Process epoch n (one checkpoint per epoch; a re-run rewinds).")
        def process(triggered: dict, **context):
            orch = _orchestrator(job_name, epoch_session=True)
            return _process_step(orch, triggered, context, E).to_dict()

        @task(task_id="commit", outlets=list(assets.values()),
              doc_md="Commit the checkpoint's sink transactions (idempotent) and emit the sink Assets.")
        def commit(processed: dict, **context):
            orch = _orchestrator(job_name, epoch_session=True)
            return _commit_step(orch, int(processed["checkpoint_id"]), context, assets).to_dict()

        @task(task_id="validate", doc_md="Verify the checkpoint files, positions and the sink lineage.")
        def validate(committed: dict, **context):
            orch = _orchestrator(job_name, epoch_session=True)
            validated = _validate_step(orch, int(committed["checkpoint_id"]))
            return {**validated.to_dict(), "keepup": _log_lag(job.name, int(committed["epoch"]), E, lateness)}

        @task(task_id="epoch", outlets=list(assets.values()),
              doc_md="Process epoch n, commit its sink transactions (emitting the sink Assets) and verify the "
                     "checkpoint, in one task (the fused epoch DAG: one task start and one scheduler hop "
                     "after the trigger instead of three).")
        def epoch(triggered: dict, **context):
            orch = _orchestrator(job_name, epoch_session=True)  # one Spark session, S3 client and job graph
            processed = _process_step(orch, triggered, context, E)
            here = processed.checkpoint_id in processed.completed  # this try's rounds committed its sinks
            committed = _commit_step(orch, processed.checkpoint_id, context, assets,
                                     collect_garbage=not here, committed_here=here)
            validated = _validate_step(orch, committed.checkpoint_id)
            return {"process": processed.to_dict(), "commit": committed.to_dict(), "validate": validated.to_dict(),
                    "keepup": _log_lag(job.name, committed.epoch, E, lateness)}

        triggered = trigger()
        processed = epoch(triggered) if fused else process(triggered)
        if approval_enabled(APPROVE_REWIND_ENV, approve_rewind):
            from pipeline.orchestration.approval import rewind_approval
            triggered >> rewind_approval(job.name) >> processed
        if not fused:
            validate(commit(processed))
    return dag


def _process_step(orch, triggered: dict | None, context: Mapping[str, Any], epoch_seconds: int):
    """The ``process`` step (its own task, or the first step of the fused ``epoch`` task)."""
    from airflow.sdk.exceptions import AirflowSkipException

    from pipeline.exceptions import JobStoppedError
    run = _run_of(context, epoch_seconds)
    others = int(context["ti"].get_dr_count(dag_id=run.dag_id, states=["queued", "running"])) > 1
    try:
        with _fail_fast_on_user_errors():
            return orch.process(run, head_before=(triggered or {}).get("head_before"), others_active=others)
    except JobStoppedError as e:
        raise AirflowSkipException(str(e)) from None


def _commit_step(orch, checkpoint_id: int, context: Mapping[str, Any], assets: Mapping[str, Asset], *,
                 collect_garbage: bool = True, committed_here: bool = False):
    """The ``commit`` step: notifyCheckpointComplete, then one event per sink Asset naming the checkpoint."""
    res = orch.commit(checkpoint_id, collect_garbage=collect_garbage, committed_here=committed_here)
    events = context.get("outlet_events")
    if events is not None:
        for table, info in res.tables.items():
            if table in assets:
                events[assets[table]].extra = {"job": orch.job_name, "table": table,
                                               "checkpoint_id": res.checkpoint_id, "epoch": res.epoch,
                                               "rows_in_checkpoint": info.get("rows_committed_in_checkpoint"),
                                               "format": info.get("format"),
                                               "table_version": info.get("table_version")}
    return res


def _validate_step(orch, checkpoint_id: int):
    """The ``validate`` step: a checkpoint that fails verification fails the task."""
    from pipeline.exceptions import ValidationError
    res = orch.validate(checkpoint_id)
    if not res.success:
        raise ValidationError(f"checkpoint {res.checkpoint_id} of job {orch.job_name!r} failed validation: "
                              + "; ".join(res.problems[:5]))
    return res


def _savepoint_params(job_name: str, params: Mapping[str, Any]) -> str | None:
    """The savepoint DAG's params, checked without touching the job: the target's form and its containment
    (``PIPELINE_SAVEPOINT_PREFIXES``, symlinks resolved). ConfigError on a user error."""
    from pipeline.inputs import check_savepoint_target
    target = check_savepoint_target(params.get("target"))
    if target is not None:
        from pipeline.orchestration.settings import load_pipeline_config
        from pipeline.runtime.driver.savepoints import check_target
        check_target(target, load_pipeline_config(), job_name)
    return target


def _restore_params(job_name: str, params: Mapping[str, Any]) -> tuple[str, int | None]:
    """The restore DAG's params, checked without touching the job: ``from`` and ``parallelism``."""
    from pipeline.inputs import check_parallelism, check_snapshot_ref
    return check_snapshot_ref(params.get("from")), check_parallelism(params.get("parallelism"))


def _wait_for_epoch_runs(job_name: str, poke: float, timeout: float, other_dag: str, other_task: str,
                         operation: str, check_params: Callable[[str, Mapping[str, Any]], Any]):
    from airflow.sdk import PokeReturnValue, task
    wait_window = _env_float("EPOCHAL_TRIGGER_WAIT_SECONDS", 60)

    @task.sensor(task_id="wait_for_epoch_runs", mode="reschedule", poke_interval=poke, timeout=timeout, retries=5,
                 doc_md="Check the params, then wait until no epoch run of the job is processing (one runner at a "
                        "time). Bad params fail here at once, before any wait.")
    def wait_for_epoch_runs(**context):
        ti = context["ti"]
        with _fail_fast_on_user_errors():  # issue 34, item 8: a typo must not wait an hour for running epochs
            check_params(job_name, context.get("params") or {})
        deadline = time.monotonic() + wait_window
        while True:
            reason = _operation_wait_reason(ti, job_name, other_dag, other_task)
            if reason is None:
                return PokeReturnValue(is_done=True)
            log.info("%s of job %s (params checked) waits before touching the job: %s; checking again every "
                     "%.0f s, for up to %.0f s", operation, job_name, reason, poke, timeout)
            if time.monotonic() + poke > deadline:
                return PokeReturnValue(is_done=False)
            time.sleep(poke)

    return wait_for_epoch_runs()


def build_savepoint_dag(job_name: str, *, dag_id: str | None = None, doc_md: str | None = None,
                        tags: Sequence[str] = (), retries: int | None = None, retry_delay: timedelta | None = None,
                        poke_interval: float | None = None) -> DAG:
    """Manual savepoint DAG (no schedule; trigger with the params form): an aligned, self-contained
    savepoint of the newest checkpoint, optionally stopping the job (stop-with-savepoint)."""
    from airflow.sdk import DAG, Param, task

    from pipeline.jobs import get_job
    job = get_job(job_name)
    poke = poke_interval if poke_interval is not None else _env_float("EPOCHAL_POKE_SECONDS", 15)
    with DAG(
        dag_id=dag_id or savepoint_dag_id(job.name),
        schedule=None,
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        catchup=False,
        max_active_runs=1,
        default_args=_default_args(retries, retry_delay),
        tags=list(dict.fromkeys(["epochal", f"job:{job.name}", "savepoint", *tags])),
        doc_md=doc_md,
        description=f"Epochal: take a savepoint of job {job.name}",
        params={
            "target": Param(None, type=["null", "string"], title="Target URI",
                            description="Savepoint directory (file:// or s3://). Empty: "
                                        "<checkpoint root>/<job>/savepoints/sp-<id>-<timestamp>"),
            "stop_after_savepoint": Param(False, type="boolean", title="Stop after savepoint",
                                          description="Stop the job (skip epoch runs) until it is restored"),
        },
    ) as dag:
        waited = _wait_for_epoch_runs(job.name, poke, 3600, restore_dag_id(job.name), "restore", "savepoint",
                                      _savepoint_params)

        @task(task_id="savepoint", doc_md="Take the savepoint; its location is logged and pushed to XCom.")
        def savepoint(**context):
            params = context["params"]
            dr = context["dag_run"]
            with _fail_fast_on_user_errors():
                target = _savepoint_params(job_name, params)  # before waiting or touching the job
            _wait_until_job_free(context["ti"], job.name, restore_dag_id(job.name), "restore", poke, 3600)
            orch = _orchestrator(job_name)
            with _fail_fast_on_user_errors():
                res = orch.savepoint(target=target, stop=bool(params.get("stop_after_savepoint")),
                                     by=f"airflow:{dr.dag_id}/{dr.run_id}")
            context["ti"].xcom_push(key="savepoint_location", value=res["savepoint"])
            log.info("SAVEPOINT LOCATION: %s", res["savepoint"])
            return res

        waited >> savepoint()
    return dag


def build_restore_dag(job_name: str, *, dag_id: str | None = None, doc_md: str | None = None,
                      tags: Sequence[str] = (), retries: int | None = None, retry_delay: timedelta | None = None,
                      poke_interval: float | None = None, approve: bool | None = None) -> DAG:
    """Restore DAG (no schedule; trigger with the params form): restore the job from a checkpoint id or a
    savepoint URI (NO_CLAIM), optionally with another parallelism, then validate the restored state."""
    from airflow.sdk import DAG, Param, task

    from pipeline.jobs import get_job
    job = get_job(job_name)
    poke = poke_interval if poke_interval is not None else _env_float("EPOCHAL_POKE_SECONDS", 15)
    with DAG(
        dag_id=dag_id or restore_dag_id(job.name),
        schedule=None,
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        catchup=False,
        max_active_runs=1,
        default_args=_default_args(retries, retry_delay),
        tags=list(dict.fromkeys(["epochal", f"job:{job.name}", "restore", *tags])),
        doc_md=doc_md,
        description=f"Epochal: restore job {job.name} from a checkpoint or savepoint",
        params={
            "from": Param("", type="string", minLength=1, title="From",
                          description="A checkpoint id (e.g. 12) or a savepoint URI (s3://.../savepoints/sp-...)"),
            "parallelism": Param(None, type=["null", "integer"], minimum=1, title="Parallelism",
                                 description="Spark parallelism after the restore (empty: PIPELINE_PARALLELISM); "
                                             "key groups are redistributed, max parallelism stays fixed"),
            "allow_non_restored_state": Param(False, type="boolean", title="Allow non-restored state",
                                              description="Drop state of operators the job no longer has"),
        },
    ) as dag:
        waited = _wait_for_epoch_runs(job.name, poke, 3600, savepoint_dag_id(job.name), "savepoint", "restore",
                                      _restore_params)

        @task(task_id="restore", doc_md="Restore (NO_CLAIM): the snapshot's files are copied, never referenced.")
        def restore(**context):
            params = context["params"]
            dr = context["dag_run"]
            from pipeline.exceptions import ObjectNotFoundError
            with _fail_fast_on_user_errors():  # before waiting or touching the job
                from_, par = _restore_params(job_name, params)
            _wait_until_job_free(context["ti"], job.name, savepoint_dag_id(job.name), "savepoint", poke, 3600)
            orch = _orchestrator(job_name)
            with _fail_fast_on_user_errors(ObjectNotFoundError):  # no such checkpoint / savepoint
                return orch.restore(from_, parallelism=par,
                                    allow_non_restored_state=bool(params.get("allow_non_restored_state")),
                                    by=f"airflow:{dr.dag_id}/{dr.run_id}")

        @task(task_id="validate", retries=0, doc_md="Data-quality suites on the restored checkpoint (its own task: the "
              "epoch runs continue from the restored checkpoint while it runs; EPOCHAL_RESTORE_VALIDATE chooses "
              "full, cheap or none).")
        def validate(restored: dict, **context):
            orch = _orchestrator(job_name)
            return orch.validate_restore(int(restored["checkpoint_id"]))

        restored = restore()
        waited >> restored  # restore itself waits, not only validate
        validate(restored)
        if approval_enabled(APPROVE_RESTORE_ENV, approve):
            from pipeline.orchestration.approval import restore_approval
            restore_approval(job.name) >> waited
    return dag


def build_quality_dag(job_name: str, *, dag_id: str | None = None, doc_md: str | None = None,
                      tags: Sequence[str] = (), retries: int | None = None) -> DAG:
    """On-demand data-quality DAG: validate a checkpoint id or savepoint URI (default: the newest)."""
    from airflow.sdk import DAG, Param, task

    from pipeline.jobs import get_job
    job = get_job(job_name)
    with DAG(
        dag_id=dag_id or quality_dag_id(job.name),
        schedule=None,
        start_date=datetime(2026, 1, 1, tzinfo=UTC),
        catchup=False,
        default_args=_default_args(0 if retries is None else retries, None),
        tags=list(dict.fromkeys(["epochal", f"job:{job.name}", "data-quality", *tags])),
        doc_md=doc_md,
        description=f"Epochal: validate a checkpoint or savepoint of job {job.name}",
        params={"checkpoint": Param(None, type=["null", "string"], title="Checkpoint",
                                    description="Checkpoint id or savepoint URI (empty: the newest checkpoint)")},
    ) as dag:

        @task(task_id="validate")
        def validate(**context):
            from pipeline.exceptions import ObjectNotFoundError
            from pipeline.inputs import check_snapshot_ref
            ref = context["params"].get("checkpoint") or None
            with _fail_fast_on_user_errors(ObjectNotFoundError):
                ref = check_snapshot_ref(ref) if ref is not None else None
                orch = _orchestrator(job_name)
                return orch.quality(ref)

        validate()
    return dag
