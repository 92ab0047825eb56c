"""Key groups, as in Flink's ``KeyGroupRangeAssignment``.

A key belongs to key group ``kg = pmod(xxhash64(key), max_parallelism)``; max parallelism is fixed when
the job is created (``job.json``). Operator subtask ``i`` of ``p`` owns the contiguous range computed by
:func:`range_for_subtask` (Flink's ``computeKeyGroupRangeForOperatorIndex``), and a key group goes to
subtask ``kg * p // max_parallelism``. Rescaling only changes which subtask reads which state file.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["KeyGroupRange", "range_for_subtask", "subtask_for_key_group", "key_group_expr", "subtask_expr"]


@dataclass(frozen=True, slots=True, order=True)
class KeyGroupRange:
    start: int
    end: int  # inclusive

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start - 1:
            raise ValueError(f"invalid key-group range [{self.start}, {self.end}]")

    def __contains__(self, kg: int) -> bool:
        return self.start <= kg <= self.end

    def overlaps(self, other: KeyGroupRange) -> bool:
        return self.start <= other.end and other.start <= self.end

    def within(self, other: KeyGroupRange) -> bool:
        return other.start <= self.start and self.end <= other.end

    @property
    def size(self) -> int:
        return self.end - self.start + 1


def range_for_subtask(max_parallelism: int, parallelism: int, subtask: int) -> KeyGroupRange:
    start = (subtask * max_parallelism + parallelism - 1) // parallelism
    end = ((subtask + 1) * max_parallelism - 1) // parallelism
    return KeyGroupRange(start, end)


def subtask_for_key_group(max_parallelism: int, parallelism: int, kg: int) -> int:
    return kg * parallelism // max_parallelism


def key_group_expr(key_col: str | Sequence[str], max_parallelism: int):
    """Spark Column computing the key group of ``key_col`` (a column, or several: an upsert sink's key)."""
    from pyspark.sql import functions as F
    cols = [key_col] if isinstance(key_col, str) else list(key_col)
    return F.pmod(F.xxhash64(*[F.col(c) for c in cols]), F.lit(max_parallelism)).cast("int")


def subtask_expr(kg_col: str, max_parallelism: int, parallelism: int):
    from pyspark.sql import functions as F
    return (F.col(kg_col) * F.lit(parallelism) / F.lit(max_parallelism)).cast("int")
