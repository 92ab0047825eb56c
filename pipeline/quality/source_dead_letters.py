"""Source bad records: the dead letters on disk against the records the runtime's reader rejects in the prefix.

A source's bad records (an unparseable file, a row whose key is null or empty, whose ``_ingest_ts`` is null, whose
values cannot be cast: :mod:`pipeline.source.reader`) never reach an operator, so no other suite sees them: a deleted
dead-letter file would leave state and output exactly as the batch meaning says. Here, per source:

* **expected**: the records of the validated prefix (every file before the checkpoint's barrier, the barrier's file
  up to its row) that the runtime's reader rejects, found by that reader in Spark tasks - only over the files that
  may hold one: a local Parquet file whose footer has every declared column with exactly its type and whose
  statistics show no null key, no empty key and no null ``_ingest_ts`` has none (the test ``bootstrap`` uses, one
  footer read per file), so a clean source costs footers only;
* **actual**: the records of the source's dead-letter files on disk
  (``<dl>/<job>/<source>/partition=<p>/<seq>-<row_start>.jsonl``, one JSON line per record), inside the prefix.

Both are sets of ``(partition, seq, row)`` (``row`` null: a whole unparseable file), compared as sets: a rewind or a
round cut elsewhere writes the same records again under other file names, which is not a difference. A deleted or
truncated dead-letter file gives ``only_expected``, a record on disk the reader does not reject gives ``only_actual``
(object ``dead_letters/source=<name>`` of dataset ``users_read``). Source-contract records (``_contract/``: a file
that changed or arrived late, :mod:`pipeline.source.contract`) are about files, not records, and are not compared.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping

import pyarrow as pa

from pipeline.batch.bootstrap.suspects import read_suspect_splits, suspect_splits
from pipeline.batch.evaluation.prefix import Prefix
from pipeline.batch.evaluation.source_read import prefix_files
from pipeline.exceptions import StorageError
from pipeline.fileio import file_io_for
from pipeline.job import SourceNode
from pipeline.layout import checkpoint_dir_name
from pipeline.source.layout import SourceFile
from pipeline.source.planner import Split
from pipeline.source.reader import SplitReader, make_split_reader
from pipeline.source.summary import summarize_file

__all__ = ["source_dead_letter_rows", "disk_records", "in_prefix"]

Record = tuple[int, int, int | None]          # (partition, seq, row); row None: a whole unparseable file
_SCHEMA = pa.schema([("source", pa.string()), ("partition", pa.int64()), ("seq", pa.int64()), ("row", pa.int64()),
                     ("error", pa.string())])
MAX_EXAMPLES = 5


def in_prefix(stops: Mapping[int, tuple[int, int]], partition: int, seq: int, row: int | None) -> bool:
    """Whether a record lies before the barrier (``stops``: partition -> (seq, row) of the barrier)."""
    stop = stops.get(int(partition))
    if stop is None:
        return False
    bseq, brow = stop
    return seq < bseq or (seq == bseq and row is not None and row < brow)


def _prefix_splits(runner, source: SourceNode, stops: Mapping[int, tuple[int, int]],
                   files_of: dict[str, SourceFile]) -> list[Split]:
    """The prefix's splits of ``source`` (the batch evaluation's listing: a file log, or a lake table's commits): a
    whole file before the barrier has ``row_end=-1`` (its rows are read from its footer in the task), the barrier's
    file ends at the barrier's row. ``files_of`` collects uri -> file."""
    out = []
    for src, part, seq, uri, fmt, size, stop, lake_ts in prefix_files(runner, source, stops):
        files_of[uri] = SourceFile(src, part, seq, uri, fmt, size, lake_ts)
        out.append(Split(src, part, seq, uri, fmt, 0, -1 if stop is None else stop, lake_ts))
    return out


def _whole_file(files_of: Mapping[str, SourceFile]) -> Callable[[Split], Split]:
    """Completes a split of a whole file before the barrier (``row_end=-1``) with its rows from the footer."""
    def prepare(s: Split) -> Split:
        if s.row_end != -1:
            return s
        summary = summarize_file(files_of[s.uri])
        return Split(s.source, s.partition, s.seq, s.uri, s.format, 0, None if summary.corrupt else summary.rows,
                     s.ingest_ts)
    return prepare


