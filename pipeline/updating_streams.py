"""Which nodes of a job exchange a changelog (docs/operators.md "Updating streams").

A running ``aggregate`` whose output reaches another ``aggregate`` (through ``filter``, ``select``, ``union``)
emits a retract changelog to it: per round and changed group, its previous row with ``_sign = -1`` and its new
row with ``_sign = +1`` (:mod:`pipeline.operators.retract`). Every other consumer (a join, a dedup, a top-N, a
window, a process function, a sink writer) keeps reading the added rows only, as before. The other updating
streams (a top-N, a window with ``emit="update"``) do not emit a changelog yet: an aggregate reading one is
refused (:func:`unsupported_reason`) before anything runs."""
from __future__ import annotations

from pipeline.job import AggregateNode, Job, RankNode, WindowNode, emits_updates
from pipeline.operators.retract import unretractable

__all__ = ["reads_changelog", "emits_changelog", "unsupported_reason"]


def _updating_bases(job: Job, op) -> list:
    return [job.nodes[b] for b in sorted(job.bases(op.parent)) if emits_updates(job.nodes[b])]


def reads_changelog(job: Job, op) -> bool:
    """``op`` is an aggregate reading a running aggregate's output: its input is a changelog (retraction kernel)."""
    return isinstance(op, AggregateNode) and any(isinstance(b, AggregateNode) for b in _updating_bases(job, op))


def emits_changelog(job: Job, node_id: int) -> bool:
    """Node ``node_id`` is a running aggregate with a consumer that reads its changelog."""
    if not isinstance(job.nodes[node_id], AggregateNode):
        return False
    return any(isinstance(o, AggregateNode) and reads_changelog(job, o) and node_id in job.bases(o.parent)
               for o in job.operators())


def unsupported_reason(job: Job, op) -> str | None:
    """Why the runtime cannot run aggregate ``op`` over its updating input exactly (None: it can, or its input is
    an append stream)."""
    if not isinstance(op, AggregateNode):
        return None
    bases = _updating_bases(job, op)
    other = [b for b in bases if isinstance(b, (RankNode, WindowNode))]
    if other:
        what = "top-N" if isinstance(other[0], RankNode) else "window with emit='update'"
        return (f"aggregate {op.uid!r} reads the updating stream of {what} {other[0].uid!r}, which does not emit "
                "retractions yet (only a running aggregate does); aggregate its final rows instead "
                "(emit='final'), or sink it with mode='upsert' (docs/operators.md \"Updating streams\")")
    bad = unretractable(op.aggs) if bases else []
    if bad:
        return (f"aggregate {op.uid!r} reads the updating stream of aggregate {bases[0].uid!r}: {bad} use min, max or "
                "count_distinct, which cannot take back a retracted row; use count, sum or avg "
                "(docs/operators.md \"Updating streams\")")
    return None
