"""The table factory of sinks: the table of each format (:func:`open_sink_table`); which format a sink has is
:mod:`pipeline.sink.table_format`.

Every format keeps Epochal's commit log (``_commits/``, :class:`~pipeline.sink.table.CommittedTable`) as the
job's own lineage index (quality suites, ``checkpoints`` tooling). ``iceberg`` and ``delta`` additionally
commit every checkpoint into an open table that any engine can read (see ``docs/table-formats.md``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.sink.delta import DeltaLakeTable
from pipeline.sink.iceberg import IcebergTable, iceberg_commits_counted
from pipeline.sink.table import CommittedTable
from pipeline.sink.table_format import DEFAULT_FORMAT, TableFormat

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.config import PipelineConfig
    from pipeline.fileio import FileIO
    from pipeline.sink.table import CommittedTable

__all__ = ["open_sink_table"]




def open_sink_table(fileio: FileIO, config: PipelineConfig, job: str, table: str, *, mode: str = "append",
                    key: tuple[str, ...] = (), fmt: TableFormat = DEFAULT_FORMAT,
                    partition_by: tuple[str, ...] = ()) -> CommittedTable:
    """The sink table object of ``fmt`` (a :class:`CommittedTable`, or a subclass for an open format)."""
    if fmt is TableFormat.ICEBERG:
        return IcebergTable(fileio, config, job, table, mode=mode, key=key, partition_by=partition_by)
    if fmt is TableFormat.DELTA:
        return DeltaLakeTable(fileio, config, job, table, mode=mode, key=key, partition_by=partition_by)
    return CommittedTable(fileio, config.sink_uri, job, table)


def sink_requests_counting(fmt: TableFormat, config: PipelineConfig) -> str:
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