def _records(split: Split, lines: list[str]) -> list[tuple]:
    """A split's dead-letter lines as rows of :data:`_SCHEMA`."""
    out = []
    for line in lines:
        rec = json.loads(line)
        out.append((split.source, int(rec.get("partition", split.partition)), int(rec.get("seq", split.seq)),
                    rec.get("row"), str(rec.get("error", ""))))
    return out


def expected_records(runner, job, prefix: Prefix, *, max_tasks: int = 16) -> dict[str, list[tuple]]:
    """Per source: ``(partition, seq, row, error)`` of every record of the prefix the runtime's reader rejects (its
    dead-letter lines collected, not written)."""
    readers: dict[str, SplitReader] = {}
    todo: list[Split] = []
    files_of: dict[str, SourceFile] = {}
    for src in job.sources():
        splits = _prefix_splits(runner, src, prefix.stops(src.name), files_of)
        sus = suspect_splits(src, splits)
        if sus:
            readers[src.name] = make_split_reader(src.schema, (src.key,) if src.key else (), "dead_letter",
                                                  "file:///nonexistent", job.name)
            todo += sus
    out: dict[str, list[tuple]] = {s.name: [] for s in job.sources()}
    if not todo:
        return out
    got = read_suspect_splits(runner, readers, todo, prepare=_whole_file(files_of), lines_to_rows=_records,
                              schema=_SCHEMA, max_tasks=max_tasks)
    for r in got.to_pylist():
        out[r["source"]].append((r["partition"], r["seq"], r["row"], r["error"]))
    return out


def disk_records(runner, source: str) -> dict[Record, str]:
    """The records of ``source``'s dead-letter files on disk: ``(partition, seq, row)`` -> the file holding it."""
    root = getattr(runner.ctx, "dead_letter_root", None) or getattr(runner, "dead_letter_root", None)
    if not root:
        return {}
    fio = file_io_for(root)
    prefix = f"{root.rstrip('/')}/{runner.job.name}/{source}/"
    try:
        files = [f.uri for f in fio.list(prefix, recursive=True)]
    except StorageError:
        return {}
    out: dict[Record, str] = {}
    for uri in sorted(files):
        if "/_contract/" in uri or not uri.endswith(".jsonl"):
            continue
        for line in fio.read_bytes(uri).splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            row = rec.get("row")
            out.setdefault((int(rec["partition"]), int(rec["seq"]), None if row is None else int(row)), uri)
    return out


def source_dead_letter_rows(runner, md, prefix: Prefix) -> tuple[list[dict], list[dict]]:
    """Dataset ``users_read`` rows (one per source) and examples: the source's dead letters on disk inside the prefix
    against the records the runtime's reader rejects there."""
    job = runner.job
    expected = expected_records(runner, job, prefix)
    rows, examples = [], []
    for src in job.sources():
        stops = prefix.stops(src.name)
        exp: dict[Record, str] = {}
        for p, seq, row, err in expected.get(src.name, ()):
            if in_prefix(stops, p, seq, row):
                exp[(int(p), int(seq), None if row is None else int(row))] = err
        act = {k: u for k, u in disk_records(runner, src.name).items()
               if in_prefix(stops, *k)}
        if not exp and not act:
            continue
        only_e = sorted(set(exp) - set(act), key=_order)
        only_a = sorted(set(act) - set(exp), key=_order)
        obj = f"dead_letters/source={src.name}"
        examples += [{"object": obj, "side": "only_expected", "partition": k[0], "seq": k[1], "row": k[2],
                      "error": exp[k]} for k in only_e[:MAX_EXAMPLES]]
        examples += [{"object": obj, "side": "only_actual", "partition": k[0], "seq": k[1], "row": k[2],
                      "file": act[k]} for k in only_a[:MAX_EXAMPLES]]
        rows.append({"object": obj, "kind": "source dead letters", "version": checkpoint_dir_name(md.checkpoint_id),
                     "rows_expected": len(exp), "rows_actual": len(act), "only_expected": len(only_e),
                     "only_actual": len(only_a)})
    return rows, examples


def _order(k: Record) -> tuple[int, int, int]:
    return (k[0], k[1], -1 if k[2] is None else k[2])
