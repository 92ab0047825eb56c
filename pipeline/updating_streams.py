"""Which nodes of a job exchange a changelog (docs/operators.md "Updating streams").

A running ``aggregate`` or a ``top_n`` / ``keep_last`` whose output reaches an ``aggregate`` or an
``over_aggregate`` (through ``filter``, ``select``, ``union``) emits a retract changelog to it: per round and changed group (top-N: touched key), its
previous row(s) with ``_sign = -1`` and its new row(s) with ``_sign = +1`` (:mod:`pipeline.operators.retract`).
A join reading such a stream is a **retracting join** (:mod:`pipeline.operators.retract_join`): it reads the
changelog and emits its own (pairs taken back and added), to an aggregate, another retracting join or an upsert
sink. Every other consumer (a dedup, a top-N, a window, a process function, a sink writer but that of a deleting
sink) keeps reading the added rows only, as before; of a retracting join, those are refused. A window with ``emit="update"`` does not emit a changelog yet: an aggregate reading one
is refused (:func:`unsupported_reason`) before anything runs.

An upsert sink reached by an operator whose results can vanish (an aggregate over a changelog: its emptied groups;
a retracting join; an over aggregate over a changelog: the rows that vanish upstream) **deletes** (:func:`sink_deletes`, :mod:`pipeline.sink.deletes`): the operator's own sink gets a tombstone per
vanished group; any other such sink gets the operator's changelog through its sink writer, which writes, per key,
the last added row or a tombstone when the key's rows were only retracted (a filter after an update)."""
from __future__ import annotations

from typing import Any

from pipeline.job import (
    AggregateNode,
    IntervalJoinNode,
    Job,
    JoinNode,
    OverAggregateNode,
    RankNode,
    SinkNode,
    TemporalJoinNode,
    WindowNode,
    emits_updates,
    is_operator,
)
from pipeline.operators.join import JoinType, Uniqueness
from pipeline.operators.retract import unretractable

__all__ = ["reads_changelog", "emits_changelog", "unsupported_reason", "deleting_producers", "sink_deletes",
           "writer_reads_changelog", "join_unsupported_reason", "over_unsupported_reason"]


def _inputs(op) -> tuple[int, ...]:
    return (op.left, op.right) if isinstance(op, JoinNode) else (op.parent,)


def _bases(job: Job, op) -> list[int]:
    return sorted(set().union(*(job.bases(p) for p in _inputs(op))))


def _producer(job: Job, node) -> bool:
    """``node`` emits a retract changelog to a consumer that reads one: a running aggregate, a top-N, a retracting
    join."""
    return isinstance(node, (AggregateNode, RankNode)) or job.retracting_join(node)


def reads_changelog(job: Job, op) -> bool:
    """``op`` is an aggregate or a join reading a running aggregate's, a top-N's or a retracting join's output: its
    input is a changelog (the retraction kernel, the retracting join)."""
    if isinstance(op, JoinNode):
        return job.retracting_join(op)
    if isinstance(op, OverAggregateNode):  # a running aggregate's or a top-N's changelog (not a join's: refused)
        bases = [job.nodes[b] for b in _bases(job, op)]
        return (any(isinstance(b, (AggregateNode, RankNode)) for b in bases)
                and not any(isinstance(b, JoinNode) and job.retracting_join(b) for b in bases))
    if not isinstance(op, AggregateNode):
        return False
    return any(_producer(job, job.nodes[b]) for b in _bases(job, op))


def emits_changelog(job: Job, node_id: int) -> bool:
    """Node ``node_id`` is a changelog producer with a consumer that reads its changelog (an aggregate, a
    retracting join, the sink writer of a deleting sink)."""
    if not (_producer(job, job.nodes[node_id]) or _updating_over(job, job.nodes[node_id])):
        return False
    if node_id in deleting_producers(job) and any(writer_reads_changelog(job, s) and node_id in job.bases(s.parent)
                                                  for s in job.sinks()):
        return True
    return any(reads_changelog(job, o) and node_id in _bases(job, o) for o in job.operators())


def unsupported_reason(job: Job, op) -> str | None:
    """Why the runtime cannot run aggregate ``op`` over its updating input exactly (None: it can, or its input is
    an append stream)."""
    if not isinstance(op, AggregateNode):
        return None
    bases: list[Any] = [job.nodes[b] for b in _bases(job, op)
                        if emits_updates(job.nodes[b]) or _producer(job, job.nodes[b])]
    over = [b for b in bases if isinstance(b, OverAggregateNode)]
    if over:
        return (f"aggregate {op.uid!r} reads the updating stream of over aggregate {over[0].uid!r}, whose "
                "changelog only its upsert sinks read (rows replaced or deleted by key); sink it with "
                "mode='upsert' (docs/operators.md \"Over aggregate\")")
    other = [b for b in bases if isinstance(b, WindowNode)]
    if other:
        return (f"aggregate {op.uid!r} reads the updating stream of window {other[0].uid!r} (emit='update'), which "
                "does not emit retractions yet (a running aggregate and a top-N do); aggregate its final rows "
                "instead (emit='final'), or sink it with mode='upsert' (docs/operators.md \"Updating streams\")")
    if reads_changelog(job, op) and (why := _partition_reason(job, job.node_id(op))) is not None:
        return why
    bad = unretractable(op.aggs) if bases else []
    if bad:
        return (f"aggregate {op.uid!r} reads the updating stream of {bases[0].uid!r}: {bad} use min, max or "
                "count_distinct, which cannot take back a retracted row; use count, sum or avg "
                "(docs/operators.md \"Updating streams\")")
    return None


