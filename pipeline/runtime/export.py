"""Read side: committed sink rows and operator state, written as Parquet by Spark (not via the driver)."""
from __future__ import annotations

import os
import shutil
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["export_table", "export_state", "files_with_tag_dataframe"]


def _schema_of(uri: str) -> pa.Schema:
    from pipeline.fileio import file_io_for
    with file_io_for(uri).open_input(uri) as f:
        return pq.read_schema(f)


def files_with_tag_dataframe(spark, files: Sequence[tuple[str, int]], schema: pa.Schema):
    """Rows of Parquet files plus an ``_txn`` column (the checkpoint id that committed each file)."""
    from pipeline.runtime.dataflow import schema_ddl
    out_schema = schema.append(pa.field("_txn", pa.int64()))

    files = list(files)
    n = max(1, min(len(files), 16))

    def read(batches):
        from pipeline.fileio import file_io_for
        for b in batches:
            for task in b.column(0).to_pylist():
                for uri, txn in files[task::n]:
                    with file_io_for(uri).open_input(uri) as f:
                        t = pq.read_table(f).select(schema.names).cast(schema)
                    t = t.append_column("_txn", pa.array([txn] * t.num_rows, type=pa.int64()))
                    yield from t.to_batches(max_chunksize=50_000)

    return spark.range(0, n, 1, n).mapInArrow(read, schema_ddl(out_schema))


def _write(df, to_dir: str) -> None:
    path = os.path.abspath(to_dir.removeprefix("file://"))
    if os.path.exists(path):
        shutil.rmtree(path)
    df.write.mode("overwrite").parquet(path)


def export_table(spark, table, to_dir: str) -> dict:
    """``table``: a :class:`pipeline.sink.table.CommittedTable`. Upsert tables keep the newest row per key."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pipeline.sink.open_table import OpenFormatTable
    if isinstance(table, OpenFormatTable) and table.exists():
        return _export_open_table(spark, table, to_dir)
    chain = table.lineage()
    files = [(f.uri, e.checkpoint_id) for e in chain for f in e.files]
    if not files:
        os.makedirs(os.path.abspath(to_dir.removeprefix("file://")), exist_ok=True)
        return {"table": table.table, "to": to_dir, "rows": 0, "files": 0,
                "head": chain[-1].checkpoint_id if chain else None}
    schema = _schema_of(files[0][0])
    df = files_with_tag_dataframe(spark, files, schema)
    head = chain[-1]
    if head.mode == "upsert":
        w = Window.partitionBy(*head.key).orderBy(F.col("_txn").desc())
        df = df.withColumn("_rn", F.row_number().over(w)).filter("_rn = 1").drop("_rn")
    df = df.drop("_txn")
    _write(df, to_dir)
    rows = sum(e.rows for e in chain) if head.mode != "upsert" else None
    if rows is None:
        rows = spark.read.parquet(os.path.abspath(to_dir.removeprefix("file://"))).count()
    return {"table": table.table, "to": to_dir, "rows": rows, "files": len(files), "head": head.checkpoint_id,
            "lineage": [e.checkpoint_id for e in chain]}


def _export_open_table(spark, table, to_dir: str) -> dict:
    """An Iceberg/Delta sink: the data files of the table's current snapshot/version are exactly its rows."""
    files = [(u, 0) for u in table.current_files()]
    head = table.current_checkpoint()
    if not files:
        os.makedirs(os.path.abspath(to_dir.removeprefix("file://")), exist_ok=True)
        return {"table": table.table, "to": to_dir, "rows": 0, "files": 0, "head": head,
                "format": table.format_name, "version": table.version_id()}
    df = files_with_tag_dataframe(spark, files, table.table_schema()).drop("_txn")
    _write(df, to_dir)
    rows = spark.read.parquet(os.path.abspath(to_dir.removeprefix("file://"))).count()
    return {"table": table.table, "to": to_dir, "rows": rows, "files": len(files), "head": head,
            "format": table.format_name, "version": table.version_id()}


def export_state(spark, snapshot, operator_uid: str, to_dir: str) -> dict:
    """One operator's state of a checkpoint/savepoint, all state names, with ``_state`` and ``_kg`` columns."""
    from pyspark.sql import functions as F
    handles = [h for h in snapshot.metadata.operators[operator_uid] if h.file is not None]
    names = sorted({h.name for h in handles})
    dfs = []
    for name in names:
        files = [(h.file.uri, h.subtask) for h in handles if h.name == name]
        schema = _schema_of(files[0][0])
        dfs.append(files_with_tag_dataframe(spark, files, schema).withColumnRenamed("_txn", "_subtask")
                   .withColumn("_state", F.lit(name)))
    rows = sum(h.rows for h in handles)
    if not dfs:
        os.makedirs(os.path.abspath(to_dir.removeprefix("file://")), exist_ok=True)
    else:
        df = dfs[0]
        for d in dfs[1:]:
            df = df.unionByName(d, allowMissingColumns=True)
        _write(df, to_dir)
    return {"checkpoint": snapshot.describe(), "operator": operator_uid, "states": names, "rows": rows,
            "to": to_dir}
