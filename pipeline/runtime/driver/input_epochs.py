"""The epochs of a round's input: each record's own epoch ``p(x)`` and the low watermark ``L`` of the inputs.

**Own epoch.** ``p(x)`` is the first logged epoch ``k`` whose barrier lies after record ``x`` in its source
partition (the write-ahead barrier log, ``barriers/epoch-<k>.json``; the batch evaluation's processing epoch,
:mod:`pipeline.batch.evaluation.prefix`). It is a function of the record's position and the barrier log only, so it is the
same whichever round, checkpoint or alignment mode consumes the record: an unaligned checkpoint draining a
backlog of epoch 2 in checkpoint 5 still hands the join records of epoch 2; an at-least-once checkpoint reading
past barrier ``n`` hands it records of epoch ``n + 1``. The source stage tags every record with it (the column
:data:`pipeline.operators.ttl.ROW_EPOCH`): the driver cuts each round's splits at the logged barriers and
gives every piece its epoch (:meth:`InputEpochs.tag_splits`).

**Low watermark.** A round of checkpoint ``n`` expires state with the cutoff ``end(L) - ttl``,
``L = min(n, own epoch of the next record of every channel, lowest own epoch of the previous snapshot's
in-flight channel state while it is replayed)``. No record still to be consumed has an own epoch below ``L``, so no state row is
expired while a record it must still meet is pending; aligned checkpoints always have ``L = n``. ``L`` is a
function of positions and the barrier log (deterministic on replay); the snapshot's ``L`` is written to
``_metadata.extra.low_epoch`` (the batch evaluation and the quality suites read it), the lowest own epoch of
its in-flight channel state to ``_metadata.extra.inflight_low_epoch``.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipeline.checkpoint.channel import Channel
from pipeline.checkpoint.handles import Position
from pipeline.exceptions import CheckpointError

__all__ = ["InputEpochs", "ordinal"]


def ordinal(seq: int, row: int) -> int:
    """A position as one sortable integer (as :func:`pipeline.batch.evaluation.prefix.ordinal`)."""
    return (int(seq) << 32) + int(row)


@dataclass(frozen=True)
class InputEpochs:
    """The barriers of the logged epochs ``<= n`` per channel, as (ordinal, epoch) pairs in increasing order."""

    epoch: int                                             # n: the checkpoint being processed
    bounds: Mapping[Channel, tuple[tuple[int, int], ...]]
    known: frozenset[Channel]                              # channels whose barrier n is known (not lagging)

    @classmethod
    def build(cls, epoch: int, logged: Mapping[int, Mapping[str, Mapping[str, Position]]],
              current: Mapping[str, Mapping[str, Position | None]]) -> InputEpochs:
        """``logged``: barriers of logged epochs ``< epoch``; ``current``: barrier ``epoch`` (None: lagging)."""
        chans = {Channel.of(s, p) for s, parts in current.items() for p in parts}
        for b in logged.values():
            chans |= {Channel.of(s, p) for s, parts in b.items() for p in parts}
        bounds: dict[Channel, tuple[tuple[int, int], ...]] = {}
        for ch in chans:
            out: list[tuple[int, int]] = []
            best = -1
            for k in sorted(logged):
                pos = ch.lookup(logged[k])
                if pos is not None:
                    best = max(best, ordinal(pos.seq, pos.row))
                    out.append((best, k))
            cur = ch.lookup(current)
            if cur is not None:
                out.append((max(best, ordinal(cur.seq, cur.row)), epoch))
            bounds[ch] = tuple(out)
        known = frozenset(ch for ch in chans if ch.lookup(current) is not None)
        return cls(epoch, bounds, known)

    def _bounds(self, ch: Channel) -> tuple[tuple[int, int], ...]:
        """The barriers of channel ``ch``; a channel this epoch has no barrier entry for is an error (a silent
        fallback would give its records the wrong own epoch)."""
        try:
            return self.bounds[ch]
        except KeyError:
            known = ", ".join(sorted(c.name for c in self.bounds))
            raise CheckpointError(f"own epochs of checkpoint epoch {self.epoch}: unknown channel {ch!r} (the barrier "
                                  f"log has no entry for it; its channels: {known or 'none'})") from None

    def epoch_of(self, ch: Channel, seq: int, row: int) -> int:
        """The own epoch of the record at ``(seq, row)`` of channel ``ch`` (:class:`~pipeline.exceptions.
        CheckpointError` if ``ch`` is not one of this epoch's channels)."""
        b = self._bounds(ch)
        i = bisect_right([o for o, _ in b], ordinal(seq, row))
        if i < len(b):
            return b[i][1]
        # past barrier n (at-least-once read-ahead): epoch n + 1; a lagging channel's records belong to n
        return self.epoch + 1 if ch in self.known else self.epoch

    def epoch_at(self, ch: Channel, pos: Position) -> int:
        return self.epoch_of(ch, pos.seq, pos.row)

    def low_watermark(self, starts: Mapping[Channel, Position], replay_floor: int | None = None) -> int:
        """``L`` of a round whose channels start reading at ``starts`` (``replay_floor``: the lowest own epoch of
        the previous snapshot's in-flight channel state while it is replayed this round)."""
        low = self.epoch
        for ch, pos in starts.items():
            low = min(low, self.epoch_at(ch, pos))
        if replay_floor is not None:
            low = min(low, replay_floor)
        return low

    def tag_splits(self, ch: Channel, splits: Sequence[dict]) -> list[dict]:
        """``splits`` (split dicts of channel ``ch``) cut at the barriers inside them, each with ``epoch``."""
        cuts = [o for o, _ in self._bounds(ch)]
        out: list[dict] = []
        for sp in splits:
            start, stop = int(sp["row_start"]), sp.get("row_end")
            if stop is None:  # a whole unreadable file: no rows, dead-lettered by the reader
                out.append({**sp, "epoch": self.epoch_of(ch, int(sp["seq"]), start)})
                continue
            seq = int(sp["seq"])
            inner = sorted({o & 0xFFFFFFFF for o in cuts if o >> 32 == seq and start < (o & 0xFFFFFFFF) < stop})
            edges = [start] + inner + [int(stop)]
            for a, b in zip(edges, edges[1:]):
                out.append({**sp, "row_start": a, "row_end": b, "epoch": self.epoch_of(ch, seq, a)})
        return out
