"""How many waiting epochs the next round carries (:class:`RoundSizer`), so a catch-up checkpoints often.

A tagged round completes several waiting epochs at once, one checkpoint each, but every one of those checkpoints
completes when the round ends: a round of eight large epochs can run for minutes with no checkpoint, and a kill
in it loses all of them. The sizer bounds a round by time instead of by count alone:

* the first round of a run carries one epoch: its fixed cost (Python workers, plan analysis, a cold state cache)
  is paid with the least work, so the first checkpoint comes early;
* after each round, the round's wall time per epoch is the estimate of the next round's cost per epoch, and the
  next round carries ``floor(PIPELINE_ROUND_TARGET_SECONDS / estimate)`` epochs, at least one and at most
  ``PIPELINE_MAX_EPOCHS_PER_ROUND``.

The estimate is the whole round's time divided by its epochs (its fixed cost included), so it overestimates an
epoch's cost and errs toward smaller rounds. Epochs of very different sizes make it a guess; one epoch larger than
the target is still one round (an epoch is the unit of a checkpoint). ``PIPELINE_ROUND_TARGET_SECONDS=0`` turns the
bound off (every round carries up to ``PIPELINE_MAX_EPOCHS_PER_ROUND`` epochs, the first one included).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class RoundSizer:
    """The epoch limit of a run's next round (see the module docstring)."""

    max_epochs: int
    """``PIPELINE_MAX_EPOCHS_PER_ROUND``."""
    target_seconds: float
    """``PIPELINE_ROUND_TARGET_SECONDS``; ``0``: no time bound."""
    seconds_per_epoch: float | None = None
    """The last round's wall time per epoch (``None`` before the first round)."""

    def limit(self, remaining: int | None = None) -> int:
        """Epochs the next round may carry; ``remaining``: epochs the run may still complete (``None``: no bound)."""
        if self.target_seconds <= 0:
            k = self.max_epochs
        elif self.seconds_per_epoch is None:
            k = 1
        else:
            k = int(self.target_seconds // max(self.seconds_per_epoch, 1e-3))
        k = max(1, min(self.max_epochs, k))
        return k if remaining is None else max(1, min(k, remaining))

    def observe(self, epochs: int, wall_seconds: float) -> None:
        """A round that completed ``epochs`` epochs took ``wall_seconds``."""
        if epochs > 0:
            self.seconds_per_epoch = max(wall_seconds, 0.0) / epochs