def join_unsupported_reason(job: Job, op) -> str | None:
    """Why the runtime cannot run join ``op`` over its updating input exactly, or cannot deliver its changelog
    (None: it can, or it reads append streams only)."""
    if not isinstance(op, JoinNode):
        return None
    windows = [n for n in (job.nodes[b] for b in _bases(job, op)) if isinstance(n, WindowNode) and n.emit == "update"]
    if not reads_changelog(job, op):
        return None
    doc = "(docs/operators.md \"Updating streams\")"
    if windows:
        return (f"join {op.uid!r} reads the updating stream of window {windows[0].uid!r} (emit='update'), which does "
                f"not emit retractions yet; join its final rows (emit='final') {doc}")
    if op.how is not JoinType.INNER or op.unique is not Uniqueness.NONE:
        return (f"join {op.uid!r} reads an updating stream: only an inner join without unique= can take back the "
                f"pairs it emitted (has how={op.how.value!r}, unique={op.unique.value!r}) {doc}")
    if op.output and "_ingest_ts" in op.output:
        return f"join {op.uid!r} reads an updating stream: its pairs have no _ingest_ts; leave it out of output= {doc}"
    nid = job.node_id(op)
    if (why := _partition_reason(job, nid)) is not None:
        return why
    for s in job.sinks():
        if nid in job.bases(s.parent) and s.mode != "upsert":
            return (f"sink {s.table!r} appends the output of join {op.uid!r}, an updating stream (pairs are taken back "
                    f"when the updating input changes); sink it with mode='upsert' and a key of the result {doc}")
    for o in job.operators():
        if o is not op and nid in _bases(job, o) and not reads_changelog(job, o):
            return (f"{type(o).__name__} {o.uid!r} reads the output of join {op.uid!r}, an updating stream: only an "
                    f"aggregate (count, sum, avg), another join or an upsert sink can read it {doc}")
        if isinstance(o, (IntervalJoinNode, TemporalJoinNode)) and nid in _bases(job, o):
            return f"{type(o).__name__} {o.uid!r} cannot read the updating stream of join {op.uid!r} {doc}"
    return None


def _partition_reason(job: Job, nid: int) -> str | None:
    """A deleting sink of node ``nid`` partitioned by a column outside its key: a tombstone carries the key only."""
    for s in job.sinks():
        if nid in job.bases(s.parent) and s.mode == "upsert" and not set(s.partition_by) <= set(s.key):
            return (f"sink {s.table!r} deletes rows (an updating stream reaches it) but is partitioned by "
                    f"{[c for c in s.partition_by if c not in s.key]}, outside its key {list(s.key)}: a delete "
                    "carries the key only; partition by key columns (docs/operators.md \"Updating streams\")")
    return None


def _updating_over(job: Job, node) -> bool:
    """``node`` is an over aggregate reading a changelog: it emits one too (an output no longer current retracted,
    the new one added), so a row that vanishes upstream leaves its sinks (docs/operators.md "Over aggregate")."""
    return isinstance(node, OverAggregateNode) and reads_changelog(job, node)


def over_unsupported_reason(job: Job, op) -> str | None:
    """Why the runtime cannot deliver over aggregate ``op``'s changelog to its sinks (None: it can, or it reads an
    append stream): a deleting sink partitioned outside its key."""
    return _partition_reason(job, job.node_id(op)) if _updating_over(job, op) else None


def deleting_producers(job: Job) -> frozenset[int]:
    """Operators whose results can vanish: an aggregate reading a changelog (a group whose every upstream row was
    retracted leaves its result), a retracting join (its pairs are taken back), an over aggregate reading a
    changelog (an upstream row retracted and not added back leaves its result)."""
    return frozenset(i for i, n in enumerate(job.nodes)
                     if is_operator(n) and isinstance(n, (AggregateNode, JoinNode, OverAggregateNode))
                     and reads_changelog(job, n))


def sink_deletes(job: Job, sink: SinkNode) -> bool:
    """Upsert sink ``sink`` applies deletes by key: an operator whose results can vanish reaches it."""
    return sink.mode == "upsert" and bool(job.bases(sink.parent) & deleting_producers(job))


def writer_reads_changelog(job: Job, sink: SinkNode) -> bool:
    """Deleting sink ``sink`` is written by a sink writer (not by the operator's own tasks): the writer reads the
    changelog of the operators reaching it."""
    if not sink_deletes(job, sink):
        return False
    return job.operator_sink(sink.parent) is not sink
