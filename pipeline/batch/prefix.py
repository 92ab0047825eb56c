"""The source prefix a checkpoint covers, read as Spark DataFrames for the batch evaluation.

A :class:`Prefix` names, for every source partition, the barrier position of checkpoint ``n`` (rows before
it are in the prefix) and the barrier positions of every earlier epoch from the write-ahead barrier log
(``<checkpoint root>/<job>/barriers/epoch-<k>.json``). From those it tags each row ``x`` with its
**processing epoch** ``p(x)``: the first logged epoch ``k`` whose barrier lies after ``x`` in its partition,
i.e. the checkpoint in whose rounds the runtime consumed ``x``. ``p(x)`` is ``e(x) = floor(_ingest_ts / E)``
for rows that arrived in time, and later for rows of a partition that was idle when its barrier was cut.

Rows are read with the runtime's source reader (same file listing, same bad-record rules), but bad records
are only counted here, never written to the dead-letter location: the batch evaluation has no side effects.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pyarrow as pa

from pipeline.exceptions import StorageError
from pipeline.fileio import join_uri
from pipeline.job import Job, SourceNode
from pipeline.runtime.dataflow import schema_ddl
from pipeline.source.layout import SourceFile, list_source_files
from pipeline.source.planner import Split
from pipeline.source.reader import META_FIELDS, SplitReader
from pipeline.source.summary import summarize_file

__all__ = ["Prefix", "PEPOCH", "ordinal", "barrier_log", "source_dataframe"]

PEPOCH = "_pepoch"          # processing epoch of a row (see the module docstring)
_EPOCH_FILE = re.compile(r"epoch-(\d+)\.json$")
_BIG = 1 << 62


def ordinal(seq: int, row: int) -> int:
    """A position as one sortable integer (the quality suites use the same form)."""
    return (int(seq) << 32) + int(row)


@dataclass(frozen=True)
class Prefix:
    """Checkpoint ``epoch``'s barriers and the barrier log before it, for one job."""

    epoch: int                                        # n
    epoch_seconds: int                                # E
    barriers: Mapping[str, Mapping[int, tuple[int, int]]]          # source -> partition -> (seq, row)
    log: Mapping[int, Mapping[str, Mapping[int, tuple[int, int]]]] = field(default_factory=dict)  # epoch k < n
    # the low watermark L of the inputs at checkpoint n (``_metadata.extra.low_epoch``): state expired with the
    # cutoff end(L) - ttl; None: n (aligned inputs)
    low_epoch: int | None = None
    # the validated checkpoint's id: which logged rounds belong to its lineage (pipeline.batch.rounds); None: any
    checkpoint_id: int | None = None

    @property
    def ttl_epoch(self) -> int:
        """The epoch whose end the TTL cutoff of checkpoint n's state is computed from (``L``, at most n)."""
        return self.epoch if self.low_epoch is None else min(self.low_epoch, self.epoch)

    @property
    def epoch_us(self) -> int:
        return self.epoch_seconds * 1_000_000

    def end_us(self, k: int) -> int:
        return (k + 1) * self.epoch_us

    def lookup(self, source: str) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per partition: increasing barrier ordinals and their epochs (``p(x)`` by ``searchsorted``)."""
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        epochs = sorted(k for k in self.log if k < self.epoch) + [self.epoch]
        for p in self.barriers.get(source, {}):
            ords, eps, best = [], [], -1
            for k in epochs:
                pos = (self.barriers[source][p] if k == self.epoch else self.log[k].get(source, {}).get(p))
                if pos is None:
                    continue
                o = max(best, ordinal(*pos))
                ords.append(o)
                eps.append(k)
                best = o
            out[int(p)] = (np.asarray(ords, np.int64), np.asarray(eps, np.int64))
        return out


def barrier_log(ckpt_fio, job_root: str, upto: int) -> dict[int, dict[str, dict[int, tuple[int, int]]]]:
    """Barrier positions of every logged epoch ``< upto`` (missing log: empty; rows then default to e(x))."""
    root = join_uri(job_root, "barriers")
    out: dict[int, dict[str, dict[int, tuple[int, int]]]] = {}
    try:
        files = ckpt_fio.list(root, recursive=False)
    except StorageError:
        return out
    for f in files:
        m = _EPOCH_FILE.search(f.uri)
        if not m or int(m.group(1)) >= upto:
            continue
        doc = json.loads(ckpt_fio.read_bytes(f.uri))
        out[int(m.group(1))] = {s: {int(p): (int(v["seq"]), int(v["row"])) for p, v in parts.items()}
                                for s, parts in doc.get("barriers", {}).items()}
    return out


@dataclass(frozen=True)
class _CountingReader(SplitReader):
    """The runtime's split reader, minus the side effect: bad records are left where they are (the epoch
    runtime dead-letters them; the batch evaluation reads the same good rows)."""

    def write_dead_letters(self, split, lines) -> None:  # noqa: D401 - no side effects here
        return None


def _files(runner, source: SourceNode, stops: Mapping[int, tuple[int, int]]) -> list[tuple]:
    """``(SourceFile fields..., stop row or None)`` of every file with rows before the barrier: listing only (the
    footers are read by the executors, which turn each file into its split)."""
    files = list_source_files(runner.src_fio, runner.config.source_uri, source.name, policy="dead_letter")
    out: list[tuple] = []
    for p, fs in files.items():
        if int(p) not in stops:
            continue
        bseq, brow = stops[int(p)]
        for f in fs:
            if f.seq < bseq:
                out.append((f.source, f.partition, f.seq, f.uri, f.format, f.size, None))
            elif f.seq == bseq and brow > 0:
                out.append((f.source, f.partition, f.seq, f.uri, f.format, f.size, brow))
    out.sort(key=lambda t: -t[5])   # biggest first: balanced tasks
    return out


def source_dataframe(spark, runner, job: Job, source: SourceNode, prefix: Prefix, *, max_tasks: int = 16):
    """The valid rows of ``source`` before checkpoint ``prefix.epoch``'s barriers, with the declared columns,
    the position columns (``_source``, ``_partition``, ``_seq``, ``_row``) and ``_pepoch``."""
    stops = prefix.barriers.get(source.name, {})
    splits = _files(runner, source, stops)
    reader = _CountingReader(source.schema, (source.key,) if source.key else (), "dead_letter",
                             "file:///nonexistent", job.name)
    lookup = prefix.lookup(source.name)
    out_schema = pa.schema(list(source.schema) + list(META_FIELDS) + [pa.field(PEPOCH, pa.int64())])
    # ``_source`` is one constant per source: added by Spark after the read (a literal the optimizer drops when
    # nothing reads it), not converted from Arrow row by row
    read_schema = pa.schema([f for f in out_schema if f.name != "_source"])
    n_tasks = max(1, min(len(splits), max_tasks))
    groups = [splits[i::n_tasks] for i in range(n_tasks)]
    epoch_us = prefix.epoch_us
    last = prefix.epoch

    def read(batches):
        import pyarrow.compute as pc
        for b in batches:
            for task in b.column(0).to_pylist():
                for src, part, seq, uri, fmt, size, stop in groups[task]:
                    f = SourceFile(src, part, seq, uri, fmt, size)
                    summary = summarize_file(f)
                    if summary.corrupt:
                        split = Split(src, part, seq, uri, fmt, 0, None)
                    else:
                        split = Split(src, part, seq, uri, fmt, 0, summary.rows if stop is None
                                      else min(stop, summary.rows))
                    for rb in reader.read_split(split):
                        t = pa.Table.from_batches([rb])
                        ords = (t["_seq"].to_numpy().astype(np.int64) << 32) + t["_row"].to_numpy().astype(np.int64)
                        bar_o, bar_e = lookup.get(part, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
                        idx = np.searchsorted(bar_o, ords, side="right")
                        ts = pc.cast(pc.cast(t["_ingest_ts"], pa.timestamp("us", tz="UTC")), pa.int64())
                        own = ts.to_numpy(zero_copy_only=False) // epoch_us       # e(x): no barrier logged
                        if len(bar_e) > 1:      # the barrier log of earlier epochs says where x was consumed
                            pe = np.where(idx < len(bar_e), bar_e[np.minimum(idx, len(bar_e) - 1)], last)
                            # before the first logged barrier k0: e(x), at most k0 (= k0 for a job that ran
                            # from its first epoch; e(x) for a job bootstrapped at k0, docs/batch.md)
                            pe = np.where(idx == 0, np.minimum(own, bar_e[0]), pe)
                        else:                   # no log (or only barrier n): e(x), capped at n
                            pe = np.minimum(own, last)
                        t = t.append_column(PEPOCH, pa.array(pe.astype(np.int64)))
                        yield from t.select(read_schema.names).cast(read_schema).to_batches()

    from pyspark.sql import functions as F
    df = spark.range(0, n_tasks, 1, n_tasks).mapInArrow(read, schema_ddl(read_schema))
    return df.select(*[F.lit(source.name).alias(c) if c == "_source" else df[c] for c in out_schema.names])
