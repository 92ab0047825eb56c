"""The table format of a sink (:class:`TableFormat`) and how it is chosen (:func:`resolve_format`), apart from the
table classes (:mod:`pipeline.sink.formats`), so that the configuration can check ``PIPELINE_SINK_FORMAT`` without
importing them.

A sink's format comes from, in order of precedence:

1. ``PIPELINE_SINK_FORMAT`` (config): ``iceberg``, ``delta`` or ``epochal`` for every sink, or per table
   ``paid_orders=iceberg,merchant_revenue=delta`` (tables not named keep their job-API format);
2. the job API: ``Stream.sink(table, format="iceberg")``;
3. the default, :data:`DEFAULT_FORMAT`.
"""
from __future__ import annotations

from enum import Enum

from pipeline.exceptions import ConfigError

__all__ = ["TableFormat", "DEFAULT_FORMAT", "parse_format_override", "resolve_format"]


class TableFormat(Enum):
    EPOCHAL = "epochal"   # staged Parquet + the _commits/ log only (readable through `epochal export`)
    ICEBERG = "iceberg"   # Apache Iceberg via pyiceberg (catalog: embedded SQLite, or REST/Glue/Hive)
    DELTA = "delta"       # Delta Lake via delta-rs (the `deltalake` package)

    @classmethod
    def parse(cls, value: str | TableFormat, what: str = "format") -> TableFormat:
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


def resolve_format(table: str, job_format: str | TableFormat | None, override: str) -> TableFormat:
    """The format of sink ``table``: config override > job API > :data:`DEFAULT_FORMAT`."""
    every, per = parse_format_override(override)
    if table in per:
        return per[table]
    if every is not None:
        return every
    if job_format is not None:
        return TableFormat.parse(job_format, f"sink {table!r} format")
    return DEFAULT_FORMAT
