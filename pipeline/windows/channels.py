"""Watermark channels through operators (docs/concepts/watermarks.md, docs/windows.md "Channels"): which channel a
record reaching a window comes from, decided on the job graph alone.

* A record read from a source keeps the channel ``<source>/<partition>`` of its source partition through stateless
  steps (``filter``/``select``, ``union``, ``lookup_join``) and through the operators that **forward** their input
  rows (:func:`forwards_channels`: a keep-first ``deduplicate``). Such an operator's output watermark is thus the
  minimum of its inputs' watermarks, channel by channel (Flink's rule), and putting it in front of a window changes
  which records are late only through the rows it drops.
* A record built by any other operator (a ``join``, ``process``, an ``aggregate``, ``top_n``, a window's output) comes
  from the one channel ``op:<uid>`` of that operator (:func:`operator_channel`).

The runtime tags the channel on the rows (``_wm_channel``, :mod:`pipeline.runtime.operators.window`); the batch
evaluation derives the same name per row from its source position or from :func:`fixed_channel`.
"""
from __future__ import annotations

from pipeline.job import (
    DedupNode,
    IntervalJoinNode,
    Job,
    LookupJoinNode,
    OverAggregateNode,
    SourceNode,
    TemporalJoinNode,
    UnionNode,
    WindowNode,
)

__all__ = ["forwards_channels", "operator_channel", "needs_channels", "fixed_channels", "source_channel_name"]


def source_channel_name(source: str, partition: int) -> str:
    """The channel of a source partition, as the runtime and the batch evaluation spell it."""
    return f"{source}/{partition}"


def forwards_channels(node: object) -> bool:
    """Whether the operator ``node`` forwards its input rows' watermark channels: a keep-first ``deduplicate`` emits
    its input rows unchanged (or drops them), so each row keeps the channel it came from."""
    return isinstance(node, DedupNode) and getattr(node, "keep", "first") == "first"


def operator_channel(job: Job, nid: int) -> str:
    """The one channel of the rows built by operator ``nid`` (one that does not forward channels)."""
    return f"op:{getattr(job.nodes[nid], 'uid', nid)}"


def needs_channels(job: Job, nid: int) -> bool:
    """Whether the rows leaving operator ``nid`` must carry their watermark channel: it forwards channels and a
    window or an interval/temporal join (the operators with a watermark) reads its rows, through stateless steps and
    other forwarding operators."""
    if not forwards_channels(job.nodes[nid]):
        return False
    for op in job.operators():
        if any(nid in job.bases(i) for i in op.inputs):
            if isinstance(op, (WindowNode, IntervalJoinNode, TemporalJoinNode, OverAggregateNode)) or needs_channels(
                    job, job.node_id(op)):
                return True
    return False


def fixed_channels(job: Job, nid: int) -> frozenset[str]:
    """The ``op:<uid>`` channels among the rows of node ``nid`` (through stateless steps and forwarding operators):
    the channels of the rows that carry no source position. Empty: every row comes from a source partition."""
    base, _maps = job.chain_to(nid)
    node = job.nodes[base]
    if isinstance(node, SourceNode):
        return frozenset()
    if isinstance(node, (UnionNode, LookupJoinNode)):
        return frozenset().union(*(fixed_channels(job, p) for p in node.parents))
    if isinstance(node, DedupNode) and forwards_channels(node):
        return fixed_channels(job, node.parent)
    return frozenset((operator_channel(job, base),))
