"""Executor-side reading of source splits into Arrow batches, with dead letters (used in ``mapInArrow``).

Input batches are rows of splits (:data:`~pipeline.source.planner.SPLIT_SCHEMA`: source, partition, seq,
uri, format, row_start, row_end). Output batches have the declared schema followed by ``_source``
(string), ``_partition`` (int32), ``_seq`` (int64) and ``_row`` (int64, the row index in the file).

Bad input, and what happens to it (policy ``dead_letter`` / ``fail``):

=============================  =============================================  ==========================
problem                        scope                                          dead-letter record
=============================  =============================================  ==========================
file cannot be parsed          whole split (``row_end=None``: whole file)     one record, ``row: null``
declared column missing        every row of the split                         one per row, raw values
column type cannot be cast     every row of the split                         one per row, raw values
value cannot be cast           that row                                       one per row, raw values
key column null or ``""``      that row                                       one per row, raw values
``_ingest_ts`` null            that row                                       one per row, raw values
=============================  =============================================  ==========================

Extra columns are fine (not read). Dead letters of a split go to one file,
``<dead_letter_root>/<job>/<source>/partition=<p>/<seq:08d>-<row_start:08d>.jsonl``, whose content is a
function of the split only, so a retried task or a replayed round rewrites identical bytes. Each line is
``{"file", "source", "partition", "seq", "row", "error", "values"}`` (whole-file records add
``row_start``/``row_end`` and have ``values: null``). With ``fail`` the first problem raises
:class:`~pipeline.exceptions.MalformedInputError` naming the file, source, partition, seq, row and problem.

The good path is vectorised (``pyarrow.compute``); per-record Python runs only to format dead letters.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.exceptions import ConfigError, MalformedInputError, ObjectNotFoundError, SourceError, StorageError
from pipeline.fileio import file_io_for
from pipeline.source._formats import CONTENT_ERRORS, INGEST_TS, TypeMismatch, cast_lenient, json_default, read_jsonl
from pipeline.source.lake import version_of
from pipeline.source.layout import BadRecordsPolicy
from pipeline.source.planner import Split

__all__ = ["META_FIELDS", "SplitReader", "make_split_reader", "reader_output_schema", "dead_letter_uri",
           "dead_letter_counts", "read_split_table"]


META_FIELDS: tuple[pa.Field, ...] = (
    pa.field("_source", pa.string()), pa.field("_partition", pa.int32()),
    pa.field("_seq", pa.int64()), pa.field("_row", pa.int64()),
)
_MAX_BATCH = 65_536
_PLANNED_UNREADABLE = "the file was unreadable when the round was planned; dead-lettered whole"


def reader_output_schema(schema: pa.Schema) -> pa.Schema:
    """Declared schema + ``_source``, ``_partition``, ``_seq``, ``_row`` (all fields nullable)."""
    fields = [pa.field(f.name, f.type) for f in schema] + list(META_FIELDS)
    return pa.schema(fields)


def dead_letter_uri(dead_letter_root: str, job: str, source: str, partition: int, seq: int, row_start: int) -> str:
    return (f"{dead_letter_root.rstrip('/')}/{job}/{source}/partition={partition}/"
            f"{seq:08d}-{row_start:08d}.jsonl")


@dataclass(frozen=True, slots=True)
class _Unreadable:
    """Rows ``[row_start, row_end)`` (``row_end=None``: whole file) that cannot be decoded."""

    row_start: int
    row_end: int | None
    problem: str


@dataclass(frozen=True)
class SplitReader:
    """Picklable callable for ``DataFrame.mapInArrow`` (see :func:`make_split_reader`)."""

    schema: pa.Schema
    key_columns: tuple[str, ...]
    policy: BadRecordsPolicy
    dead_letter_root: str
    job: str

    @property
    def output_schema(self) -> pa.Schema:
        return reader_output_schema(self.schema)

    def __call__(self, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for split in _splits_of(batch):
                yield from self.read_split(split)

    # -- one split --------------------------------------------------------------------------------
    def read_split(self, split: Split, dead_letters: Callable[[Split, list[str]], None] | None = None
                   ) -> Iterator[pa.RecordBatch]:
        """Good rows of ``split`` as batches; bad rows go to the dead-letter file (or raise). ``dead_letters``:
        the split's dead-letter lines go to it instead of the file (a check recomputing what the runtime rejects)."""
        lines: list[str] = []
        mismatch: str | None = None
        for chunk in self._chunks(split):
            if isinstance(chunk, _Unreadable):
                if self.policy == "fail":
                    rows = ("whole file" if chunk.row_end is None
                            else f"rows [{chunk.row_start}, {chunk.row_end})")
                    raise MalformedInputError(f"malformed input in {self._where(split)}, {rows}: {chunk.problem}")
                lines.append(self._record(split, None, chunk.problem, None, chunk.row_start, chunk.row_end))
                continue
            raw, row0 = chunk
            if raw.num_rows == 0:
                continue
            if mismatch is None:
                mismatch = self._schema_problem(raw)
                if mismatch is not None and self.policy == "fail":
                    raise MalformedInputError(f"malformed input in {self._where(split)}, rows "
                                              f"[{split.row_start}, {split.row_end}): {mismatch}")
            if mismatch is not None:  # the schema is the same for every chunk of a file: all rows are bad
                for i, values in enumerate(raw.to_pylist()):
                    lines.append(self._record(split, row0 + i, mismatch, values))
                continue
            good, bad = self._check(split, raw, row0)
            if bad is not None:
                if self.policy == "fail":
                    n = bad.num_rows
                    raise MalformedInputError(
                        f"malformed input in {self._where(split)}, row {bad.column('_row')[0].as_py()}: "
                        f"{bad.column('_error')[0].as_py()} ({n} bad record(s) in rows [{row0}, {row0 + raw.num_rows}))")
                rows = bad.column("_row").to_pylist()
                errs = bad.column("_error").to_pylist()
                for r, e, v in zip(rows, errs, bad.drop_columns(["_row", "_error"]).to_pylist()):
                    lines.append(self._record(split, r, e, v))
            if good.num_rows:
                yield from good.to_batches(max_chunksize=_MAX_BATCH)
        if lines:
            (dead_letters or self.write_dead_letters)(split, lines)

    def write_dead_letters(self, split: Split, lines: list[str]) -> None:
        """Write the dead-letter records of ``split`` (one JSON line each) to its dead-letter file."""
        uri = dead_letter_uri(self.dead_letter_root, self.job, split.source, split.partition, split.seq,
                              split.row_start)

        file_io_for(uri).write_bytes(uri, ("\n".join(lines) + "\n").encode("utf-8"))

    def _where(self, split: Split) -> str:
        return f"{split.uri} (source {split.source}, partition {split.partition}, seq {split.seq})"

    @staticmethod
    def _record(split: Split, row: int | None, error: str, values: dict | None,
                row_start: int | None = None, row_end: int | None = None) -> str:
        rec: dict = {"file": split.uri, "source": split.source, "partition": split.partition, "seq": split.seq,
                     "row": row}
        if row is None:
            rec["row_start"] = row_start
            rec["row_end"] = row_end
        rec["error"] = error
        rec["values"] = values
        return json.dumps(rec, default=json_default, ensure_ascii=False)

    def _schema_problem(self, raw: pa.Table) -> str | None:
        missing = [f.name for f in self.schema if f.name not in raw.column_names]
        if missing:
            return f"schema mismatch: missing column(s) {missing}"
        for f in self.schema:
            try:
                cast_lenient(pa.array([], type=raw.schema.field(f.name).type), f.type)
            except TypeMismatch as e:
                return f"schema mismatch: column {f.name!r}: {e}"
        return None

    # -- reading ------------------------------------------------------------------------------------
    def _chunks(self, split: Split) -> Iterator[tuple[pa.Table, int] | _Unreadable]:
        """Raw row chunks ``(table, file row of its first row)`` of the split, or unreadable ranges."""

        if split.row_end is not None and split.row_end <= split.row_start:
            return
        fio = file_io_for(split.uri)
        try:
            if split.format == "jsonl":
                yield from self._jsonl_chunks(split, fio)
            elif split.ingest_ts is not None:
                yield from _with_commit_time(self._parquet_chunks(split, fio), split.ingest_ts)
            else:
                yield from self._parquet_chunks(split, fio)
        except ObjectNotFoundError as e:
            if split.ingest_ts is not None:
                raise SourceError(f"data file of a lake table disappeared: {self._where(split)}, table version "
                                  f"{version_of(split.seq)}; table retention (VACUUM, snapshot "
                                  "expiry) deleted a file the job had not read") from e
            raise SourceError(f"source file disappeared (source files must never be deleted or replaced): "
                              f"{self._where(split)}") from e
        except StorageError as e:
            raise SourceError(f"cannot read source file {self._where(split)}: {e}") from e

    def _beyond(self, split: Split, total: int) -> SourceError:
        return SourceError(f"split rows [{split.row_start}, {split.row_end}) beyond the {total} rows of "
                           f"{self._where(split)}: was the file replaced?")

    def _jsonl_chunks(self, split: Split, fio) -> Iterator[tuple[pa.Table, int] | _Unreadable]:
        try:
            table = read_jsonl(fio.read_bytes(split.uri))
        except CONTENT_ERRORS as e:
            yield _Unreadable(split.row_start, split.row_end, f"unreadable JSON Lines file: {e}")
            return
        if split.row_end is None:
            yield _Unreadable(split.row_start, None, _PLANNED_UNREADABLE)
            return
        if split.row_end > table.num_rows:
            raise self._beyond(split, table.num_rows)
        yield table.slice(split.row_start, split.row_end - split.row_start), split.row_start

    def _parquet_chunks(self, split: Split, fio) -> Iterator[tuple[pa.Table, int] | _Unreadable]:
        streams: list = []

        def open_file(from_bytes: bool) -> pq.ParquetFile:
            src = pa.BufferReader(fio.read_bytes(split.uri)) if from_bytes else fio.open_input(split.uri)
            streams.append(src)
            return pq.ParquetFile(src)

        try:
            yield from self._parquet_rows(split, open_file)
        finally:
            for src in streams:
                src.close()

    def _parquet_rows(self, split: Split, open_file) -> Iterator[tuple[pa.Table, int] | _Unreadable]:
        in_memory = False
        try:
            try:
                pf = open_file(False)
            except OSError:  # I/O trouble or a strange file: decode the bytes read through FileIO instead
                in_memory = True
                pf = open_file(True)
        except CONTENT_ERRORS + (OSError,) as e:
            yield _Unreadable(split.row_start, split.row_end, f"unreadable parquet file: {e}")
            return
        md = pf.metadata
        if split.row_end is None:
            yield _Unreadable(split.row_start, None, _PLANNED_UNREADABLE)
            return
        if split.row_end > md.num_rows:
            raise self._beyond(split, md.num_rows)
        names = set(pf.schema_arrow.names)
        declared = [f.name for f in self.schema if split.ingest_ts is None or f.name != INGEST_TS]
        # all declared columns present: read only those; otherwise every column (raw dead letters)
        columns = declared if all(n in names for n in declared) else None
        offset = 0
        for i in range(md.num_row_groups):
            n = md.row_group(i).num_rows
            lo, hi = max(split.row_start, offset), min(split.row_end, offset + n)
            if lo < hi:
                table, problem = None, ""
                try:
                    table = pf.read_row_group(i, columns=columns)
                except CONTENT_ERRORS as e:
                    problem = str(e)
                except OSError as e:
                    problem = str(e)
                    if not in_memory:  # retry from bytes once: tells network trouble from corrupt pages
                        in_memory = True
                        pf = open_file(True)
                        try:
                            table = pf.read_row_group(i, columns=columns)
                        except CONTENT_ERRORS + (OSError,) as e2:
                            problem = str(e2)
                if table is None:
                    yield _Unreadable(lo, hi, f"unreadable parquet row group {i}: {problem}")
                else:
                    yield table.slice(lo - offset, hi - lo), lo
            offset += n
            if offset >= split.row_end:
                break

    # -- validation -----------------------------------------------------------------------------------
    def _check(self, split: Split, raw: pa.Table, row0: int) -> tuple[pa.Table, pa.Table | None]:
        """(good rows in the output schema, bad raw rows + ``_row`` + ``_error`` or None). Vectorised."""
        n = raw.num_rows
        errors: pa.Array | None = None  # per-row error message (null = fine), first problem wins

        def note(mask: np.ndarray | pa.Array, message: str) -> None:
            nonlocal errors
            m = mask if isinstance(mask, pa.Array) else pa.array(mask, type=pa.bool_())
            m = pc.fill_null(m, False)
            if not pc.any(m).as_py():
                return
            msg = pa.scalar(message, pa.string())
            errors = pc.if_else(m, msg, pa.nulls(n, pa.string())) if errors is None else \
                pc.if_else(pc.and_(m, pc.is_null(errors)), msg, errors)

        columns: list[pa.Array] = []
        for f in self.schema:
            arr, bad = cast_lenient(raw.column(f.name), f.type)  # type-level mismatch ruled out before
            if bad is not None:
                note(bad, f"value of column {f.name!r} cannot be cast to {f.type}")
            columns.append(arr)
        by_name = dict(zip(self.schema.names, columns))
        for k in self.key_columns:
            col = by_name[k]
            note(pc.is_null(col), f"null key column {k!r}")
            if pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_binary(col.type):
                note(pc.equal(pc.binary_length(col), 0), f"empty key column {k!r}")
        note(pc.is_null(by_name[INGEST_TS]), "null _ingest_ts")
        rows = pa.array(np.arange(row0, row0 + n, dtype=np.int64))
        meta = [pa.repeat(pa.scalar(split.source, pa.string()), n),
                pa.array(np.full(n, split.partition, dtype=np.int32)),
                pa.array(np.full(n, split.seq, dtype=np.int64)), rows]
        good = pa.Table.from_arrays(columns + meta, schema=reader_output_schema(self.schema))
        if errors is None:
            return good, None
        ok = pc.is_null(errors)
        bad_rows = raw.filter(pc.invert(ok))
        bad = bad_rows.append_column("_row", rows.filter(pc.invert(ok))).append_column(
            "_error", errors.filter(pc.invert(ok)))
        return good.filter(ok), bad


