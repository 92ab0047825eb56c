"""The names Epochal gives things in Airflow: DAG ids per job and the plugin's routes.

One module, imported by the DAG factory, the task code and the UI plugin alike (none of them imports another
for a name).
"""
from __future__ import annotations

from urllib.parse import quote

from pipeline import settings

__all__ = ["epoch_dag_id", "savepoint_dag_id", "restore_dag_id", "quality_dag_id", "data_docs_url"]


def epoch_dag_id(job: str) -> str:
    return f"epochal_{job}"


def savepoint_dag_id(job: str) -> str:
    return f"epochal_{job}_savepoint"


def restore_dag_id(job: str) -> str:
    return f"epochal_{job}_restore"


def quality_dag_id(job: str) -> str:
    return f"epochal_{job}_data_quality"


def data_docs_url(job: str, base_url: str | None = None) -> str:
    """The Data Docs of ``job`` inside the Airflow UI (``AIRFLOW__API__BASE_URL`` + the plugin's route)."""
    base = (base_url if base_url is not None else (settings.raw("AIRFLOW__API__BASE_URL") or "")).rstrip("/")
    return f"{base}/epochal/jobs/{quote(job)}/data-docs/"
