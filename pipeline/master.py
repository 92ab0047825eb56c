"""Which Spark master Epochal runs on: whoever launched the process wins over Epochal's own default.

Precedence (first match wins):

1. **an existing SparkContext** in this process (a notebook, a test, an Airflow task that made one): reused;
2. **the launcher**: ``spark-submit --master ...`` (the Python driver then runs with ``PYSPARK_GATEWAY_PORT``
   set and the master in the JVM's configuration) or ``PYSPARK_SUBMIT_ARGS="--master ... pyspark-shell"``;
3. ``PIPELINE_SPARK_MASTER`` (config key ``spark_master``), which may be a Spark Connect URL ``sc://host:port``
   (``SPARK_REMOTE`` is honoured too): the job then runs on a long-lived Connect server
   (:mod:`pipeline.runtime.spark.session`);
4. the embedded default ``local[*]``.

When a launcher's or a session's master wins over a different ``PIPELINE_SPARK_MASTER``, that is said once on
stderr (never silently ignored).
"""
from __future__ import annotations

import enum
import shlex
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from pipeline import settings
from pipeline.exceptions import ConfigError

__all__ = ["MasterSource", "MasterChoice", "choose_master", "check_master_usable", "is_connect", "connect_url",
           "probe_executor_storage", "is_connect_session",
           "connect_endpoint", "probe_connect", "DEFAULT_MASTER", "shared_session_url"]

DEFAULT_MASTER = "local[*]"


class MasterSource(enum.Enum):
    SESSION = "an existing SparkContext"
    LAUNCHER = "the launcher (spark-submit / PYSPARK_SUBMIT_ARGS)"
    CONFIG = "PIPELINE_SPARK_MASTER"
    DEFAULT = "the default"


@dataclass(frozen=True, slots=True)
class MasterChoice:
    """``master`` is None when the winner is not known to Python (spark-submit's JVM holds it): the session
    builder must then not set one."""

    master: str | None
    source: MasterSource
    overridden: str | None = None  # a configured PIPELINE_SPARK_MASTER that lost

    @property
    def builder_master(self) -> str | None:
        """What to pass to ``SparkSession.builder.master`` (None: leave it to the launcher/session)."""
        return self.master if self.source in (MasterSource.CONFIG, MasterSource.DEFAULT) else None

    def note(self) -> str | None:
        if self.overridden and self.overridden != self.master:
            return (f"epochal: PIPELINE_SPARK_MASTER={self.overridden} not applied: the master set by "
                    f"{self.source.value} wins ({self.master or 'from the launcher'})")
        return None


def _submit_args_master(args: str) -> str | None:
    try:
        parts = shlex.split(args)
    except ValueError:
        return None
    for i, p in enumerate(parts):
        if p == "--master" and i + 1 < len(parts):
            return parts[i + 1]
        if p.startswith("--master="):
            return p.split("=", 1)[1]
    return None


def choose_master(configured: str | None, env: Mapping[str, str] | None = None,
                  active_master: str | None = None) -> MasterChoice:
    """Decide the master (see the module docstring). ``active_master``: the master of a SparkContext that
    already runs in this process, if any."""
    env = settings.environ() if env is None else env
    configured = (configured or "").strip() or None
    if active_master:
        return MasterChoice(active_master, MasterSource.SESSION, configured)
    submit = _submit_args_master(env.get("PYSPARK_SUBMIT_ARGS", ""))
    if submit:
        return MasterChoice(submit, MasterSource.LAUNCHER, configured)
    if env.get("PYSPARK_GATEWAY_PORT"):  # running under spark-submit: its JVM already has the master
        return MasterChoice(None, MasterSource.LAUNCHER, configured)
    if configured:
        return MasterChoice(configured, MasterSource.CONFIG)
    return MasterChoice(DEFAULT_MASTER, MasterSource.DEFAULT)


def is_connect(master: str | None) -> bool:
    """A Spark Connect URL (``sc://host:port[/;params]``)."""
    return bool(master) and str(master).strip().startswith("sc://")


