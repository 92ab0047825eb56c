"""Arrow schemas as Spark DDL strings: the one mapping Epochal uses wherever a Python task hands Arrow batches to
Spark (``mapInArrow(fn, ddl)``: operator tasks, source readers, task reports, quality summaries).

Timestamps map to ``timestamp`` (Spark's instant type) whatever their Arrow time zone: every time column of
Epochal is UTC and the session time zone is UTC (:data:`pipeline.runtime.spark.session.SQL_CONF`). Unsupported types are
a :class:`~pipeline.exceptions.ConfigError` naming the type.
"""
from __future__ import annotations

import pyarrow as pa

from pipeline.exceptions import ConfigError

__all__ = ["spark_ddl_type", "schema_ddl"]

_SIMPLE: tuple[tuple[object, str], ...] = (
    (pa.types.is_string, "string"), (pa.types.is_large_string, "string"),
    (pa.types.is_float64, "double"), (pa.types.is_float32, "float"),
    (pa.types.is_int64, "bigint"), (pa.types.is_int32, "int"), (pa.types.is_int16, "smallint"),
    (pa.types.is_int8, "tinyint"), (pa.types.is_boolean, "boolean"), (pa.types.is_timestamp, "timestamp"),
    (pa.types.is_date32, "date"), (pa.types.is_binary, "binary"), (pa.types.is_large_binary, "binary"),
)


def spark_ddl_type(t: pa.DataType) -> str:
    """The Spark SQL type of Arrow type ``t`` (``decimal(p,s)``, ``array<...>`` included)."""
    for test, name in _SIMPLE:
        if test(t):  # type: ignore[operator]
            return name
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"array<{spark_ddl_type(t.value_type)}>"
    raise ConfigError(f"unsupported column type {t}")


def schema_ddl(schema: pa.Schema) -> str:
    """``schema`` as a Spark DDL column list (names quoted)."""
    return ", ".join(f"`{f.name}` {spark_ddl_type(f.type)}" for f in schema)
