"""One Arrow -> Spark DDL mapping (``pipeline.arrow_ddl``), checked against PySpark's own Arrow type mapping
(``pyspark.sql.pandas.types.from_arrow_type``, pure Python: no JVM)."""
from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import from_arrow_type

from pipeline.arrow_ddl import schema_ddl, spark_ddl_type
from pipeline.exceptions import ConfigError

pytestmark = [pytest.mark.unit]

AGREE = [pa.string(), pa.large_string(), pa.float64(), pa.float32(), pa.int64(), pa.int32(), pa.int16(), pa.int8(),
         pa.bool_(), pa.date32(), pa.binary(), pa.decimal128(38, 9), pa.decimal128(10, 2),
         pa.timestamp("us", tz="UTC"), pa.list_(pa.int64()), pa.list_(pa.string())]


@pytest.mark.parametrize("t", AGREE, ids=str)
def test_same_type_as_pyspark(t):
    assert spark_ddl_type(t) == from_arrow_type(t).simpleString()


def test_every_timestamp_is_an_instant():
    """Epochal's time columns are UTC instants; a zone-less Arrow timestamp is still read as ``timestamp``."""
    assert spark_ddl_type(pa.timestamp("us")) == "timestamp"


def test_schema_quotes_names_and_unsupported_types_are_named():
    assert schema_ddl(pa.schema([("a b", pa.int64()), ("c", pa.string())])) == "`a b` bigint, `c` string"
    with pytest.raises(ConfigError, match="unsupported column type"):
        spark_ddl_type(pa.struct([("x", pa.int64())]))


def test_runtime_and_quality_ddls_come_from_it():
    from pipeline.quality.normalize import SUMMARY_DDL, SUMMARY_SCHEMA
    from pipeline.runtime.operators.report_codec import REPORT_DDL, REPORT_SCHEMA
    from pipeline.runtime.operators.task import HANDLE_DDL
    assert HANDLE_DDL == REPORT_DDL == schema_ddl(REPORT_SCHEMA) and SUMMARY_DDL == schema_ddl(SUMMARY_SCHEMA)
