"""Which Spark master Epochal runs on: whoever launched the process wins over Epochal's own default.

Precedence (first match wins):

1. **an existing SparkContext** in this process (a notebook, a test, an Airflow task that made one): reused;
2. **the launcher**: ``spark-submit --master ...`` (the Python driver then runs with ``PYSPARK_GATEWAY_PORT``
   set and the master in the JVM's configuration) or ``PYSPARK_SUBMIT_ARGS="--master ... pyspark-shell"``;
3. ``PIPELINE_SPARK_MASTER`` (config key ``spark_master``);
4. the embedded default ``local[*]``.

When a launcher's or a session's master wins over a different ``PIPELINE_SPARK_MASTER``, that is said once on
stderr (never silently ignored).
"""
from __future__ import annotations

import enum
import os
import shlex
from dataclasses import dataclass
from typing import Mapping

from pipeline.exceptions import ConfigError

__all__ = ["MasterSource", "MasterChoice", "choose_master", "check_master_usable", "DEFAULT_MASTER"]

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
    env = os.environ if env is None else env
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


_CONNECT = ("the runtime needs a classic SparkSession: per-round values travel as SparkContext local properties "
            "(pipeline/runtime/round_params.py), round plans are re-used through the JVM (spark._jvm) and "
            "some readers use sparkContext.parallelize; Spark Connect offers none of them. Use a cluster master "
            "(spark://, yarn, k8s://) or spark-submit; see docs/deployment.md")


def check_master_usable(configured: str | None, env: Mapping[str, str] | None = None) -> None:
    """Refuse a master Epochal cannot run on (Spark Connect) at configuration time, before anything is
    claimed or written."""
    env = os.environ if env is None else env
    configured = (configured or "").strip()
    if configured.startswith("sc://"):
        raise ConfigError(f"PIPELINE_SPARK_MASTER={configured}: Spark Connect is not supported yet: {_CONNECT}")
    if env.get("SPARK_REMOTE") or env.get("SPARK_CONNECT_MODE_ENABLED"):
        raise ConfigError(f"SPARK_REMOTE={env.get('SPARK_REMOTE', '')} (Spark Connect) is not supported yet: {_CONNECT}")
    if "--remote" in env.get("PYSPARK_SUBMIT_ARGS", ""):
        raise ConfigError(f"PYSPARK_SUBMIT_ARGS asks for Spark Connect (--remote), not supported yet: {_CONNECT}")
