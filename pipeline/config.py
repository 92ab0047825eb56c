"""Pipeline configuration: environment variables, optionally a ``--config`` YAML with the same keys.

Precedence: explicit overrides > environment > YAML file > defaults. Every key is documented by the
attribute docstring under its field (the docs' configuration reference is generated from them); invalid values
raise :class:`~pipeline.exceptions.ConfigError` (CLI exit code 2).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from pipeline import settings
from pipeline.barriers.events import CheckpointingMode
from pipeline.exceptions import ConfigError
from pipeline.layout.dead_letters import default_dead_letter_root
from pipeline.master import check_master_usable
from pipeline.sink.table_format import parse_format_override

__all__ = ["PipelineConfig", "load_config", "CONFIG_KEYS"]

_DEFAULT_ROOT = Path(settings.value("EPOCHAL_HOME") or Path.cwd() / ".epochal").resolve()


STATE_BACKENDS = ("heap", "rocksdb")  # docs/state.md, "Keyed state backend"


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    """All knobs of a pipeline run. Field ``x`` is read from ``PIPELINE_X``."""

    source_uri: str = (_DEFAULT_ROOT / "sources").as_uri()
    """Source root (``file://`` or ``s3://``): ``<root>/<source>/partition=<p>/<seq:08d>.parquet``."""
    checkpoint_uri: str = (_DEFAULT_ROOT / "checkpoints").as_uri()
    """Checkpoint root: ``<root>/<job>/`` holds ``job.json``, checkpoints, shared state files and savepoints."""
    sink_uri: str = (_DEFAULT_ROOT / "sinks").as_uri()
    """Sink root: ``<root>/<job>/<table>/``."""
    dead_letter_uri: str = ""
    """Dead-letter root; empty: ``<checkpoint root>/_dead_letter``. Bad input goes to
    ``<root>/<job>/<source>/partition=<p>/...``, operators' dead letters to ``<root>/<job>/operator=<uid>/...``."""
    epoch_seconds: int = 60
    """Epoch length in seconds of ``_ingest_ts`` time; match the DAG's schedule."""
    max_records_per_epoch: int = 1_000_000
    """Records per input per round; the rest is backlog, drained by later rounds."""
    max_epochs_per_round: int = 8
    """Waiting epochs one Spark round may complete (catch-up, backfill, a run after downtime), one checkpoint each,
    in order (epoch tagging: aligned exactly-once jobs). One waiting epoch (a steady schedule) is one round whatever
    the value; other modes run one epoch per round and say why once per run. ``1``: always one epoch per round."""
    round_target_seconds: float = 30.0
    """Catch-up: a round carries only as many waiting epochs as the last round's time per epoch says complete within
    this many seconds, so a checkpoint completes at least this often and a kill loses little work; the first round of
    a run carries one epoch, so the first checkpoint comes early (docs/concepts/epochs.md). ``0``: no time bound."""
    max_task_bytes_per_round: int = 128 << 20
    """Input bytes one task of a tagged round may hold: a round adds waiting epochs only while (their records x bytes
    per row) / parallelism stays within it. Bytes per row are measured by the read tasks and recorded in every
    checkpoint; before the first measurement they are sampled from the round's first Parquet file (else one epoch).
    Size it at a fraction of a Python worker's memory. ``0``: no bound."""
    allowed_lateness_seconds: int = 0
    """How long after an epoch's end a partition without data may lag before it counts as idle."""
    parallelism: int = 2
    """Operator subtasks (Spark partitions); may change on restore."""
    max_parallelism: int = 128
    """Key groups; fixed when the job is created (stored in ``job.json``)."""
    checkpoint_mode: CheckpointingMode = CheckpointingMode.EXACTLY_ONCE  # a str is coerced
    """``exactly_once`` or ``at_least_once`` (the tracker: never blocks, may count records twice after a restore)."""
    unaligned: bool = False
    """Unaligned checkpoints (exactly-once only): snapshot at the first barrier, in-flight data as channel state."""
    aligned_timeout_seconds: float = 0.0
    """With ``PIPELINE_UNALIGNED=true``: aligned until this timeout, then unaligned; ``0``: unaligned at once."""
    checkpoint_timeout_seconds: float = 600.0
    """A pending checkpoint older than this is aborted (``CHECKPOINT_EXPIRED``)."""
    tolerable_failed_checkpoints: int = 0
    """Consecutive checkpoint failures tolerated before the job fails."""
    retained_checkpoints: int = 3
    """Completed checkpoints kept; older ones are subsumed and deleted (savepoints never are)."""
    bad_records: str = "dead_letter"
    """``dead_letter`` (counted in the checkpoint stats) or ``fail``: the epoch fails naming file and partition."""
    source_listing_window: int = 16
    """Incremental source listing: per partition, list from this many already-read files behind the position on
    (late or changed files among them are detected every epoch)."""
    source_full_listing_every: int = 50
    """Every N-th checkpoint lists whole partitions and checks every file against the read inventory; ``0``: never."""
    state_ttl_seconds: int = 24 * 3600
    """Default state TTL of joins (and of operators without their own ``ttl_seconds``), in ``_ingest_ts`` time."""
    state_incremental: bool = True
    """Incremental state snapshots: a base plus changelog deltas in ``<job>/shared/``; on a local file system with
    small state ``false`` is faster."""
    state_max_deltas: int = 10
    """Deltas a state chain may hold before a full base is written again (bounds a restore)."""
    state_max_delta_ratio: float = 0.5
    """... and their bytes, as a fraction of the base's."""
    state_backend: str = "heap"
    """``heap`` (the default): each task holds its key-group range's state in memory and hands the kernel the touched
    keys' rows, found by a vectorised probe (the fastest per record; an epoch's cost does not grow with the state);
    ``rocksdb``: an executor-local RocksDB store per state and range, read and written per touched key, so state may
    be larger than memory (docs/state.md "Which backend")."""
    validate_after_epoch: bool = False
    """Run the cheap quality subset after each checkpoint."""
    spark_master: str = ""
    """Any Spark master URL or a Spark Connect server ``sc://host:port``; empty: the launcher's or an existing
    session's master, else ``local[*]``."""
    sink_format: str = ""
    """``delta``, ``iceberg`` or ``epochal`` for every sink, or ``table=format,...``; overrides the job API; empty:
    the job's choice."""
    iceberg_catalog: str = ""
    """Empty: an embedded SQLite catalog; else a pyiceberg catalog name (REST, Glue, Hive, ...)."""
    iceberg_catalog_uri: str = ""
    """The embedded catalog's SQLAlchemy URI; empty: ``<sink root>/_iceberg_catalog.db``."""
    savepoint_prefixes: str = ""
    """Comma-separated URI prefixes ``savepoint --target`` may write under; empty: ``<checkpoint root>/<job>/savepoints``."""
    clock_now: str = ""
    """A fixed ISO-8601 UTC "now" for tests and replays; empty: the wall clock."""

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
        for name in ("allowed_lateness_seconds", "aligned_timeout_seconds", "round_target_seconds", "tolerable_failed_checkpoints",
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
        return default_dead_letter_root(self.checkpoint_uri)

    def with_(self, **changes: Any) -> PipelineConfig:
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