def connect_url(configured: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The Spark Connect URL Epochal runs on, if any: ``PIPELINE_SPARK_MASTER=sc://...`` or ``SPARK_REMOTE``."""
    env = settings.environ() if env is None else env
    configured = (configured or "").strip()
    if is_connect(configured):
        return configured
    remote = (env.get("SPARK_REMOTE") or "").strip()
    return remote if is_connect(remote) else None


_SESSION_NAMESPACE = uuid.UUID("6f0c1d52-3a57-4d4e-9a8e-5e0cba7c0a31")


def shared_session_url(url: str, key: str) -> str:
    """``url`` (``sc://host:port[/;params]``) with a Spark Connect ``session_id`` derived from ``key``, unless it
    names one already: every process that connects with the same key attaches to **one server-side session**, so
    the server's Python workers of that session (which a new session starts anew: 7-11 s at load 13, 0.4-0.8 s
    warm) and its state stay warm from one Airflow task to the next. The id is a deterministic version-4 UUID
    (what Spark Connect accepts). Only for processes that never use the session concurrently with different
    session settings (the epoch DAG's tasks of one job: one at a time)."""
    if "session_id=" in url:
        return url
    sid = uuid.UUID(bytes=uuid.uuid5(_SESSION_NAMESPACE, key).bytes, version=4)
    base = url.rstrip("/")
    return f"{base};session_id={sid}" if "/;" in base else f"{base}/;session_id={sid}"


def check_master_usable(configured: str | None, env: Mapping[str, str] | None = None) -> None:
    """Refuse, at configuration time (before anything is claimed or written), a master that cannot work:
    a malformed Spark Connect URL, or ``--remote`` in ``PYSPARK_SUBMIT_ARGS`` (use ``PIPELINE_SPARK_MASTER=sc://``).
    Whether a Connect server answers is checked when the session starts, which every command that needs Spark
    does before its first side effect (:meth:`pipeline.runtime.driver.context.RuntimeContext.require_spark`)."""
    env = settings.environ() if env is None else env
    url = connect_url(configured, env)
    if url is not None:
        host, port = connect_endpoint(url)
        if not host or not (0 < port < 65536):
            raise ConfigError(f"Spark Connect URL {url!r}: expected sc://<host>:<port>")
    if "--remote" in env.get("PYSPARK_SUBMIT_ARGS", ""):
        raise ConfigError("PYSPARK_SUBMIT_ARGS asks for Spark Connect (--remote): set PIPELINE_SPARK_MASTER="
                          "sc://<host>:<port> instead (docs/deployment.md)")


def connect_endpoint(url: str) -> tuple[str, int]:
    """``(host, port)`` of ``sc://host[:port][/;params]`` (Spark Connect's default port is 15002)."""
    rest = url.strip()[len("sc://"):].split("/", 1)[0].split(";", 1)[0]
    host, _, port = rest.rpartition(":") if ":" in rest else (rest, "", "15002")
    try:
        return host, int(port)
    except ValueError:
        return host, -1


def probe_connect(url: str) -> None:
    """Fail with a clear :class:`ConfigError` unless a Spark Connect server accepts connections at ``url``
    (``EPOCHAL_CONNECT_TIMEOUT`` seconds, default 10)."""
    import socket
    host, port = connect_endpoint(url)
    try:
        with socket.create_connection((host, port), timeout=settings.get_float("EPOCHAL_CONNECT_TIMEOUT")):
            pass
    except OSError as e:
        raise ConfigError(f"Spark Connect server {url} is not reachable ({e}); start it (scripts/connect_server.sh, "
                          "or the docker-compose service spark-connect) or fix PIPELINE_SPARK_MASTER; see "
                          "docs/deployment.md") from None


def _storage_probe_task(uri: str, budget_s: str):
    """The executor side of :func:`probe_executor_storage`: one read of ``uri``'s storage (a listing of at most a
    key under it) with a short retry budget; yields one row ``error`` ("" when S3 answered)."""
    def task(batches):
        import pyarrow as pa

        for _ in batches:
            pass
        env = settings.environ()
        old = env.get("PIPELINE_S3_RETRY_SECONDS")
        env["PIPELINE_S3_RETRY_SECONDS"] = budget_s  # a worker is reused: put it back below
        try:
            from pipeline.fileio import file_io_for  # executor side: imported in the Spark task that runs it
            from pipeline.layout import JobLayout  # executor side, like file_io_for
            file_io_for(uri).exists(JobLayout(uri).job_json())
            err = ""
        except Exception as e:  # noqa: BLE001 - reported to the driver as text
            err = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
        finally:
            if old is None:
                env.pop("PIPELINE_S3_RETRY_SECONDS", None)
            else:
                env["PIPELINE_S3_RETRY_SECONDS"] = old
        yield pa.RecordBatch.from_pydict({"error": [err]})
    return task


def probe_executor_storage(spark, uri: str, master: str | None) -> None:
    """Fail with a :class:`ConfigError` unless Spark's executors can reach the storage of ``uri`` (an ``s3://``
    job root; ``file://`` is not probed). For a Spark Connect server: its executors use **their own** S3 settings
    (docs/deployment.md), and on a cluster (``scripts/connect_server.sh --master spark://...``) those are the
    workers', not the server shell's. Checked when the session opens, before a barrier log entry or a checkpoint
    id is written (issue 34, item 6). ``EPOCHAL_EXECUTOR_S3_PROBE_SECONDS`` (default 15): the probe's
    S3 retry budget."""
    if not str(uri).startswith("s3://"):
        return
    if _probed(spark, uri):  # a shared server-side session whose executors reached this job root already
        return
    budget = settings.get_str("EPOCHAL_EXECUTOR_S3_PROBE_SECONDS")
    rows = (spark.range(1, numPartitions=1).mapInArrow(_storage_probe_task(str(uri), budget), "error string")
            .collect())
    errors = [r["error"] for r in rows if r["error"]]
    if errors:
        raise ConfigError(
            f"the Spark executors of {master or 'the Spark session'} cannot reach S3 at {uri}: {errors[0]}. "
            "A Spark Connect server's executors use their own S3 settings, never the client's: for a server on a "
            "local master the AWS_* environment of scripts/connect_server.sh; for --master spark://... the "
            "environment of each worker (AWS_* exported before start-worker.sh), an instance profile or IRSA "
            "(docs/deployment.md). No checkpoint id was claimed")
    _remember_probe(spark, uri)


#: runtime setting of a Spark Connect server-side session: the job root whose probe passed in it. The epoch DAG's
#: tasks of a job share one session (:func:`shared_session_url`), and its executors stay the same while it lives,
#: so the next task skips the probe's Spark job (one conf lookup instead; a new session probes again)
PROBED_ROOT_CONF = "spark.epochal.executorStorageProbed"


def _probed(spark, uri: str) -> bool:
    if not is_connect_session(spark):
        return False
    return spark.conf.get(PROBED_ROOT_CONF, "") == str(uri)


def _remember_probe(spark, uri: str) -> None:
    if is_connect_session(spark):
        spark.conf.set(PROBED_ROOT_CONF, str(uri))


def is_connect_session(spark) -> bool:
    """True for a Spark Connect session (no SparkContext in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")
