"""Optional human approval before a restore or a rewind (Airflow's human-in-the-loop operators).

Off by default. Turn on per deployment with environment variables read when the DAG file is parsed (or with
the ``approve_*`` arguments of the DAG factories):

==================================  ======================================================================
``EPOCHAL_APPROVE_RESTORE``         ``true``: the restore DAG asks for approval (``approve_restore``) before
                                    it waits for running epochs and restores
``EPOCHAL_APPROVE_REWIND``          ``true``: an epoch run whose interval was processed already (a re-run /
                                    backfill with reprocessing: a **rewind**) asks before ``process``;
                                    runs that continue the job never ask
``EPOCHAL_APPROVAL_TIMEOUT_SECONDS`` how long to wait for an answer (default 24 h); no answer = Reject
==================================  ======================================================================

The approval task is Airflow's ``ApprovalOperator``: the run shows *Required actions* in the UI (and
``PATCH /api/v2/dags/{dag}/dagRuns/{run}/taskInstances/{task}/-1/hitlDetails`` with
``{"chosen_options": ["Approve"]}``). **Approve** continues; **Reject** (or the timeout) skips the restore or
the rewind and everything after it: the run ends without touching the job. While a restore waits for its
approval its DAG run is running, so epoch runs of the job wait too (operations go first).

This module imports Airflow's standard provider at import time: the DAG factory imports it only when an
approval is enabled.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.providers.standard.operators.hitl import ApprovalOperator

from pipeline import settings
from pipeline.exceptions import ConfigError

__all__ = ["restore_approval", "rewind_approval", "RewindApprovalOperator"]

TIMEOUT_ENV = "EPOCHAL_APPROVAL_TIMEOUT_SECONDS"


def _timeout() -> timedelta:
    raw = (settings.raw(TIMEOUT_ENV) or "").strip()
    try:
        seconds = float(raw) if raw else 24 * 3600.0
    except ValueError:
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r}: expected a number of seconds") from None
    if seconds <= 0:
        raise ConfigError(f"{TIMEOUT_ENV}={raw!r}: expected a positive number of seconds")
    return timedelta(seconds=seconds)


class RewindApprovalOperator(ApprovalOperator):
    """Approval of a rewind; a run that does not rewind passes without asking."""

    def execute(self, context: Any):
        triggered = context["ti"].xcom_pull(task_ids="trigger") or {}
        if triggered.get("action") != "rewind":
            self.log.info("epoch %s: action %s, not a rewind: no approval needed", triggered.get("epoch"),
                          triggered.get("action"))
            return None
        return super().execute(context)


def restore_approval(job: str) -> ApprovalOperator:
    """The ``approve_restore`` task of a restore DAG."""
    return ApprovalOperator(
        task_id="approve_restore", retries=0,
        subject=f"Restore Epochal job {job}?",
        body=(f"Restore job **{job}** from `{{{{ params['from'] }}}}` (parallelism "
              "`{{ params['parallelism'] or 'unchanged' }}`). The job's newest checkpoint becomes a copy of that "
              "snapshot; epochs after it are processed again. Reject (or no answer) leaves the job as it is."),
        defaults="Reject", response_timeout=_timeout(), ignore_downstream_trigger_rules=True)


def rewind_approval(job: str) -> RewindApprovalOperator:
    """The ``approve_rewind`` task of an epoch DAG: asks only when the trigger decided to rewind."""
    return RewindApprovalOperator(
        task_id="approve_rewind", retries=0,
        subject=f"Rewind Epochal job {job}?",
        body=(f"A run of job **{job}** re-processes an interval that was processed already: the job rewinds to "
              "the checkpoint before it and processes forward again (committed output is replaced, never "
              "duplicated). Reject (or no answer) skips it."),
        defaults="Reject", response_timeout=_timeout(), ignore_downstream_trigger_rules=True)
