"""Task reports: what one operator subtask reports to the driver at the end of a round (typed, frozen).

A Spark task builds its reports as it writes (one per file or count), and they are its acknowledgement:

* ``STATE``: a :class:`~pipeline.checkpoint.handles.StateHandle` (``file`` None: the state is empty);
* ``OUTPUT``: a sink / exchange file staged this round (``file`` None: nothing staged);
* ``CHANNEL``: unaligned in-flight rows written as channel state (``file``);
* ``DEAD_LETTER``: an operator's dead-letter file (its rows are the count);
* ``DROPPED``: rows an operator drops by design (``count``; the deduplicate);
* ``ACK``: no file: marks the subtask and carries driver-side metrics (alignment, mode).

The report travels from the executor to the driver through one codec (:mod:`pipeline.runtime.operators.report_codec`:
an Arrow row in the operator's ``mapInArrow`` result, or the same batch as an Arrow IPC object for a chained
operator) and comes out as the same value. :func:`pipeline.checkpoint.ack.acks_from_reports` groups a round's
reports into one :class:`~pipeline.checkpoint.ack.TaskAcknowledgement` per subtask, whose state handles are
the very ``StateHandle`` objects the task built, and ``_metadata`` serialises them with their own codec
(``StateHandle.to_dict``).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from pipeline.checkpoint.handles import ChannelStateHandle, FileHandle, StateHandle
from pipeline.fileio.request_counter import StorageRequests

__all__ = ["ReportKind", "TaskReport"]


class ReportKind(Enum):
    """What a :class:`TaskReport` reports."""

    STATE = "state"
    OUTPUT = "output"
    CHANNEL = "channel"
    DEAD_LETTER = "dead_letter"
    DROPPED = "dropped"
    ACK = "ack"


@dataclass(frozen=True, slots=True)
class TaskReport:
    """One report of subtask ``subtask`` of operator ``operator_uid`` over key groups ``[kg_start, kg_end]``.

    ``name``: the state name (STATE), the sink table or ``exchange:<uid>`` (OUTPUT), the channel (CHANNEL), the
    dead-letter name (DEAD_LETTER). Metrics are the subtask's; ``mode`` / ``alignment_ms`` / ``start_delay_ms``
    are set by the driver (ACK reports of the aligning operator)."""

    kind: ReportKind
    operator_uid: str
    subtask: int
    name: str
    kg_start: int = 0
    kg_end: int = -1
    state: StateHandle | None = None      # STATE only (always set)
    file: FileHandle | None = None        # OUTPUT / CHANNEL / DEAD_LETTER (None: nothing written)
    count: int = 0                        # DROPPED: rows dropped
    in_rows: int = 0                      # records the subtask processed this round
    restored_rows: int = 0
    expired_rows: int = 0
    sync_ms: float = 0.0                  # restore + processing + staging the sink output
    async_ms: float = 0.0                 # state snapshot upload (state + channel state files)
    ack_ts_ms: float = 0.0                # wall clock (Unix ms) when the subtask acknowledged; 0: unknown
    alignment_ms: float = 0.0
    start_delay_ms: float = 0.0
    mode: str | None = None               # "aligned" | "unaligned" | "at_least_once" (driver); None: not said
    s3_requests: StorageRequests | None = None  # the worker's S3 requests not reported yet (one report per task)
    checkpoint_id: int | None = None      # tagged rounds: the checkpoint this report acknowledges; None: the round's

    def __post_init__(self) -> None:
        who = f"report {self.kind.value} {self.name!r} of {self.operator_uid}[{self.subtask}]"
        if self.kind is ReportKind.STATE:
            if self.state is None:
                raise ValueError(f"{who}: a state report needs its state handle")
            s = self.state
            if (s.operator_uid, s.subtask, s.name, s.kg_start, s.kg_end) != (
                    self.operator_uid, self.subtask, self.name, self.kg_start, self.kg_end):
                raise ValueError(f"{who}: its state handle is of {s.operator_uid}[{s.subtask}] {s.name!r} "
                                 f"[{s.kg_start}, {s.kg_end}]")
            if self.file is not None:
                raise ValueError(f"{who}: a state report's files are in its state handle")
        elif self.state is not None:
            raise ValueError(f"{who}: only state reports carry a state handle")
        if self.count and (self.kind is not ReportKind.DROPPED):
            raise ValueError(f"{who}: only a dropped report carries a count")
        if self.count < 0 or self.subtask < 0:
            raise ValueError(f"{who}: negative count or subtask")

    @classmethod
    def of_state(cls, handle: StateHandle, *, in_rows: int = 0, sync_ms: float = 0.0,
                 async_ms: float = 0.0) -> TaskReport:
        """The STATE report of ``handle`` (its operator, subtask, name and key-group range)."""
        return cls(ReportKind.STATE, handle.operator_uid, handle.subtask, handle.name, handle.kg_start,
                   handle.kg_end, state=handle, in_rows=in_rows, sync_ms=sync_ms, async_ms=async_ms)

    @property
    def rows(self) -> int:
        """Rows reported: the state's, the file's, or the count."""
        if self.state is not None:
            return self.state.rows
        return self.file.rows if self.file is not None else self.count

    @property
    def bytes(self) -> int:
        if self.state is not None:
            return self.state.bytes
        return self.file.bytes if self.file is not None else 0

    def channel_handle(self) -> ChannelStateHandle:
        """A CHANNEL report as the checkpoint's channel-state handle."""
        if self.kind is not ReportKind.CHANNEL:
            raise ValueError(f"report {self.kind.value} of {self.operator_uid}[{self.subtask}] is not channel state")
        return ChannelStateHandle(operator_uid=self.operator_uid, subtask=self.subtask, channel=self.name,
                                  file=self.file)
