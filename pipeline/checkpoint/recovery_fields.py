"""The runtime's recovery fields of a checkpoint's ``_metadata`` as one typed value (:class:`RecoveryFields`).

Besides the restore point, a completed checkpoint records what the runtime needs to continue from it and what
the batch evaluation and the checks need to recompute it. On disk they sit in ``_metadata``'s ``extra`` object
(the format is unchanged: checkpoints written before this module existed read the same); in code they are read
and written only through :class:`RecoveryFields` (:attr:`pipeline.checkpoint.metadata.CheckpointMetadata.recovery`),
never as loose dictionary keys.

=====================  =================================================================================
field (``extra`` key)  meaning
=====================  =================================================================================
``low_epoch``          the low watermark L of the inputs the snapshot's state expired with (input epochs)
``inflight_low_epoch`` the lowest own epoch of the in-flight rows parked as channel state (replayed first)
``source_files``       per source partition, ``[seq, size]`` of each file read (:mod:`pipeline.source.contract`)
``records``            per source: the records of the snapshot round
``round_records``      per round of the checkpoint: its records per source
``alignment``          the barrier alignment's figures (mode used, alignment ms, in-flight bytes, ...)
``dropped``            per operator: rows dropped by design (deduplicate)
``dead_letter_files``  the operator dead-letter files the checkpoint counts (``{"epoch", "files"}``)
``source_bytes_per_row`` per source: the Arrow bytes per row the reads measured (bounds a later tagged round)
=====================  =================================================================================
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RecoveryFields", "DEAD_LETTER_FILES_KEY", "BYTES_PER_ROW_KEY"]

#: ``extra`` key of :attr:`RecoveryFields.dead_letter_files`
DEAD_LETTER_FILES_KEY = "dead_letter_files"
#: ``extra`` key of :attr:`RecoveryFields.bytes_per_row`
BYTES_PER_ROW_KEY = "source_bytes_per_row"


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


@dataclass(frozen=True, slots=True)
class RecoveryFields:
    """The recovery fields of one ``_metadata`` (see the module docstring); absent fields are None / empty."""

    low_epoch: int | None = None
    inflight_low_epoch: int | None = None
    source_files: Mapping[str, Any] = field(default_factory=dict)
    records: Mapping[str, int] | None = None
    round_records: tuple[Mapping[str, int], ...] = ()
    alignment: Mapping[str, Any] = field(default_factory=dict)
    dropped: Mapping[str, int] = field(default_factory=dict)
    dead_letter_files: Mapping[str, Any] = field(default_factory=dict)
    bytes_per_row: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, extra: Mapping[str, Any] | None) -> RecoveryFields:
        """The fields as ``_metadata``'s ``extra`` holds them."""
        e = extra or {}
        rec = e.get("records")
        return cls(low_epoch=_int(e.get("low_epoch")), inflight_low_epoch=_int(e.get("inflight_low_epoch")),
                   source_files=dict(e.get("source_files") or {}),
                   records=None if rec is None else {str(s): int(n) for s, n in rec.items()},
                   round_records=tuple(dict(r) for r in (e.get("round_records") or ())),
                   alignment=dict(e.get("alignment") or {}),
                   dropped={str(u): int(n) for u, n in (e.get("dropped") or {}).items()},
                   dead_letter_files=dict(e.get(DEAD_LETTER_FILES_KEY) or {}),
                   bytes_per_row={str(s): float(v) for s, v in (e.get(BYTES_PER_ROW_KEY) or {}).items()})

    def low_epoch_or(self, epoch: int) -> int:
        """L, or ``epoch`` (the checkpoint's own) when the checkpoint records none."""
        return epoch if self.low_epoch is None else self.low_epoch

    def to_extra(self) -> dict[str, Any]:
        """The ``extra`` object these fields are written as (absent fields left out, as before)."""
        out: dict[str, Any] = {}
        if self.records is not None:
            out["records"] = dict(self.records)
        if self.round_records:
            out["round_records"] = [dict(r) for r in self.round_records]
        if self.alignment:
            out["alignment"] = dict(self.alignment)
        out["dropped"] = dict(sorted(self.dropped.items()))
        if self.low_epoch is not None:
            out["low_epoch"] = int(self.low_epoch)
        if self.inflight_low_epoch is not None:
            out["inflight_low_epoch"] = int(self.inflight_low_epoch)
        if self.dead_letter_files:
            out[DEAD_LETTER_FILES_KEY] = dict(self.dead_letter_files)
        if self.bytes_per_row:
            out[BYTES_PER_ROW_KEY] = dict(self.bytes_per_row)
        out["source_files"] = dict(self.source_files)
        return out