def _with_commit_time(chunks: Iterator[tuple[pa.Table, int] | _Unreadable],
                      ts_us: int) -> Iterator[tuple[pa.Table, int] | _Unreadable]:
    """A lake file's chunks with ``_ingest_ts`` = the commit time (a column of that name in the table is replaced)."""
    for chunk in chunks:
        if isinstance(chunk, _Unreadable):
            yield chunk
            continue
        table, row0 = chunk
        if INGEST_TS in table.column_names:
            table = table.drop_columns([INGEST_TS])
        ts = pa.array(np.full(table.num_rows, ts_us, dtype=np.int64)).cast(pa.timestamp("us", tz="UTC"))
        yield table.append_column(pa.field(INGEST_TS, ts.type), ts), row0


def _splits_of(batch: pa.RecordBatch) -> Iterator[Split]:
    cols = {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
    lake = cols.get("ingest_ts", [None] * batch.num_rows)
    for i in range(batch.num_rows):
        yield Split(str(cols["source"][i]), int(cols["partition"][i]), int(cols["seq"][i]), str(cols["uri"][i]),
                    cols["format"][i], int(cols["row_start"][i]),
                    None if cols["row_end"][i] is None else int(cols["row_end"][i]),
                    None if lake[i] is None else int(lake[i]))


def make_split_reader(schema: pa.Schema, key_columns: Sequence[str], policy: BadRecordsPolicy,
                      dead_letter_root: str, job: str) -> SplitReader:
    """The ``mapInArrow`` function reading split rows into records of ``schema`` (+ meta columns)."""
    if policy not in ("dead_letter", "fail"):
        raise ConfigError(f"bad-records policy must be 'dead_letter' or 'fail', not {policy!r}")
    if INGEST_TS not in schema.names:
        raise ConfigError("the declared source schema must contain _ingest_ts")
    for k in key_columns:
        if k not in schema.names:
            raise ConfigError(f"key column {k!r} is not in the declared schema {schema.names}")
    clash = [f.name for f in META_FIELDS if f.name in schema.names]
    if clash:
        raise ConfigError(f"declared schema must not contain reserved columns {clash}")
    if not dead_letter_root.startswith(("file:", "s3://")):
        raise ConfigError(f"dead-letter root must be a file:// or s3:// URI: {dead_letter_root!r}")
    return SplitReader(schema, tuple(key_columns), policy, dead_letter_root.rstrip("/"), job)


def read_split_table(reader: SplitReader, splits: Iterable[Split]) -> pa.Table:
    """Run ``reader`` locally over ``splits`` (tests, tools): one table with the output schema."""
    batches = [b for s in splits for b in reader.read_split(s)]
    return pa.Table.from_batches(batches, schema=reader.output_schema)


def dead_letter_counts(fileio, dead_letter_root: str, job: str, splits: Iterable[Split]) -> dict[str, int]:
    """Dead-letter records written for ``splits``, per source (0 for sources without any).

    Per partition read, one listing of its dead-letter folder that starts at the first of these splits' files
    (``start_after``: names are ``<seq:08d>-<row_start:08d>.jsonl``, so they sort by position): it returns these
    splits' files and those of later positions, never the partition's history. So the requests are O(partitions
    read + new dead-letter files), not O(every dead letter ever written); only the files of these splits are read.
    ``fileio`` must serve ``dead_letter_root`` (None: chosen from the URI).
    """

    fio = fileio if fileio is not None else file_io_for(dead_letter_root)
    root = dead_letter_root.rstrip("/")
    wanted: dict[tuple[str, int], set[str]] = {}
    counts: dict[str, int] = {}
    for s in splits:
        counts.setdefault(s.source, 0)
        wanted.setdefault((s.source, s.partition), set()).add(
            dead_letter_uri(root, job, s.source, s.partition, s.seq, s.row_start))
    for (source, _partition), uris in sorted(wanted.items()):
        first = min(uris)
        folder = first.rsplit("/", 1)[0]
        # the first file's name without its extension sorts right before it (a proper prefix)
        present = {fi.uri for fi in fio.list(f"{folder}/", recursive=False,
                                             start_after=first[:-len(".jsonl")])}
        for uri in sorted(uris & present):
            data = fio.read_bytes(uri)
            counts[source] += sum(1 for line in data.splitlines() if line.strip())
    return counts
