"""Airflow orchestration of Epochal jobs: epoch DAGs, savepoint/restore DAGs, checkpoint history for the UI.

Importing this package does not import Airflow; the factories do, when called (from ``dags/``).

* :func:`build_epoch_dag` - one checkpointed epoch per data interval (trigger >> process >> commit >> validate)
* :func:`build_savepoint_dag`, :func:`build_restore_dag`, :func:`build_quality_dag` - manual operations
* :func:`sink_asset` - the Airflow Asset of a sink table (schedule downstream DAGs on it)
* :class:`Orchestrator` - the task logic, usable without Airflow
* :func:`resolve_s3_settings` - S3 settings from an Airflow connection or the AWS environment
* :mod:`pipeline.orchestration.history` / :mod:`pipeline.orchestration.ui` - checkpoint history and the
  FastAPI app of the Airflow plugin (``plugins/epochal_plugin.py``)
"""
from __future__ import annotations

from typing import Any

__all__ = ["build_epoch_dag", "build_savepoint_dag", "build_restore_dag", "build_quality_dag", "sink_asset",
           "epoch_dag_id", "savepoint_dag_id", "restore_dag_id", "quality_dag_id", "Orchestrator", "EpochRun",
           "EpochAction", "resolve_s3_settings", "S3Settings"]

_LAZY = {
    "build_epoch_dag": "factory", "build_savepoint_dag": "factory", "build_restore_dag": "factory",
    "build_quality_dag": "factory", "sink_asset": "factory", "epoch_dag_id": "factory",
    "savepoint_dag_id": "factory", "restore_dag_id": "factory", "quality_dag_id": "factory",
    "Orchestrator": "tasks", "EpochRun": "epoch_runs", "EpochAction": "epoch_runs",
    "resolve_s3_settings": "settings", "S3Settings": "settings",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'pipeline.orchestration' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(f"pipeline.orchestration.{mod}"), name)
    globals()[name] = value
    return value
