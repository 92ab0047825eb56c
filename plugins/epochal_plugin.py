"""Airflow 3 plugin: Epochal checkpoint history in the Airflow UI.

* ``fastapi_apps``: the app of :mod:`pipeline.orchestration.ui`, mounted at ``/epochal`` in the api-server.
  Every route checks the caller's Airflow login (JWT cookie or bearer token) with the configured auth
  manager: Airflow does not authenticate plugin apps by itself.
* ``external_views``: *Browse > Epochal checkpoints* in the nav, and a *Checkpoints* tab on DAG pages.
"""
from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from pipeline.orchestration.ui import create_app

URL_PREFIX = "/epochal"


class EpochalPlugin(AirflowPlugin):
    name = "epochal"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "Epochal checkpoints"}]
    external_views = [
        {   # nav entry: iframe of the jobs page (href is relative to the UI's base URL)
            "name": "Epochal checkpoints",
            "href": "epochal/",
            "url_route": "epochal-checkpoints",
            "destination": "nav",
            "category": "browse",
        },
        {   # tab on a DAG's page: redirects to the checkpoint history of the DAG's job
            "name": "Checkpoints",
            "href": "epochal/dags/{DAG_ID}",
            "url_route": "epochal-dag-checkpoints",
            "destination": "dag",
        },
    ]
