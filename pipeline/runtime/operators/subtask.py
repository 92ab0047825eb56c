"""The shared body of a keyed operator task: one subtask's run of one epoch (:class:`SubtaskRun`).

Every keyed operator's one-epoch body (the ``step`` that :func:`~pipeline.runtime.operators.task.epoch_tagged_task`
wraps) has the same frame around its kernel; :class:`SubtaskRun` is that frame, so an operator module holds only
what is its own (its state specs, its kernel call, its output and dead letters)::

    run = SubtaskRun.start(spec, batches)                  # fault point "reading", subtask, key groups, FileIO
    with open_state(run.scope(spec.key, {"keys": StateSpec(...)}, cutoff_us), run.fio) as access:
        held = access.read([new])["keys"]
        res = kernel(held, new)
        run.kernel_done()                                  # its time is sync; fault point "writing_state"
        sh = access.write("keys", res.state)
    ofh = run.write_output(res.output)                     # staging the output counts as sync, not snapshot
    yield from run.emit([(ReportKind.STATE, "keys", sh), (ReportKind.OUTPUT, spec.output_name, ofh)],
                        res.output, out_schema, in_rows=new.num_rows, restored=held.num_rows)

Timings of the reports (:class:`~pipeline.checkpoint.report.TaskReport`): ``sync_ms`` is the time from the start
to :meth:`SubtaskRun.kernel_done` plus the time spent staging output (:meth:`SubtaskRun.staging`); ``async_ms`` is
the rest of the time since :meth:`SubtaskRun.kernel_done` (state snapshot, watermark and channel files).

The spec an operator hands in is its frozen task spec; the frame reads the fields every keyed task spec has
(:class:`KeyedTaskSpec`).
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa

from pipeline.checkpoint.handles import FileHandle, StateHandle
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.faults import fault_point
from pipeline.fileio import FileIO, file_io_for
from pipeline.keygroups import KeyGroupRange, range_for_subtask
from pipeline.runtime.operators.state_access import StateScope, StateSpec
from pipeline.runtime.operators.task import _collect, emit_handles, subtask_of, task_report
from pipeline.state.backend import write_table

__all__ = ["KeyedTaskSpec", "SubtaskRun", "Handle"]

#: one report of a task before its figures: (kind, name, state handle / file / count / None)
Handle = tuple[ReportKind, str, StateHandle | FileHandle | int | None]


class KeyedTaskSpec(Protocol):
    """The fields every keyed operator's task spec has (its round fields filled in by
    :func:`~pipeline.runtime.operators.round_params.apply_params`)."""

    @property
    def uid(self) -> str: ...
    @property
    def checkpoint(self) -> str: ...
    @property
    def parallelism(self) -> int: ...
    @property
    def max_parallelism(self) -> int: ...
    @property
    def parent_handles(self) -> Mapping[str, Sequence[StateHandle]]: ...
    @property
    def state_prefix(self) -> str: ...
    @property
    def output_prefix(self) -> str: ...
    @property
    def file_tag(self) -> str: ...
    @property
    def ack_prefix(self) -> str | None: ...
    @property
    def snapshot(self) -> dict | None: ...


@dataclass(slots=True)
class SubtaskRun:
    """One subtask's run of one epoch of a keyed operator (see the module docstring). Mutable only in its
    timings; the rest is fixed by :meth:`start`."""

    spec: KeyedTaskSpec
    subtask: int
    incoming: pa.Table | None   # the subtask's rows of the epoch, without the beacon (None: no rows)
    kgr: KeyGroupRange
    fio: FileIO                 # of the state prefix (state, output and ack files)
    t0: float
    kernel_ms: float = 0.0
    staging_ms: float = 0.0
    t1: float | None = None     # when the kernel was done (kernel_done)

    @classmethod
    def start(cls, spec: KeyedTaskSpec, batches: Iterator[pa.RecordBatch], *,
              reading_point: bool = True) -> SubtaskRun:
        """The fault point ``reading`` (unless ``reading_point`` is false), then the subtask (from its beacon
        row), its key-group range and FileIO."""
        if reading_point:
            fault_point("reading")
        t0 = time.perf_counter()
        subtask, incoming = subtask_of(_collect(batches))
        kgr = range_for_subtask(spec.max_parallelism, spec.parallelism, subtask)
        return cls(spec, subtask, incoming, kgr, file_io_for(spec.state_prefix), t0)

    def scope(self, key: str, states: Mapping[str, StateSpec], cutoff_us: int | None = None) -> StateScope:
        """The state scope of this subtask and round: ``states`` keyed by ``key``, restored from the parent
        checkpoint's handles, snapshotted with the round's options; rows with a time below ``cutoff_us`` expire."""
        s = self.spec
        return StateScope(s.uid, self.subtask, self.kgr, key, s.checkpoint, s.state_prefix, states, s.parent_handles,
                          s.snapshot, cutoff_us)

    def kernel_done(self) -> None:
        """The kernel's work ends (its time is the reports' ``sync_ms``); the fault point ``writing_state``."""
        self.kernel_ms = (time.perf_counter() - self.t0) * 1000
        fault_point("writing_state")
        self.t1 = time.perf_counter()

    @contextmanager
    def staging(self) -> Iterator[None]:
        """Time spent staging output (sink files, merging earlier staged output): sync, not snapshot time."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.staging_ms += (time.perf_counter() - t) * 1000

    def output_uri(self) -> str:
        """This subtask's output file of the round (staged sink or exchange file)."""
        return f"{self.spec.output_prefix}/part-{self.spec.file_tag}-{self.subtask:05d}.parquet"

    def write_output(self, table: pa.Table | None) -> FileHandle | None:
        """Writes ``table`` as this subtask's output file (None when it has no rows); staging time."""
        if table is None or not table.num_rows:
            return None
        with self.staging():
            return write_table(self.fio, self.output_uri(), table)

    def timings(self) -> tuple[float, float]:
        """(sync_ms, async_ms) of the reports, as of now."""
        if self.t1 is None:
            return (time.perf_counter() - self.t0) * 1000, 0.0
        return self.kernel_ms + self.staging_ms, (time.perf_counter() - self.t1) * 1000 - self.staging_ms

    def reports(self, handles: Sequence[Handle], *, in_rows: int = 0, restored: int = 0,
                expired: int = 0) -> list[TaskReport]:
        """One report per handle with the run's figures and timings."""
        sync_ms, async_ms = self.timings()
        return [task_report(kind, self.spec.uid, name, self.subtask, self.kgr, what, in_rows=in_rows,
                            restored=restored, expired=expired, sync_ms=sync_ms, async_ms=async_ms)
                for kind, name, what in handles]

    def emit(self, reports: list[TaskReport], out: pa.Table | None,
             out_schema: pa.Schema) -> Iterator[pa.RecordBatch]:
        """The task's result (:func:`~pipeline.runtime.operators.task.emit_handles`): its reports, and in a chain
        the rows ``out`` flowing on as ``out_schema``."""
        yield from emit_handles(reports, out, out_schema, self.fio, self.spec.ack_prefix, self.subtask)
