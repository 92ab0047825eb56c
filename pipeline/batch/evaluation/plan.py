"""The batch plan of a job: composes the operator rules (one module each, see :mod:`pipeline.batch.evaluation`)
over the job graph, node by node from the sources, into lazy DataFrames per sink table and operator state
(:class:`~pipeline.batch.evaluation.result.BatchResult`), plus what is not modelled and why."""
from __future__ import annotations

from pipeline.batch.evaluation.aggregate import aggregate
from pipeline.batch.evaluation.context import PlanContext
from pipeline.batch.evaluation.dedup import dedup
from pipeline.batch.evaluation.join import join
from pipeline.batch.evaluation.join_keys import join_semantics
from pipeline.batch.evaluation.lookup import lookup
from pipeline.batch.evaluation.over_aggregate import over_aggregate
from pipeline.batch.evaluation.prefix import Prefix
from pipeline.batch.evaluation.rank import rank
from pipeline.batch.evaluation.result import BatchResult
from pipeline.batch.evaluation.sink import sink
from pipeline.batch.evaluation.sources import source_frame
from pipeline.batch.evaluation.stateless import map_rows, union
from pipeline.batch.evaluation.timed_join import timed_join
from pipeline.batch.evaluation.window import window
from pipeline.job import (
    AggregateNode,
    DedupNode,
    IntervalJoinNode,
    Job,
    JoinNode,
    LookupJoinNode,
    MapNode,
    OverAggregateNode,
    RankNode,
    SinkNode,
    SourceNode,
    TemporalJoinNode,
    UnionNode,
    WindowNode,
)

__all__ = ["PlanCompiler", "evaluate"]


class PlanCompiler(PlanContext):
    """One compilation of a job over a prefix: each node's frame built once by its operator's rule."""

    def _build(self, nid: int):
        node = self.job.nodes[nid]
        if isinstance(node, SourceNode):  # read once, used by every object downstream
            df = self.with_rounds(source_frame(self, node))
            return df if self._ranked_only(nid) else self.cache(df)
        if isinstance(node, MapNode):
            return map_rows(self, nid, node)
        if isinstance(node, UnionNode):
            return union(self, nid, node)
        if isinstance(node, LookupJoinNode):
            return lookup(self, nid, node)
        if isinstance(node, JoinNode):
            return join(self, nid, node)
        if isinstance(node, AggregateNode):
            return aggregate(self, nid, node)
        if isinstance(node, WindowNode):
            return window(self, nid, node)
        if isinstance(node, DedupNode):
            return dedup(self, nid, node)
        if isinstance(node, RankNode):
            return rank(self, nid, node)
        if isinstance(node, (IntervalJoinNode, TemporalJoinNode)):
            return timed_join(self, nid, node)
        if isinstance(node, OverAggregateNode):
            return over_aggregate(self, nid, node)
        self.bad[nid] = f"{type(node).__name__} is not modelled by the batch evaluation"
        return None

    def _ranked_only(self, nid: int) -> bool:
        """The source's one reader is a join side declared ``unique``, whose first rows per key are computed once and
        cached (:func:`~pipeline.batch.evaluation.join_keys.per_key`): caching the source too would only convert its
        rows twice."""
        readers: list[object] = [o for o in self.job.operators() for i in o.inputs if self.job.chain_to(i)[0] == nid]
        readers += [s for s in self.job.sinks() if self.job.chain_to(s.parent)[0] == nid]
        if len(readers) != 1 or not isinstance(readers[0], JoinNode):
            return False
        op = readers[0]
        _, unique = join_semantics(op)
        side = "left" if self.job.chain_to(op.left)[0] == nid else "right"
        return hasattr(op, "how") and unique in (side, "both") and self.job.chain_to(op.left)[0] != \
            self.job.chain_to(op.right)[0]

    def compile(self) -> BatchResult:
        self.result.frames = self.frames
        for op in self.job.operators():
            nid = self.job.node_id(op)
            if self.frame(nid) is None:
                for name in self.job.state_names(op.uid):
                    self.result.unchecked[f"state/{op.uid}/{name}"] = self.bad[nid]
        for s in self.job.sinks():
            sink(self, s)
        for n in self.job.nodes:
            if not isinstance(n, (SourceNode, MapNode, UnionNode, LookupJoinNode, JoinNode, AggregateNode, WindowNode,
                                  DedupNode, RankNode, SinkNode, IntervalJoinNode, TemporalJoinNode,
                                  OverAggregateNode)):
                self.result.messages.append(f"not checked: {type(n).__name__} nodes are not modelled yet")
        return self.result


def evaluate(runner, job: Job, prefix: Prefix, spark=None, fold: frozenset[str] | None = None) -> BatchResult:
    """Compile ``job`` into one Spark batch plan over ``prefix`` (lazy but for one count per ``unique`` join that
    ``fold`` names, None: all; see :attr:`~pipeline.batch.evaluation.context.PlanContext.fold`)."""
    return PlanCompiler(spark if spark is not None else runner.spark, runner, job, prefix, fold).compile()
