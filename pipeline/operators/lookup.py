"""The lookup join's kernel and its side-table reference (Flink's lookup join ``FOR SYSTEM_TIME AS OF`` against a
bounded table; Nexmark q13).

A stream is joined with a **bounded side table** (a Parquet file or directory, a Delta table or an Iceberg table).
Every epoch joins against one pinned version of the table (:mod:`pipeline.lookup`); this module is the pure part:
the table reference (:class:`SideTable`) and the join of one batch of stream rows with one version's rows
(:func:`lookup_rows`). No Spark, no I/O.

Join rule (docs/operators.md "Lookup join"): a stream row is paired with every side row whose key equals its key
(SQL equality: a null key on either side matches nothing); ``how="inner"`` drops a row with no partner,
``how="left"`` keeps it once with nulls in the side columns. The side key is not repeated in the output (it equals
the stream key).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.exceptions import ConfigError

__all__ = ["SideTableFormat", "SideTable", "LOOKUP_HOWS", "lookup_rows", "normalized_type", "normalized_schema"]

LOOKUP_HOWS = ("inner", "left")


class SideTableFormat(str, Enum):
    PARQUET = "parquet"
    DELTA = "delta"
    ICEBERG = "iceberg"


@dataclass(frozen=True, slots=True)
class SideTable:
    """``<format>:<uri>``: a Parquet file or directory, a Delta table or an Iceberg table (its directory, holding
    ``metadata/``). A URI without a scheme is relative to the job's source root (``PIPELINE_SOURCE_URI``)."""

    format: SideTableFormat
    uri: str

    @classmethod
    def parse(cls, spec: str, where: str) -> SideTable:
        fmt, sep, uri = (spec or "").partition(":")
        if not sep or not uri or fmt not in {f.value for f in SideTableFormat}:
            raise ConfigError(f"{where}: table={spec!r}; use 'parquet:<uri>', 'delta:<uri>' or 'iceberg:<uri>'")
        return cls(SideTableFormat(fmt), uri)

    @property
    def spec(self) -> str:
        return f"{self.format.value}:{self.uri}"

    def resolved(self, source_root: str) -> SideTable:
        """The table with a relative URI made absolute against ``source_root``."""
        if "://" in self.uri or self.uri.startswith("/"):
            return self if "://" in self.uri else SideTable(self.format, "file://" + self.uri)
        return SideTable(self.format, source_root.rstrip("/") + "/" + self.uri.lstrip("./"))


def normalized_type(t: pa.DataType) -> pa.DataType:
    """The type Spark hands back for ``t`` (large/view strings and binaries as plain ones, timestamps in UTC µs)."""
    if pa.types.is_large_string(t) or (hasattr(pa.types, "is_string_view") and pa.types.is_string_view(t)):
        return pa.string()
    if pa.types.is_large_binary(t) or (hasattr(pa.types, "is_binary_view") and pa.types.is_binary_view(t)):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC")
    if pa.types.is_dictionary(t):
        return normalized_type(t.value_type)
    return t


def normalized_schema(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, normalized_type(f.type), True) for f in schema])


def lookup_rows(rows: pa.Table, side: pa.Table, stream_key: str, table_key: str, how: str,
                columns: tuple[str, ...]) -> pa.Table:
    """``rows`` joined with ``side`` on ``rows[stream_key] == side[table_key]``: every stream column, then
    ``columns`` of the side table (nullable). ``how``: ``inner`` or ``left`` (see the module docstring). Row order
    is not kept (a multiset, as SQL)."""
    if how not in LOOKUP_HOWS:
        raise ConfigError(f"lookup join: how={how!r}; use one of {LOOKUP_HOWS}")
    ktype = side.schema.field(table_key).type
    key = rows.column(stream_key)
    if pa.types.is_integer(ktype) and pa.types.is_integer(key.type):  # compared as SQL compares them: by value
        ktype = pa.int64()
        side = side.set_column(side.schema.get_field_index(table_key), table_key,
                               pc.cast(side.column(table_key), ktype))
    if key.type != ktype:
        try:
            key = pc.cast(key, ktype)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise ConfigError(f"lookup join: stream key {stream_key!r} ({rows.schema.field(stream_key).type}) cannot "
                              f"be compared with the side table's key {table_key!r} ({ktype}): {e}") from None
    side = side.select([table_key, *columns])
    idx_name = "__lookup_row"
    probe = pa.table({"__k": key, idx_name: pa.array(range(rows.num_rows), pa.int64())})
    build = side.rename_columns(["__k", *[f"__s{i}" for i in range(len(columns))]])
    build = build.append_column("__sidx", pa.array(range(build.num_rows), pa.int64()))
    pairs = probe.join(build.select(["__k", "__sidx"]), keys="__k", join_type="inner", use_threads=False)
    left_idx = pairs.column(idx_name)
    side_idx = pairs.column("__sidx")
    if how == "left":
        matched = pc.is_in(probe.column(idx_name), value_set=pc.unique(left_idx))
        unmatched = pc.filter(probe.column(idx_name), pc.invert(matched))
        left_idx = pa.chunked_array(left_idx.chunks + [unmatched.combine_chunks()
                                                        if isinstance(unmatched, pa.ChunkedArray) else unmatched],
                                    pa.int64())
        side_idx = pa.chunked_array(side_idx.chunks + [pa.nulls(len(unmatched), pa.int64())], pa.int64())
    out = rows.take(left_idx)
    for c in columns:
        out = out.append_column(pa.field(c, side.schema.field(c).type, True), side.column(c).take(side_idx))
    return out
