"""The collector's vocabulary: the snapshot being validated, the datasets collected for the suites
(:class:`Collected`), and the state every collecting step shares (:class:`CollectorBase`)."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd
import pyarrow as pa

from pipeline.fileio import file_io_for
from pipeline.quality.jobspec import JobObjects, job_objects
from pipeline.runtime.driver import progress

__all__ = ["Snapshot", "Collected", "CollectorBase", "Timer", "MAX_EXAMPLES", "iso_us", "ordinal", "records_frame"]

MAX_EXAMPLES = 5
DRILL_KGS = 8          # key groups compared row by row per object when summaries differ


def ordinal(pos: Any) -> int:
    """A source position ``(seq, row)`` as one orderable integer."""
    return int(pos.seq) * (1 << 32) + int(pos.row)


def iso_us(iso: str) -> int:
    dt = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return int(dt.timestamp()) * 1_000_000 + dt.microsecond


@dataclass(frozen=True)


class Snapshot:
    """The checkpoint or savepoint being validated."""

    completed: Any                     # pipeline.checkpoint.completed.CompletedCheckpoint
    name: str                          # chk-<id> | sp-<id>

    @property
    def md(self):
        return self.completed.metadata

    @property
    def location(self) -> str:
        return self.completed.location


@dataclass


class Collected:
    datasets: dict[str, pd.DataFrame] = field(default_factory=dict)
    examples: dict[str, list[dict]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)          # dataset -> why its suites did not run
    errors: dict[str, str] = field(default_factory=dict)           # dataset -> why it could not be built (fails)
    messages: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)


# what the progress lines call the collector's timed steps (pipeline.runtime.driver.progress)
STEP_LABELS = {"metadata_load": "reading checkpoint metadata and commit logs",
               "batch_plan": "compiling the batch plan (Spark starts here)",
               "spark_session": "starting Spark", "spark_read": "reading the checkpoint's files on Spark",
               "local_read": "reading the checkpoint's files", "keys": "counting keys",
               "upsert_read": "reading upsert sinks", "committed_rows": "comparing committed rows",
               "recompute_wait": "waiting for the batch evaluation over the source prefix",
               "metadata_files": "checking referenced files",
               "open_tables": "reading the Delta/Iceberg tables through their formats",
               "dead_letters": "counting the dead letters on disk"}


class Timer:
    def __init__(self, out: dict[str, float], name: str) -> None:
        self.out, self.name = out, name

    def __enter__(self):
        progress.step(STEP_LABELS.get(self.name, self.name.replace("_", " ")))
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.out[self.name] = self.out.get(self.name, 0.0) + time.perf_counter() - self.t


def records_frame(rows: list[dict], columns: Iterable[str]) -> pd.DataFrame:
    cols = list(columns)
    df = pd.DataFrame(rows, columns=cols)
    return df.astype(object).where(pd.notna(df), None) if len(df) else df


class CollectorBase:
    """What every collecting step reads and writes (see :mod:`pipeline.quality.collect`)."""

    tables: dict[str, dict]
    retained: list
    savepoints: list
    known: dict[int, Any]
    retained_ids: list[int]
    newest_id: int
    actual_per_kg: pd.DataFrame
    actual_per_group: pd.DataFrame
    upsert_tables: dict[str, pa.Table]
    data_file_records: dict[str, dict]

    def __init__(self, runner, snapshot: Snapshot, *, mode: str, drill_kgs: int = DRILL_KGS) -> None:
        self.runner = runner
        self.snap = snapshot
        self.md = snapshot.md
        self.mode = mode
        self.drill_kgs = drill_kgs
        self.job = runner.job
        self.mp = int(self.md.max_parallelism)
        self.out = Collected()
        self._fio_cache: dict[str, Any] = {}
        self._fio_lock = threading.Lock()
        self.objects: JobObjects = job_objects(self.job, runner.config.state_ttl_seconds)
        self.barrier_us = iso_us(self.md.barrier_time)
        # state expires with the cutoff end(L) - ttl, L the low watermark of the inputs (docs/alignment.md)
        low = self.md.recovery.low_epoch
        held_us = (int(self.md.epoch) - int(low)) * int(runner.config.epoch_seconds) * 1_000_000 \
            if low is not None and int(low) < int(self.md.epoch) else 0
        self.cutoffs = {o: (self.barrier_us - held_us - t * 1_000_000 if t else None)
                        for o, t in self.objects.ttl_seconds.items()}
        self.file_io_for = file_io_for

    # -- helpers -----------------------------------------------------------------------------------
    def fio(self, uri: str):
        scheme = uri.split("://", 1)[0]
        with self._fio_lock:
            if scheme not in self._fio_cache:
                self._fio_cache[scheme] = self.file_io_for(uri)
            return self._fio_cache[scheme]

    def timer(self, name: str) -> Timer:
        return Timer(self.out.timings, name)
