"""Checkpointing, one concept per module (after Flink's ``org.apache.flink.runtime.checkpoint``).

    ack          AckResult, TaskAcknowledgement, TaskMetrics, acks_from_reports (task reports -> acks)
    failure      CheckpointFailureReason (Flink names; pre-flight / counted flags)
    channel      Channel (source, partition: int) and the conversion to the stored partition keys
    handles      Position, FileHandle, StateHandle, ChannelStateHandle, SinkHandle
    report       ReportKind, TaskReport (what a subtask reports at the end of a round: its acknowledgement)
    stats        OperatorStats, SubtaskStats, CheckpointStats
    metadata     CheckpointMetadata (``_metadata``, JSON format 1)
    ids          CheckpointIdCounter (create-only id claims, fencing)
    pending      PendingCheckpoint, PendingManifest (``_pending.json``)
    completed    CompletedCheckpoint (verify, discard)
    store        CompletedCheckpointStore (latest_valid with fallback, retention, garbage cleanup)
    coordinator  CheckpointCoordinator
"""
from __future__ import annotations

from pipeline.checkpoint.ack import AckResult, TaskAcknowledgement, TaskMetrics, acks_from_reports
from pipeline.checkpoint.completed import CompletedCheckpoint
from pipeline.checkpoint.coordinator import CheckpointCoordinator
from pipeline.checkpoint.failure import CheckpointFailureReason
from pipeline.checkpoint.handles import ChannelStateHandle, FileHandle, Position, SinkHandle, StateHandle
from pipeline.checkpoint.ids import CheckpointIdCounter
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.checkpoint.pending import PendingCheckpoint, PendingManifest, PendingState
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.checkpoint.stats import CheckpointStats, OperatorStats
from pipeline.checkpoint.store import CheckpointDirInfo, CheckpointDirStatus, CompletedCheckpointStore

__all__ = [
    "AckResult", "TaskAcknowledgement", "acks_from_reports", "CompletedCheckpoint", "CheckpointCoordinator",
    "CheckpointFailureReason", "ChannelStateHandle", "FileHandle", "Position", "SinkHandle", "StateHandle",
    "CheckpointIdCounter", "CheckpointMetadata", "PendingCheckpoint", "PendingManifest", "PendingState",
    "ReportKind", "TaskReport",
    "CheckpointStats", "OperatorStats", "TaskMetrics", "CheckpointDirInfo", "CheckpointDirStatus",
    "CompletedCheckpointStore",
]
