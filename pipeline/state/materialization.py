"""Materialisation policy: when an incremental snapshot writes a full base instead of one more delta.

A restore reads the base and every delta of a chain, so chains are bounded. A new snapshot of a state is
written as a *base* (materialised) instead of a delta when

* incremental snapshots are off (``PIPELINE_STATE_INCREMENTAL=false``), or the state cannot be diffed;
* there is no parent chain to extend (first snapshot, empty state, a rescale that changed the subtask's
  key-group range, a parent outside this job's ``shared/`` area, a restore or a savepoint: NO_CLAIM and
  self-contained snapshots never reference the files they came from);
* the chain would hold more than ``PIPELINE_STATE_MAX_DELTAS`` deltas (default 10), or its deltas would
  exceed ``PIPELINE_STATE_MAX_DELTA_RATIO`` times the base's bytes (default 0.5).

So a restore reads at most ``1 + max_deltas`` files and at most ``(1 + ratio)`` times the base size.
"""
from __future__ import annotations

from dataclasses import dataclass

from pipeline.state.chain import StateChain

__all__ = ["MaterializationPolicy", "DEFAULT_MAX_DELTAS", "DEFAULT_MAX_DELTA_RATIO"]

DEFAULT_MAX_DELTAS = 10
DEFAULT_MAX_DELTA_RATIO = 0.5


@dataclass(frozen=True, slots=True)
class MaterializationPolicy:
    """Bounds of a state chain (see the module docstring)."""

    incremental: bool = True
    max_deltas: int = DEFAULT_MAX_DELTAS
    max_delta_ratio: float = DEFAULT_MAX_DELTA_RATIO

    def __post_init__(self) -> None:
        if self.max_deltas < 0:
            raise ValueError(f"max deltas per state chain must be >= 0, got {self.max_deltas}")
        if self.max_delta_ratio < 0:
            raise ValueError(f"max delta ratio must be >= 0, got {self.max_delta_ratio}")

    def extend(self, chain: StateChain, delta_bytes: int) -> bool:
        """True iff ``chain`` may take one more delta of ``delta_bytes`` bytes (else: materialise)."""
        if not self.incremental or self.max_deltas == 0:
            return False
        if len(chain.deltas) + 1 > self.max_deltas:
            return False
        return chain.delta_bytes + delta_bytes <= self.max_delta_ratio * chain.base.bytes
