"""Pipeline configuration: environment variables, optionally a ``--config`` YAML with the same keys.

Precedence: explicit overrides > environment > YAML file > defaults. Every key is documented in the
README; invalid values raise :class:`~pipeline.exceptions.ConfigError` (CLI exit code 2).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from pipeline.barriers.events import CheckpointingMode
from pipeline.exceptions import ConfigError
from pipeline.master import check_master_usable
from pipeline.sink.formats import parse_format_override

__all__ = ["PipelineConfig", "load_config", "CONFIG_KEYS"]

_DEFAULT_ROOT = Path(os.environ.get("EPOCHAL_HOME", Path.cwd() / ".epochal")).resolve()


STATE_BACKENDS = ("heap", "rocksdb")  # docs/state.md, "Keyed state backend"


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """All knobs of a pipeline run. Field ``x`` is read from ``PIPELINE_X``."""

    source_uri: str = (_DEFAULT_ROOT / "sources").as_uri()
    checkpoint_uri: str = (_DEFAULT_ROOT / "checkpoints").as_uri()
    sink_uri: str = (_DEFAULT_ROOT / "sinks").as_uri()
    dead_letter_uri: str = ""  # default: <checkpoint_uri>/_dead_letter (records go to <root>/<job>/<source>/...)
    epoch_seconds: int = 60
    max_records_per_epoch: int = 1_000_000
    # up to this many waiting epochs per Spark round, one checkpoint each (epoch tagging, docs/performance.md);
    # one waiting epoch (a steady schedule) is one round whatever the value. A tagged round hands each task the
    # input of all its epochs at once, so it is bounded by bytes too (next key)
    max_epochs_per_round: int = 8
    # a tagged round adds waiting epochs only while (their records x bytes per row) / parallelism stays within
    # this many bytes per task; bytes per row per source are measured by the read tasks and recorded in every
    # checkpoint (pipeline.runtime.round_bytes); before the first measurement, sampled from the round's first
    # Parquet file (else one epoch). 0: no bound
    max_task_bytes_per_round: int = 128 << 20
    allowed_lateness_seconds: int = 0
    parallelism: int = 2
    max_parallelism: int = 128
    checkpoint_mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE  # a str is coerced
    unaligned: bool = False
    aligned_timeout_seconds: float = 0.0
    checkpoint_timeout_seconds: float = 600.0
    tolerable_failed_checkpoints: int = 0
    retained_checkpoints: int = 3
    bad_records: str = "dead_letter"
    # incremental source listing (docs/state.md, "S3 requests per epoch"): per partition, list only from this many
    # already-read files behind the position on (late/changed files among them are detected every epoch) ...
    source_listing_window: int = 16
    # ... and list everything (all files checked against the read inventory) on every N-th checkpoint; 0: never
    source_full_listing_every: int = 50
    state_ttl_seconds: int = 24 * 3600
    state_incremental: bool = True  # incremental (changelog) state snapshots in <job>/shared/ (docs/state.md)
    state_max_deltas: int = 10  # a state chain holds at most this many deltas before a full base is written
    state_max_delta_ratio: float = 0.5  # ... and its deltas at most this fraction of the base's bytes
    state_backend: str = "heap"  # heap | rocksdb: keyed state in the task's memory, or in an executor-local store
    validate_after_epoch: bool = False
    spark_master: str = ""  # empty: the launcher's / an existing session's master, else local[*]
    sink_format: str = ""  # "" | iceberg | delta | epochal | <table>=<format>,... (overrides the job API)
    iceberg_catalog: str = ""  # "" = embedded SQLite catalog; else a pyiceberg catalog name (REST/Glue/Hive/...)
    iceberg_catalog_uri: str = ""  # embedded catalog's SQLAlchemy URI; default <sink root>/_iceberg_catalog.db
    savepoint_prefixes: str = ""  # comma-separated URI prefixes for savepoint --target; "" = <ckpt>/<job>/savepoints
    clock_now: str = ""  # ISO-8601 UTC; empty = wall clock. Lets tests and replays control the clock.

    def __post_init__(self) -> None:
        for name in ("source_uri", "checkpoint_uri", "sink_uri"):
            v = getattr(self, name)
            if not v.startswith(("file://", "s3://")):
                raise ConfigError(f"PIPELINE_{name.upper()}={v!r}: must be a file:// or s3:// URI")
        if self.dead_letter_uri and not self.dead_letter_uri.startswith(("file://", "s3://")):
            raise ConfigError(f"PIPELINE_DEAD_LETTER_URI={self.dead_letter_uri!r}: must be file:// or s3://")
        try:
            object.__setattr__(self, "checkpoint_mode", CheckpointingMode(self.checkpoint_mode))
        except ValueError:
            raise ConfigError(f"PIPELINE_CHECKPOINT_MODE={self.checkpoint_mode!r}: "
                              "use exactly_once or at_least_once") from None
        if self.unaligned and self.checkpoint_mode == CheckpointingMode.AT_LEAST_ONCE:
            raise ConfigError("PIPELINE_UNALIGNED=true requires PIPELINE_CHECKPOINT_MODE=exactly_once "
                              "(unaligned checkpoints are refused with at-least-once, as in Flink)")
        if self.sink_format:
            parse_format_override(self.sink_format)
        if self.state_backend not in STATE_BACKENDS:
            raise ConfigError(f"PIPELINE_STATE_BACKEND={self.state_backend!r}: use one of {', '.join(STATE_BACKENDS)}")
        if self.bad_records not in ("dead_letter", "fail"):
            raise ConfigError(f"PIPELINE_BAD_RECORDS={self.bad_records!r}: use dead_letter or fail")
        for name in ("epoch_seconds", "max_records_per_epoch", "max_epochs_per_round", "parallelism",
                     "max_parallelism", "retained_checkpoints"):
            if getattr(self, name) < 1:
                raise ConfigError(f"PIPELINE_{name.upper()}={getattr(self, name)}: must be >= 1")
        for name in ("allowed_lateness_seconds", "aligned_timeout_seconds", "tolerable_failed_checkpoints",
                     "state_ttl_seconds", "state_max_deltas", "state_max_delta_ratio", "source_listing_window",
                     "source_full_listing_every", "max_task_bytes_per_round"):
            if getattr(self, name) < 0:
                raise ConfigError(f"PIPELINE_{name.upper()}={getattr(self, name)}: must be >= 0")
        if self.parallelism > self.max_parallelism:
            raise ConfigError(f"PIPELINE_PARALLELISM={self.parallelism} exceeds "
                              f"PIPELINE_MAX_PARALLELISM={self.max_parallelism}")

    @property
    def dead_letter_root(self) -> str:
        """Dead-letter root; records of job J, source S go to ``<root>/<J>/<S>/partition=<p>/...``."""
        if self.dead_letter_uri:
            return self.dead_letter_uri.rstrip("/")
        return f"{self.checkpoint_uri.rstrip('/')}/_dead_letter"

    def with_(self, **changes: Any) -> "PipelineConfig":
        return replace(self, **changes)

    def as_env(self) -> dict[str, str]:
        """The config as PIPELINE_* environment variables (for subprocesses / Airflow tasks)."""
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f"PIPELINE_{f.name.upper()}"] = ("true" if v else "false") if isinstance(v, bool) else str(v)
        return out


CONFIG_KEYS = tuple(f"PIPELINE_{f.name.upper()}" for f in fields(PipelineConfig))


def _coerce(name: str, typ: Any, raw: Any) -> Any:
    t = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if t == "bool":
            if isinstance(raw, bool):
                return raw
            s = str(raw).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(raw)
        if t == "int":
            return int(raw)
        if t == "float":
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"PIPELINE_{name.upper()}={raw!r}: expected {t}") from None


def load_config(config_file: str | None = None, env: Mapping[str, str] | None = None,
                **overrides: Any) -> PipelineConfig:
    """Build the config from defaults < YAML file < environment < overrides."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    known = {f.name: f.type for f in fields(PipelineConfig)}
    if config_file:
        import yaml
        try:
            data = yaml.safe_load(Path(config_file).read_text()) or {}
        except OSError as e:
            raise ConfigError(f"config file {config_file}: {e}") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = " ".join(str(getattr(e, "problem", None) or e).split())  # one line
            raise ConfigError(f"config file {config_file}: invalid YAML{where}: {problem}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {config_file}: expected a mapping of PIPELINE_* keys")
        for k, v in data.items():
            name = str(k).lower().removeprefix("pipeline_")
            if name not in known:
                raise ConfigError(f"config file {config_file}: unknown key {k!r}")
            values[name] = _coerce(name, known[name], v)
    for name, typ in known.items():
        key = f"PIPELINE_{name.upper()}"
        if key in env and env[key] != "":
            values[name] = _coerce(name, typ, env[key])
    for k, v in overrides.items():
        if v is not None:
            values[k] = v
    cfg = PipelineConfig(**values)
    check_master_usable(cfg.spark_master, env)
    return cfg
