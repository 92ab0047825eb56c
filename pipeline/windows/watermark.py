"""The window operator's watermark (docs/windows.md "Watermark"): a frozen value and a pure update function.

``M_c`` is the highest event time seen on input channel ``c`` (a source partition ``<source>/<partition>``, kept
through stateless steps and deduplicates, or ``op:<uid>`` for rows built by another upstream operator:
:mod:`pipeline.windows.channels`). A channel is *active* in an epoch iff it
delivered at least one record with a non-null event time in that epoch. After epoch ``m``::

    W(m) = max(W(m-1), min over active c of M_c(m) - O)     (W(m-1) if no channel is active)

The value is checkpointed as a small table (:meth:`WatermarkState.to_table`) and restores exactly.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.exceptions import CorruptCheckpointError
from pipeline.operators.channel_sets import split_channels

__all__ = ["WatermarkState", "observe_channels", "merge_observations", "WATERMARK_SCHEMA", "OPERATOR_ROW"]

WATERMARK_SCHEMA = pa.schema([("channel", pa.string()), ("max_event_us", pa.int64())])
OPERATOR_ROW = ""  # channel name of the row holding the operator watermark W itself (null: none yet)


@dataclass(frozen=True, slots=True)
class WatermarkState:
    """``watermark_us``: W (None = -inf, nothing seen); ``channels``: sorted ``(channel, M_c)`` pairs."""

    watermark_us: int | None = None
    channels: tuple[tuple[str, int], ...] = ()

    def channel_max(self) -> dict[str, int]:
        return dict(self.channels)

    def advance(self, observed: Mapping[str, int], out_of_orderness_us: int) -> WatermarkState:
        """The state after an epoch in which the channels in ``observed`` were active, each with the highest
        event time it delivered in that epoch. Channels absent from ``observed`` are idle."""
        merged = self.channel_max()
        for ch, t in observed.items():
            if t is None:
                continue
            merged[ch] = max(merged.get(ch, t), int(t))
        active = [merged[ch] for ch, t in observed.items() if t is not None]
        wm = self.watermark_us
        if active:
            cand = min(active) - out_of_orderness_us
            wm = cand if wm is None else max(wm, cand)
        return WatermarkState(wm, tuple(sorted(merged.items())))

    def to_table(self) -> pa.Table:
        chans = [OPERATOR_ROW] + [c for c, _ in self.channels]
        vals = [self.watermark_us] + [t for _, t in self.channels]
        return pa.table([pa.array(chans, pa.string()), pa.array(vals, pa.int64())], schema=WATERMARK_SCHEMA)

    @classmethod
    def from_table(cls, table: pa.Table | None, where: str = "") -> WatermarkState:
        """Inverse of :meth:`to_table`. Several identical copies (one per subtask) may be concatenated."""
        if table is None or table.num_rows == 0:
            return cls()
        rows: dict[str, int] = {}
        for ch, t in zip(table["channel"].to_pylist(), table["max_event_us"].to_pylist()):
            if ch in rows and rows[ch] != t:
                raise CorruptCheckpointError(f"watermark state {where}: copies disagree on channel {ch!r}")
            rows[ch] = t
        if OPERATOR_ROW not in rows:
            raise CorruptCheckpointError(f"watermark state {where}: no operator watermark row")
        wm = rows.pop(OPERATOR_ROW)
        return cls(wm, tuple(sorted((c, int(t)) for c, t in rows.items())))


def observe_channels(channel, event_time, key=None) -> dict[str, int]:
    """Per channel, the highest event time (µs) among the given rows that have a non-null event time (and a
    non-null ``key``, if given: bad records do not move the watermark): the channels active in them. A row whose
    channel is a set (a join's output row: :mod:`pipeline.operators.channel_sets`) counts for each of its channels."""
    t = pa.table({"c": channel, "t": pc.cast(pc.cast(event_time, pa.timestamp("us", tz="UTC"))
                                             if pa.types.is_timestamp(event_time.type) else event_time, pa.int64())})
    ok = pc.is_valid(t["t"])
    if key is not None:
        ok = pc.and_(ok, pc.is_valid(key))
    t = t.filter(ok)
    if t.num_rows == 0:
        return {}
    g = t.group_by("c", use_threads=False).aggregate([("t", "max")])
    return merge_observations(*({c: int(v) for c in split_channels(s)}
                                for s, v in zip(g["c"].to_pylist(), g["t_max"].to_pylist())))


def merge_observations(*obs: Mapping[str, int]) -> dict[str, int]:
    """Max per channel over several observations (markers of several upstream tasks or rounds)."""
    out: dict[str, int] = {}
    for o in obs:
        for c, t in o.items():
            out[c] = t if c not in out else max(out[c], t)
    return out
