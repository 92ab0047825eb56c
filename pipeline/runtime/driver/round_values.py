"""The typed values the round executor's steps hand each other (:mod:`pipeline.runtime.driver.round_executor`).

* :class:`EpochInputs`: what completing one epoch starts from (its barriers, the source listing, the parallelism,
  checkpoint or savepoint);
* :class:`RoundPlan`: one round, decided before it runs (the segments every channel reads, where they start and
  what they reach, the parked channels, the low watermark L); written ahead as ``rounds/<k>/_plan.json``
  (:meth:`RoundPlan.to_json`, the format the batch evaluation and the quality checks read);
* :class:`CheckpointTally`: what the rounds of one checkpoint add up to (dead letters, dropped rows, dead-letter
  files, the executors' S3 requests, the bytes read); frozen: every round gives a new one (:meth:`CheckpointTally.
  after_round`).

A channel is a :class:`~pipeline.checkpoint.channel.Channel` ``(source, partition)`` with the partition as an
``int``, as the source listing (``summaries``) and the segments key it; the positions and barriers keep the stored
string keys and are read through :meth:`~pipeline.checkpoint.channel.Channel.lookup`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.barriers.events import CheckpointType
from pipeline.checkpoint.channel import Channel, partition_key, partition_of
from pipeline.checkpoint.handles import ChannelStateHandle, Position, StateHandle
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.fileio.request_counter import RequestCounting, StorageRequests
from pipeline.job import Job
from pipeline.runtime.driver.barrier_log import Barriers
from pipeline.runtime.operators.dead_letters import files_of_reports
from pipeline.runtime.spark.round_bytes import ReadBytes
from pipeline.source.planner import Segment, plan_segments

__all__ = ["EpochInputs", "RoundPlan", "CheckpointTally", "plan_source_segments", "segment_totals",
           "handles_of_reports", "round_plan_json"]

Segments = Mapping[str, Mapping[int, Segment]]   # source -> partition -> the segment it reads this round
Summaries = Mapping[str, Mapping[int, Sequence]]  # source -> partition -> file summaries (the listing)

_NONE: Sequence = ()


@dataclass(frozen=True)
class EpochInputs:
    """What completing epoch ``epoch`` starts from."""

    epoch: int
    barriers: Barriers                 # {source: {partition: Position}}; None: a lagging partition
    summaries: Summaries               # the source listing the epoch was decided on
    parallelism: int
    kind: CheckpointType = CheckpointType.CHECKPOINT
    location: str | None = None        # a savepoint's target directory

    def summaries_of(self, ch: Channel) -> Sequence:
        """The listing of one channel's partition (empty: none listed)."""
        return self.summaries.get(ch.source, {}).get(ch.partition, _NONE)

    def known_barriers(self) -> dict[str, dict[str, Position]]:
        """The barriers of the partitions that are not lagging."""
        return {s: {p: pos for p, pos in parts.items() if pos is not None} for s, parts in self.barriers.items()}

    def lagging(self) -> bool:
        """A partition lags (its barrier is not known)."""
        return any(b is None for parts in self.barriers.values() for b in parts.values())


def plan_source_segments(job: Job, summaries: Summaries, positions: Mapping[str, Mapping[str, Position]],
                         stops: Mapping[Channel, tuple[Position, object]], channels: Sequence[Channel],
                         max_records: int) -> dict[str, dict[int, Segment]]:
    """Per source and partition: the segment a round reads from ``positions`` up to the channel's stop (capped
    by ``max_records`` per source, :func:`~pipeline.source.planner.plan_segments`)."""
    segments = {}
    for src in job.sources():
        parts = summaries.get(src.name, {})
        st = {partition_of(p): pos for p, pos in positions.get(src.name, {}).items()}
        sp = {ch.partition: stops[ch][0] for ch in channels if ch.source == src.name}
        segments[src.name] = plan_segments(parts, st, sp, max_records, source=src.name)
    return segments


def segment_totals(segments: Segments) -> tuple[dict[str, int], dict[str, int]]:
    """(records, backlog) per source of a round's segments."""
    return ({s: sum(seg.records for seg in segs.values()) for s, segs in segments.items()},
            {s: sum(seg.backlog for seg in segs.values()) for s, segs in segments.items()})


def round_plan_json(rnd: int, now: object, segments: Segments, alignment: object, parked: Sequence[str],
                    replayed: int, low_epoch: int | None, **extra: object) -> dict:
    """The write-ahead ``rounds/<k>/_plan.json`` of a round (read by the batch evaluation and quality checks)."""
    return {"round": rnd, "now": now,
            "segments": {s: {partition_key(p): {"start": seg.start.to_dict(), "stop": seg.stop.to_dict(),
                                      "reached": seg.reached.to_dict(), "records": seg.records,
                                      "backlog": seg.backlog}
                             for p, seg in segs.items()} for s, segs in segments.items()},
            "alignment": alignment, "parked": list(parked), "replayed_inflight_rows": replayed,
            "low_epoch": low_epoch, **extra}


