"""The typed results of the epoch DAG's tasks (what each task returns as its XCom, through ``to_dict``)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["TriggerResult", "ProcessResult", "CommitResult", "ValidateResult"]


@dataclass(frozen=True, slots=True)
class TriggerResult:
    epoch: int
    barrier_time: str
    action: str
    head_before: int | None
    head_epoch_before: int | None
    barrier_epochs: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["barrier_epochs"] = list(self.barrier_epochs)
        return d


@dataclass(frozen=True, slots=True)
class ProcessResult:
    epoch: int
    checkpoint_id: int
    head_epoch: int
    action: str
    completed: tuple[int, ...] = ()          # checkpoints completed by this try
    epochs: tuple[int, ...] = ()
    records: Mapping[str, int] = field(default_factory=dict)
    rewound_to: int | None = None            # checkpoint id restored for a re-run (None: start of sources)
    skipped: bool = False                    # a previous try of this run had completed the epoch
    forwarded_to: int | None = None          # epoch re-processed up to after a rewind
    messages: tuple[str, ...] = ()
    rounds_s: float = 0.0                    # wall time of this try's rounds (Spark work + checkpoint finalize)
    spark_start_s: float = 0.0               # starting Spark / connecting to Spark Connect in this try

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["completed"], d["epochs"], d["messages"] = list(self.completed), list(self.epochs), list(self.messages)
        d["records"] = dict(self.records)
        return d


@dataclass(frozen=True, slots=True)
class CommitResult:
    checkpoint_id: int
    epoch: int
    tables: Mapping[str, Mapping[str, Any]]  # table -> {result, head, rows, files, uri}
    garbage_checkpoints: tuple[int, ...] = ()
    garbage_sink_dirs: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint_id": self.checkpoint_id, "epoch": self.epoch,
                "tables": {t: dict(v) for t, v in self.tables.items()},
                "garbage_checkpoints": list(self.garbage_checkpoints), "garbage_sink_dirs": self.garbage_sink_dirs}


@dataclass(frozen=True, slots=True)
class ValidateResult:
    checkpoint_id: int
    success: bool
    checks: tuple[str, ...]
    problems: tuple[str, ...] = ()
    quality: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoint_id": self.checkpoint_id, "success": self.success, "checks": list(self.checks),
                "problems": list(self.problems), "quality": dict(self.quality) if self.quality else None}
