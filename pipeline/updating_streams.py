"""Which nodes of a job exchange a changelog (docs/operators.md "Updating streams").

A running ``aggregate`` or a ``top_n`` / ``keep_last`` whose output reaches an ``aggregate`` or an
``over_aggregate`` (through ``filter``, ``select``, ``union``) emits a retract changelog to it: per round and changed group (top-N: touched key), its
previous row(s) with ``_sign = -1`` and its new row(s) with ``_sign = +1`` (:mod:`pipeline.operators.retract`).
Every other consumer (a join, a dedup, a top-N, a window, a process function, a sink writer) keeps reading the
added rows only, as before. A window with ``emit="update"`` does not emit a changelog yet: an aggregate reading one
is refused (:func:`unsupported_reason`) before anything runs."""
from __future__ import annotations

from pipeline.job import AggregateNode, Job, OverAggregateNode, RankNode, WindowNode, emits_updates
from pipeline.operators.retract import unretractable

__all__ = ["reads_changelog", "emits_changelog", "unsupported_reason"]


def _updating_bases(job: Job, op) -> list:
    return [job.nodes[b] for b in sorted(job.bases(op.parent)) if emits_updates(job.nodes[b])]


def reads_changelog(job: Job, op) -> bool:
    """``op`` is an aggregate reading a running aggregate's or a top-N's output: its input is a changelog (the
    retraction kernel)."""
    return isinstance(op, (AggregateNode, OverAggregateNode)) and any(isinstance(b, (AggregateNode, RankNode))
                                                                      for b in _updating_bases(job, op))


def emits_changelog(job: Job, node_id: int) -> bool:
    """Node ``node_id`` is a running aggregate or a top-N with a consumer that reads its changelog."""
    if not isinstance(job.nodes[node_id], (AggregateNode, RankNode)):
        return False
    return any(isinstance(o, (AggregateNode, OverAggregateNode)) and reads_changelog(job, o)
               and node_id in job.bases(o.parent)
               for o in job.operators())


def unsupported_reason(job: Job, op) -> str | None:
    """Why the runtime cannot run aggregate ``op`` over its updating input exactly (None: it can, or its input is
    an append stream)."""
    if not isinstance(op, AggregateNode):
        return None
    bases = _updating_bases(job, op)
    over = [b for b in bases if isinstance(b, OverAggregateNode)]
    if over:
        return (f"aggregate {op.uid!r} reads the updating stream of over aggregate {over[0].uid!r}, which emits "
                "no retractions (its rows replace earlier rows of the same key in an upsert sink); sink it with "
                "mode='upsert' (docs/operators.md \"Over aggregate\")")
    other = [b for b in bases if isinstance(b, WindowNode)]
    if other:
        return (f"aggregate {op.uid!r} reads the updating stream of window {other[0].uid!r} (emit='update'), which "
                "does not emit retractions yet (a running aggregate and a top-N do); aggregate its final rows "
                "instead (emit='final'), or sink it with mode='upsert' (docs/operators.md \"Updating streams\")")
    bad = unretractable(op.aggs) if bases else []
    if bad:
        return (f"aggregate {op.uid!r} reads the updating stream of {bases[0].uid!r}: {bad} use min, max or "
                "count_distinct, which cannot take back a retracted row; use count, sum or avg "
                "(docs/operators.md \"Updating streams\")")
    return None
