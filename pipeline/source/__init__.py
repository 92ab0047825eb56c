"""Sources: the layout of partitioned append-only file logs, planning of barriers and segments (driver),
and reading of splits on the executors (with dead letters).

See :mod:`pipeline.source.layout`, :mod:`pipeline.source.summary`, :mod:`pipeline.source.positions`,
:mod:`pipeline.source.planner` and :mod:`pipeline.source.reader`.
"""
from __future__ import annotations

from pipeline.source.layout import (
                                    SourceFile,
                                    SourceListing,
                                    UnexpectedFile,
                                    dead_letter_unexpected,
                                    list_source_files,
                                    scan_source,
                                    source_file_uri,
)
from pipeline.source.planner import (
                                    Segment,
                                    Split,
                                    allocate_records,
                                    count_rows,
                                    plan_segment,
                                    plan_segments,
                                    splits_table,
)
from pipeline.source.positions import (
                                    barrier_position,
                                    barrier_positions,
                                    end_position,
                                    end_positions,
                                    normalize_position,
                                    resolve_barrier,
)
from pipeline.source.reader import (
                                    SplitReader,
                                    dead_letter_counts,
                                    dead_letter_uri,
                                    make_split_reader,
                                    read_split_table,
                                    reader_output_schema,
)
from pipeline.source.summary import (
                                    FileStatus,
                                    FileSummary,
                                    clear_summary_cache,
                                    summarize_file,
                                    summarize_files,
                                    summarize_source,
)

__all__ = [
    "SourceFile", "SourceListing", "UnexpectedFile", "scan_source", "list_source_files", "source_file_uri",
    "dead_letter_unexpected",
    "FileStatus", "FileSummary", "Split", "Segment", "summarize_file", "summarize_files", "summarize_source",
    "clear_summary_cache", "normalize_position", "barrier_position", "resolve_barrier", "barrier_positions", "end_position",
    "end_positions", "count_rows", "plan_segment", "plan_segments", "allocate_records", "splits_table",
    "SplitReader", "make_split_reader", "reader_output_schema", "dead_letter_uri", "dead_letter_counts",
    "read_split_table",
]
