"""What a run reports: one :class:`RoundResult` per round, gathered in a :class:`RunReport`."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["RoundResult", "RunReport"]


@dataclass
class RoundResult:
    checkpoint_id: int
    epoch: int
    round: int
    completed: bool
    records: dict[str, int]
    backlog: dict[str, int]
    duration_s: float
    checkpoint_s: float = 0.0      # finalize on the driver: acks, _metadata, sink commits, retention
    state_bytes: int = 0
    snapshot_s: float = 0.0        # state snapshot writes in the tasks (per operator the slowest subtask, summed)
    # a tagged round (several epochs per Spark round): the checkpoints its Spark job completed; () for one epoch
    tagged_round: tuple[int, ...] = ()
    # ``run --follow``: seconds from the end of the epoch to the checkpoint's completion (None: not measured)
    latency_s: float | None = None


@dataclass
class RunReport:
    job: str
    restored_from: int | None
    rounds: list[RoundResult] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    @property
    def completed(self) -> list[RoundResult]:
        return [r for r in self.rounds if r.completed]

    def to_dict(self) -> dict:
        return {"job": self.job, "restored_from": self.restored_from,
                "checkpoints_completed": [r.checkpoint_id for r in self.completed],
                "epochs_completed": [r.epoch for r in self.completed],
                "records": {s: sum(r.records.get(s, 0) for r in self.rounds) for s in
                            sorted({k for r in self.rounds for k in r.records})},
                "rounds": [r.__dict__ for r in self.rounds], "messages": self.messages}
