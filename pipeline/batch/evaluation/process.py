"""Batch rule of ``process``: not computed. Its output is defined only by the user's function, called per subtask
and round (docs/process.md), so it has no batch meaning; what it feeds is checked by replay instead. The reason is
recorded for the deduplicate it feeds (:func:`process_reason`)."""
from __future__ import annotations

from pipeline.batch.evaluation.context import PlanContext
from pipeline.job import AggregateNode, DedupNode, JoinNode, ProcessNode, SourceNode, WindowNode


def process_reason(plan: PlanContext, op: DedupNode, parent: int) -> str | None:
    """Why a deduplicate fed (through joins, windows, deduplicates) by a ``process`` is not checked against the
    batch evaluation, or None when no process feeds it."""
    seen: set[int] = set()
    todo, found = [parent], None
    while todo and found is None:
        base = plan.job.chain_to(todo.pop())[0]
        node = plan.job.nodes[base]
        if base in seen or isinstance(node, SourceNode):
            continue
        seen.add(base)
        if isinstance(node, ProcessNode):
            found = node
        elif isinstance(node, JoinNode):
            todo += [node.left, node.right]
        elif isinstance(node, (AggregateNode, DedupNode, WindowNode)):
            todo.append(node.parent)
    if found is None:
        return None
    multi = plan.round_log().multi_round_epochs
    rounds = (f" Epochs {list(multi)} took several rounds: even the round in which a row reaches it is unknown, "
              "since process output rows do not correspond to input rows (one call may emit rows for any of its "
              "keys, or none)." if multi else "")
    return (f"deduplicate {op.uid} is fed by process {found.uid}, whose output the batch evaluation does not "
            "compute: it is defined only by the user's function, called once per subtask and round with that "
            "round's rows of the subtask's key groups (docs/process.md), so it depends on round boundaries and "
            f"parallelism and has no batch meaning.{rounds} Checked by replay of the validated epoch instead "
            "(docs/batch.md \"process: determinism under replay\")")
