"""Partitioned sinks: how a row's partition values become a Hive-style directory and a Delta partition value.

A sink with ``partition_by=("dt", "hm")`` stages each file under ``.../txn-<id>/dt=<v>/hm=<v>/`` with one value
per partition column (the writer splits its rows, :mod:`pipeline.runtime.operators.sink_writer`). The files keep the
partition columns (every reader sees the same rows whether it reads the files or the table format); Delta's add
actions carry the values as ``partitionValues`` (the directory names, decoded), Iceberg infers its identity
partitions from the files. Values are serialised as Delta serialises partition values: strings as they are,
integers in decimal, booleans ``true``/``false``, dates ``YYYY-MM-DD``; a null is ``__HIVE_DEFAULT_PARTITION__``
in the path and null in Delta. Characters outside ``[A-Za-z0-9-_.:+,@]`` are written ``~HH`` per UTF-8 byte in
directory names (:func:`escape`).
"""
from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from pipeline.exceptions import ConfigError

__all__ = ["NULL_PARTITION", "partition_value", "partition_dir", "partition_values", "check_partition_types"]

NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


def partition_value(v: Any) -> str | None:
    """A partition value as Delta serialises it (None: null)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, datetime.datetime):
        raise TypeError("timestamps cannot be partition values (derive a date or an hour string with select)")
    if isinstance(v, datetime.date):
        return v.isoformat()
    return str(v)


_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.:+,@")
_ESCAPED = re.compile(r"((?:~[0-9A-F]{2})+)")


def escape(value: str) -> str:
    """A partition value as a path segment: safe characters as they are, every other byte as ``~HH`` (no ``%``:
    URI readers decode ``%XX`` in paths and would open another file; the tables' own metadata carries the value)."""
    return "".join(ch if ch in _SAFE else "".join(f"~{b:02X}" for b in ch.encode()) for ch in value)


def unescape(segment: str) -> str:
    return _ESCAPED.sub(lambda m: bytes.fromhex(m.group(1).replace("~", "")).decode(), segment)


def partition_dir(columns: Sequence[str], values: Sequence[Any]) -> str:
    """``c1=v1/c2=v2`` for one combination of partition values."""
    out = []
    for c, v in zip(columns, values):
        s = partition_value(v)
        out.append(f"{c}={NULL_PARTITION if s is None else escape(s)}")
    return "/".join(out)


def partition_values(uri: str, columns: Sequence[str]) -> dict[str, str | None]:
    """The partition values a staged file's path encodes (``{}`` for an unpartitioned sink)."""
    if not columns:
        return {}
    found: dict[str, str | None] = {}
    for seg in uri.split("/"):
        name, eq, value = seg.partition("=")
        if eq and name in columns:
            found[name] = None if value == NULL_PARTITION else unescape(value)
    missing = [c for c in columns if c not in found]
    if missing:
        raise ValueError(f"staged file {uri} has no directory for partition column(s) {missing}")
    return {c: found[c] for c in columns}


def check_partition_types(table: str, schema: pa.Schema, columns: Sequence[str]) -> None:
    """Refuse partition columns that are missing or of a type without a stable text form."""
    for c in columns:
        if c not in schema.names:
            raise ConfigError(f"sink {table!r}: partition column {c!r} is not a column of its stream "
                              f"(has {schema.names})")
        t = schema.field(c).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
                or pa.types.is_boolean(t) or pa.types.is_date32(t)):
            raise ConfigError(f"sink {table!r}: partition column {c!r} is {t}; use a string, integer, boolean or "
                              "date column (e.g. select(\"date_format(ts, 'yyyy-MM-dd') AS dt\"))")
