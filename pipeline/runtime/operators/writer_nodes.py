"""The runtime's sink-writer nodes (see :mod:`pipeline.runtime.operators.sink_writer` for what they do): which sinks of a job
no stateful operator writes. Kept apart from the writer's Spark task so that the driver modules can name them
without importing the task code."""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.job import Job, SinkNode

__all__ = ["SinkWriterNode", "WRITER_PREFIX", "sink_writers", "is_writer_uid"]

#: the uid of a sink writer is this prefix + the sink table (never a valid operator uid: ':' is not allowed there)
WRITER_PREFIX = "sink:"


@dataclass(frozen=True, slots=True)
class SinkWriterNode:
    """The stateless writer of ``sink`` (see module docstring): ``uid`` = ``sink:<table>``, ``parent`` = the node
    the sink reads."""

    uid: str
    parent: int
    sink: SinkNode

    STATE_NAMES = ()

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.parent,)


def is_writer_uid(uid: str) -> bool:
    return uid.startswith(WRITER_PREFIX)


def sink_writers(job: Job) -> list[SinkWriterNode]:
    """The job's sink writers, in node order: one per sink that no operator writes (its parent is not a stateful
    operator, or the operator's own tasks write another sink: :meth:`pipeline.job.Job.operator_sink`)."""
    return [SinkWriterNode(f"{WRITER_PREFIX}{s.table}", s.parent, s) for s in job.sinks()
            if job.operator_sink(s.parent) is not s]
