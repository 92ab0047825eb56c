"""Where the Airflow tasks get their S3 settings and pipeline configuration from.

Never from DAG code. In order of precedence:

1. an **Airflow connection** whose id is ``EPOCHAL_AWS_CONN_ID`` (default ``epochal_s3``; an explicitly set
   id that does not exist is an error, the default id may be absent). The usual ``aws`` connection
   conventions apply: ``login`` = access key id, ``password`` = secret access key, ``extra`` =
   ``{"endpoint_url": ..., "region_name": ...}`` (``host`` is accepted as the endpoint too, e.g. MinIO);
2. the standard **AWS environment**: ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``),
   ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION`` (or an instance profile etc.).

The pipeline configuration is the usual ``PIPELINE_*`` environment (optionally a YAML file named by
``EPOCHAL_CONFIG``), exactly as for the CLI. :func:`apply_s3_settings` exports the resolved S3 settings
into ``os.environ`` of the task process, so ``S3FileIO`` on the driver and, through the Spark session, the
executors use them.

Nothing here imports Airflow at module import time; the connection lookup does, lazily.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from pipeline import settings as env_settings
from pipeline.config import load_config
from pipeline.exceptions import ConfigError
from pipeline.fileio import S3FileIO

__all__ = ["S3Settings", "resolve_s3_settings", "apply_s3_settings", "load_pipeline_config",
           "DEFAULT_CONN_ID", "CONN_ID_ENV", "ConnectionLookup"]

log = logging.getLogger(__name__)

DEFAULT_CONN_ID = "epochal_s3"
CONN_ID_ENV = "EPOCHAL_AWS_CONN_ID"
CONFIG_FILE_ENV = "EPOCHAL_CONFIG"

_AWS_KEYS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
             "AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN")

# (conn_id) -> connection-like object with .login/.password/.host/.extra_dejson, or None if absent
ConnectionLookup = Callable[[str], Any]


@dataclass(frozen=True, slots=True)
class S3Settings:
    """Resolved S3 settings. ``source`` says where they came from (``connection:<id>`` or ``environment``)."""

    source: str
    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    region: str | None = None
    session_token: str | None = field(default=None, repr=False)

    def as_env(self) -> dict[str, str]:
        """The ``AWS_*`` variables these settings stand for (unset values are left out)."""
        env = {}
        if self.endpoint_url:
            env["AWS_ENDPOINT_URL"] = self.endpoint_url
            env["AWS_ENDPOINT_URL_S3"] = self.endpoint_url
        if self.access_key_id:
            env["AWS_ACCESS_KEY_ID"] = self.access_key_id
        if self.secret_access_key:
            env["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
        if self.region:
            env["AWS_DEFAULT_REGION"] = self.region
        if self.session_token:
            env["AWS_SESSION_TOKEN"] = self.session_token
        return env

    def describe(self) -> str:
        where = self.endpoint_url or "AWS default endpoint"
        return f"S3 settings from {self.source} (endpoint {where}, region {self.region or 'default'})"

    def file_io(self):
        """An ``S3FileIO`` with exactly these settings (does not touch ``os.environ``)."""
        return S3FileIO(endpoint_url=self.endpoint_url, access_key_id=self.access_key_id,
                        secret_access_key=self.secret_access_key, region=self.region,
                        session_token=self.session_token)


def airflow_task_connection(conn_id: str) -> Any:
    """Look a connection up from inside an Airflow task (Task SDK; secrets backends, env, API)."""
    from airflow.sdk import BaseHook
    try:
        return BaseHook.get_connection(conn_id)
    except Exception as e:  # noqa: BLE001 - AirflowNotFoundException and friends
        if "isn't defined" in str(e) or "not found" in str(e).lower() or type(e).__name__.endswith("NotFoundException"):
            return None
        raise


def airflow_server_connection(conn_id: str) -> Any:
    """Look a connection up inside an Airflow server process (api-server plugin): secrets backends + DB."""
    try:
        from airflow.models.connection import Connection
        return Connection.get_connection_from_secrets(conn_id)
    except Exception as e:  # noqa: BLE001
        if type(e).__name__.endswith("NotFoundException") or "isn't defined" in str(e):
            return None
        raise


def _extra(conn: Any) -> Mapping[str, Any]:
    extra = getattr(conn, "extra_dejson", None)
    if isinstance(extra, Mapping):
        return extra
    raw = getattr(conn, "extra", None)
    if isinstance(raw, Mapping):
        return raw
    if raw:
        try:
            val = json.loads(raw)
            return val if isinstance(val, Mapping) else {}
        except ValueError:
            return {}
    return {}


def _from_connection(conn_id: str, conn: Any) -> S3Settings:
    extra = _extra(conn)
    endpoint = (extra.get("endpoint_url") or extra.get("aws_endpoint_url")
                or (extra.get("service_config") or {}).get("s3", {}).get("endpoint_url"))
    host = getattr(conn, "host", None)
    if not endpoint and host:
        endpoint = host if "://" in str(host) else f"http://{host}" + (
            f":{conn.port}" if getattr(conn, "port", None) else "")
    region = extra.get("region_name") or extra.get("region")
    return S3Settings(source=f"connection:{conn_id}", endpoint_url=endpoint or None,
                      access_key_id=getattr(conn, "login", None) or extra.get("aws_access_key_id") or None,
                      secret_access_key=getattr(conn, "password", None) or extra.get("aws_secret_access_key") or None,
                      region=region or None, session_token=extra.get("aws_session_token") or None)


def resolve_s3_settings(env: Mapping[str, str] | None = None, *,
                        lookup: ConnectionLookup | None = None) -> S3Settings:
    """S3 settings from the Airflow connection ``EPOCHAL_AWS_CONN_ID`` if it exists, else the AWS env.

    ``lookup`` finds a connection by id (default: the Task SDK, :func:`airflow_task_connection`);
    pass :func:`airflow_server_connection` in server processes, or a stub in tests.
    """
    env = env_settings.environ() if env is None else env
    explicit = env.get(CONN_ID_ENV, "").strip()
    conn_id = explicit or DEFAULT_CONN_ID
    if conn_id.lower() not in ("none", "env", "-"):
        lookup = lookup or airflow_task_connection
        try:
            conn = lookup(conn_id)
        except ImportError:
            conn = None  # Airflow is not installed here: environment only
        if conn is not None:
            return _from_connection(conn_id, conn)
        if explicit:
            raise ConfigError(f"{CONN_ID_ENV}={explicit!r}: no Airflow connection with that id "
                              "(create it in Admin > Connections or as AIRFLOW_CONN_" + explicit.upper() + ")")
    return S3Settings(source="environment",
                      endpoint_url=env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None,
                      access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
                      secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
                      region=env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or None,
                      session_token=env.get("AWS_SESSION_TOKEN") or None)


def apply_s3_settings(settings: S3Settings, environ: MutableMapping[str, str] | None = None) -> None:
    """Export ``settings`` as ``AWS_*`` variables of this process (task processes only).

    Settings from a connection replace any ``AWS_*`` values already in the environment, so a stale
    endpoint cannot win over the connection.
    """
    environ = env_settings.environ() if environ is None else environ
    if settings.source != "environment":
        for key in _AWS_KEYS:
            environ.pop(key, None)
    environ.update(settings.as_env())


def load_pipeline_config(env: Mapping[str, str] | None = None, **overrides: Any):
    """``PipelineConfig`` from ``PIPELINE_*`` (and the YAML file named by ``EPOCHAL_CONFIG``, if any)."""
    env = env_settings.environ() if env is None else env
    return load_config(env.get(CONFIG_FILE_ENV) or None, env=env, **overrides)
