"""Watermark channels through operators (docs/concepts/watermarks.md, docs/windows.md "Channels"): which channel a
record reaching a window comes from, decided on the job graph alone.

* A record read from a source keeps the channel ``<source>/<partition>`` of its source partition through stateless
  steps (``filter``/``select``, ``union``, ``lookup_join``) and through the operators that **forward** their input
  rows' channels (:func:`forwards_channels`): a keep-first ``deduplicate`` (its output row is an input row) and a
  ``join`` (not retracting): its output row carries the channels of BOTH rows it was made of (an unmatched outer
  row only its own side's; :mod:`pipeline.operators.channel_sets`) and counts for each of them. Such an operator's
  output watermark is thus the minimum of its inputs' watermarks, channel by channel (Flink's rule).
* A record built by any other operator (``process``, an ``aggregate``, ``top_n``, a window's output, a retracting
  join) comes from the one channel ``op:<uid>`` of that operator (:func:`operator_channel`). A ``process`` output row
  is built by user code from the key's state and timers, not from one input row, so it cannot be attributed.

The runtime tags the channel on the rows (``_wm_channel``, :mod:`pipeline.runtime.operators.window`; a join keeps
it in its state for the rows it holds); the batch evaluation derives the same name per row from its source
position, a join's channel column or :func:`fixed_channels`.
"""
from __future__ import annotations

from pipeline.exceptions import ConfigError
from pipeline.job import (
    DedupNode,
    Job,
    JoinNode,
    LookupJoinNode,
    SourceNode,
    UnionNode,
)
from pipeline.operators.channel_sets import SEPARATOR

__all__ = ["forwards_channels", "operator_channel", "needs_channels", "fixed_channels", "source_channel_name",
           "check_channel_names"]


def source_channel_name(source: str, partition: int) -> str:
    """The channel of a source partition, as the runtime and the batch evaluation spell it."""
    return f"{source}/{partition}"


def forwards_channels(node: object, job: Job | None = None) -> bool:
    """Whether the operator ``node`` forwards its input rows' watermark channels: a keep-first ``deduplicate`` emits
    its input rows unchanged (or drops them), so each row keeps the channel it came from; a ``join`` that does not
    read an updating stream (``job``: to tell) emits rows made of one or two input rows, each carrying their
    channels."""
    if isinstance(node, JoinNode):
        return job is None or not job.retracting_join(node)
    return isinstance(node, DedupNode) and getattr(node, "keep", "first") == "first"


def operator_channel(job: Job, nid: int) -> str:
    """The one channel of the rows built by operator ``nid`` (one that does not forward channels)."""
    return f"op:{getattr(job.nodes[nid], 'uid', nid)}"


def needs_channels(job: Job, nid: int) -> bool:
    """Whether the rows leaving operator ``nid`` must carry their watermark channel: it forwards channels and a
    window or an interval/temporal join or an over aggregate (the operators with a watermark) reads its rows,
    through stateless steps and other forwarding operators (:meth:`pipeline.job.Job.feeds_watermark`)."""
    return forwards_channels(job.nodes[nid], job) and job.feeds_watermark(nid)


def fixed_channels(job: Job, nid: int) -> frozenset[str]:
    """The ``op:<uid>`` channels among the rows of node ``nid`` (through stateless steps and forwarding operators):
    the channels of the rows that carry no source position. Empty: every row comes from a source partition or a
    join that carries its rows' channels (asked for a watermark consumer downstream of it: :func:`needs_channels`
    holds for that join, so each of its rows carries its channel set)."""
    base, _maps = job.chain_to(nid)
    node = job.nodes[base]
    if isinstance(node, SourceNode):
        return frozenset()
    if isinstance(node, (UnionNode, LookupJoinNode)):
        return frozenset().union(*(fixed_channels(job, p) for p in node.parents))
    if isinstance(node, DedupNode) and forwards_channels(node):
        return fixed_channels(job, node.parent)
    if isinstance(node, JoinNode) and forwards_channels(node, job):
        return frozenset()
    return frozenset((operator_channel(job, base),))


def check_channel_names(job: Job, where: str) -> None:
    """Refuse a source name that contains the channel-set separator: a join carrying channel sets
    (:mod:`pipeline.operators.channel_sets`) could not tell its channels apart."""
    bad = [n for n in job.source_names() if SEPARATOR in n]
    if bad:
        raise ConfigError(f"join {where}: source names {bad} contain {SEPARATOR!r}, which separates the watermark "
                          "channels a join output row carries (docs/concepts/watermarks.md); rename the source")
