"""Table formats of sinks: :class:`TableFormat`, how a sink's format is chosen, and the table factory.

A sink's format comes from, in order of precedence:

1. ``PIPELINE_SINK_FORMAT`` (config): ``iceberg``, ``delta`` or ``epochal`` for every sink, or per table
   ``paid_orders=iceberg,merchant_revenue=delta`` (tables not named keep their job-API format);
2. the job API: ``Stream.sink(table, format="iceberg")``;
3. the default, :data:`DEFAULT_FORMAT`.

Every format keeps Epochal's commit log (``_commits/``, :class:`~pipeline.sink.table.CommittedTable`) as the
job's own lineage index (quality suites, ``checkpoints`` tooling). ``iceberg`` and ``delta`` additionally
commit every checkpoint into an open table that any engine can read (see ``docs/table-formats.md``).
"""
from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from pipeline.exceptions import ConfigError
from pipeline.sink.delta import DeltaLakeTable
from pipeline.sink.iceberg import IcebergTable, iceberg_commits_counted
from pipeline.sink.table import CommittedTable

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import PipelineConfig
    from pipeline.fileio import FileIO
    from pipeline.sink.table import CommittedTable

__all__ = ["TableFormat", "DEFAULT_FORMAT", "parse_format_override", "resolve_format", "open_sink_table"]


class TableFormat(Enum):
    EPOCHAL = "epochal"   # staged Parquet + the _commits/ log only (readable through `epochal export`)
    ICEBERG = "iceberg"   # Apache Iceberg via pyiceberg (catalog: embedded SQLite, or REST/Glue/Hive)
    DELTA = "delta"       # Delta Lake via delta-rs (the `deltalake` package)

    @classmethod
    def parse(cls, value: "str | TableFormat", what: str = "format") -> "TableFormat":
        if isinstance(value, TableFormat):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ConfigError(f"{what}={value!r}: sink format must be one of "
                              f"{[f.value for f in cls]}") from None


DEFAULT_FORMAT = TableFormat.EPOCHAL


def parse_format_override(spec: str) -> tuple[TableFormat | None, dict[str, TableFormat]]:
    """``PIPELINE_SINK_FORMAT``: ``""`` | ``<format>`` | ``<table>=<format>[,<table>=<format>...]``."""
    spec = (spec or "").strip()
    if not spec:
        return None, {}
    if "=" not in spec:
        return TableFormat.parse(spec, "PIPELINE_SINK_FORMAT"), {}
    per: dict[str, TableFormat] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        table, sep, fmt = part.partition("=")
        if not sep or not table.strip():
            raise ConfigError(f"PIPELINE_SINK_FORMAT={spec!r}: expected <format> or <table>=<format>,...")
        per[table.strip()] = TableFormat.parse(fmt, f"PIPELINE_SINK_FORMAT ({table.strip()})")
    return None, per


def resolve_format(table: str, job_format: "str | TableFormat | None", override: str) -> TableFormat:
    """The format of sink ``table``: config override > job API > :data:`DEFAULT_FORMAT`."""
    every, per = parse_format_override(override)
    if table in per:
        return per[table]
    if every is not None:
        return every
    if job_format is not None:
        return TableFormat.parse(job_format, f"sink {table!r} format")
    return DEFAULT_FORMAT


def open_sink_table(fileio: "FileIO", config: "PipelineConfig", job: str, table: str, *, mode: str = "append",
                    key: tuple[str, ...] = (), fmt: TableFormat = DEFAULT_FORMAT,
                    partition_by: tuple[str, ...] = ()) -> "CommittedTable":
    """The sink table object of ``fmt`` (a :class:`CommittedTable`, or a subclass for an open format)."""
    if fmt is TableFormat.ICEBERG:
        return IcebergTable(fileio, config, job, table, mode=mode, key=key, partition_by=partition_by)
    if fmt is TableFormat.DELTA:
        return DeltaLakeTable(fileio, config, job, table, mode=mode, key=key, partition_by=partition_by)
    return CommittedTable(fileio, config.sink_uri, job, table)


def sink_requests_counting(fmt: TableFormat, config: "PipelineConfig") -> str:
    """Whether a sink table's S3 requests are in a checkpoint's counted requests
    (``CheckpointStats.sink_s3_requests_counting``): the staged files are written by the executors through
    Epochal's counted :class:`~pipeline.fileio.S3FileIO` in every format; the commit (on the driver) is counted
    when the format's client goes through it too: Epochal's own format, Iceberg with the embedded catalog
    (:mod:`pipeline.sink.iceberg_io`); never delta-rs (its Rust ``object_store`` client has no request hooks)."""
    if not str(config.sink_uri).lower().startswith("s3://"):
        return "not on S3"
    if fmt is TableFormat.ICEBERG:
        return ("counted (staging; commits through pyiceberg on Epochal's S3 client)"
                if iceberg_commits_counted(config) else
                "staging counted; commits not counted (pyiceberg's own S3 client: named catalog or "
                "EPOCHAL_ICEBERG_COUNTED_IO=0)")
    if fmt is TableFormat.DELTA:
        return "staging counted; commits not counted (delta-rs: Rust object_store, no request hooks)"
    return "counted (Epochal's S3 FileIO: staging and commits)"