def handles_of_reports(rows: Sequence[TaskReport]) -> tuple[dict[str, dict[str, list[StateHandle]]],
                                                              dict[str, list[ChannelStateHandle]]]:
    """(state handles per operator and state name, parked in-flight channel state per operator) of a round."""
    handles: dict[str, dict[str, list[StateHandle]]] = {}
    inflight: dict[str, list[ChannelStateHandle]] = {}
    for r in rows:
        if r.state is not None:
            handles.setdefault(r.operator_uid, {}).setdefault(r.name, []).append(r.state)
        elif r.kind is ReportKind.CHANNEL:  # parked: in flight between operators, replayed next round
            inflight.setdefault(r.operator_uid, []).append(r.channel_handle())
    return handles, inflight


@dataclass(frozen=True)
class RoundPlan:
    """One round of a checkpoint, decided before it runs."""

    round: int
    now: object                              # the round clock's time (datetime or microseconds)
    starts: Mapping[Channel, Position]       # where each channel starts reading
    segments: Segments                       # what each source partition reads
    reached: Mapping[Channel, Position]      # where each channel's read ends
    arrived: Mapping[Channel, object]        # the barrier that arrives on a channel this round (None: none)
    parked: frozenset[Channel]               # channels whose rows are parked as in-flight channel state
    replayed: int                            # in-flight rows of the previous round replayed first
    low_epoch: int                           # the low watermark L the round expires state with

    @property
    def totals(self) -> tuple[dict[str, int], dict[str, int]]:
        """(records, backlog) per source."""
        return segment_totals(self.segments)

    def splits(self) -> list:
        """The source splits the round reads."""
        return [sp for segs in self.segments.values() for seg in segs.values() for sp in seg.splits]

    def positions_after(self, before: Mapping[str, Mapping[str, Position]]) -> dict[str, dict[str, Position]]:
        """The positions after the round: each read partition at the position it reached."""
        return {s: {**before.get(s, {}), **{partition_key(p): seg.reached for p, seg in segs.items()}}
                for s, segs in self.segments.items()}

    def stalled(self, channels: Sequence[Channel]) -> bool:
        """No channel made progress and no barrier arrived: the checkpoint cannot complete."""
        return (not self.replayed and all(self.reached[ch] == self.starts[ch] for ch in channels)
                and not any(v is not None for v in self.arrived.values()))

    def to_json(self, alignment: object) -> dict:
        return round_plan_json(self.round, self.now, self.segments, alignment,
                               sorted(ch.name for ch in self.parked), self.replayed, self.low_epoch)


@dataclass(frozen=True)
class CheckpointTally:
    """What the rounds of one checkpoint add up to (see module docstring)."""

    dead_letters: Mapping[str, int] = field(default_factory=dict)        # per source / ``operator=<uid>``
    dropped: Mapping[str, int] = field(default_factory=dict)             # per operator uid (deduplicate)
    dead_letter_files: Mapping[str, Sequence[str]] = field(default_factory=dict)  # per operator
    executor_requests: StorageRequests = field(default_factory=StorageRequests)
    counting: RequestCounting = RequestCounting.EXACT                    # approximate if any round's were
    read: ReadBytes | None = None                                        # rows and Arrow bytes the reads read

    def after_round(self, rows: Sequence[TaskReport], requests: StorageRequests, counting: RequestCounting,
                    read: ReadBytes | None, source_dead_letters: Mapping[str, int]) -> CheckpointTally:
        """This tally with one more round: its reports (operators' dead letters and dropped rows, dead-letter
        files), its executors' requests and reads, the source dead letters of its splits."""
        dead = dict(self.dead_letters)
        dropped = dict(self.dropped)
        files = {u: list(f) for u, f in self.dead_letter_files.items()}
        for uid, uris in files_of_reports([r for r in rows if r.kind is ReportKind.DEAD_LETTER]).items():
            files.setdefault(uid, []).extend(uris)
        for r in rows:  # operators' dead letters (e.g. a join's ``unique`` violated) and dropped rows
            if r.kind is ReportKind.DEAD_LETTER and r.rows:
                name = f"operator={r.operator_uid}"
                dead[name] = dead.get(name, 0) + r.rows
            elif r.kind is ReportKind.DROPPED and r.count:
                dropped[r.operator_uid] = dropped.get(r.operator_uid, 0) + r.count
        for s, n in source_dead_letters.items():
            dead[s] = dead.get(s, 0) + n
        return CheckpointTally(
            dead, dropped, files, self.executor_requests + requests,
            counting if counting is not RequestCounting.EXACT else self.counting,
            read if self.read is None else (self.read + read if read is not None else self.read))
