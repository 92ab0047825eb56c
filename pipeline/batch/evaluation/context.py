"""The shared state of one batch compilation (:class:`PlanContext`): the job, the prefix, each node's frame (built
once, on demand, by :class:`~pipeline.batch.evaluation.plan.PlanCompiler`), why a node's rows are not modelled, the
result being filled, and what several rules read: the cache of frames with several readers and the round log."""
from __future__ import annotations

from pipeline.batch.evaluation.prefix import Prefix
from pipeline.batch.evaluation.result import BatchResult
from pipeline.batch.evaluation.rounds import ROUND, RoundLog, read_round_log, round_task
from pipeline.job import DedupNode, Job


class PlanContext:
    """What the operator rules share while the plan compiles; :meth:`_build` (one node's frame) is the plan's."""

    def __init__(self, spark, runner, job: Job, prefix: Prefix, fold: frozenset[str] | None = None) -> None:
        self.spark, self.runner, self.job, self.prefix = spark, runner, job, prefix
        # joins whose repeated unique keys are looked for at compile time (one count on the cached per-key frame,
        # ``join_repeats.repeated_keys``); None: every join. The others are compiled as if no key repeated, their
        # violation counts flagged in :attr:`BatchResult.unfolded` (validation: a second pass folds those whose
        # count is not 0, so the usual case - no repeat - runs ONE query, with no eager action)
        self.fold = fold
        self.frames: dict[int, object] = {}
        self.bad: dict[int, str] = {}               # node -> why its rows are not modelled
        self.result = BatchResult(prefix)
        self.default_ttl = runner.config.state_ttl_seconds
        self._round_log: RoundLog | None = None
        self._read_memo: tuple[dict[str, dict[int, tuple[int, int]]] | None] | None = None   # sources.read_positions

    def frame(self, nid: int):
        if nid in self.bad:
            return None
        if nid not in self.frames:
            self.frames[nid] = self._build(nid)
        return self.frames[nid]

    def _build(self, nid: int):
        raise NotImplementedError   # pipeline.batch.evaluation.plan.PlanCompiler

    def cache(self, df):
        """Persist ``df`` for the plan's several readers, without the columnar compression of Spark's cache
        (read by Spark when the cache is declared): building the compressed column buffers cost more CPU than
        computing the join frame again (docs/batch.md, session 10 profile); the frame is read a few times from
        memory, then released."""
        from pyspark import StorageLevel
        key = "spark.sql.inMemoryColumnarStorage.compressed"
        before = self.spark.conf.get(key, "true")
        self.spark.conf.set(key, "false")
        try:
            df = df.persist(StorageLevel.MEMORY_AND_DISK)
        finally:
            self.spark.conf.set(key, before)
        self.result.cached.append(df)
        return df

    def round_log_if_needed(self) -> RoundLog | None:
        """The round log when the lineage has multi-round checkpoints and the job a deduplicate (the one operator
        whose result depends on round boundaries); None otherwise."""
        if not any(isinstance(o, DedupNode) for o in self.job.operators()) and not any(
                s.mode == "upsert" and self.job.operator_sink(s.parent) is not s for s in self.job.sinks()):
            return None
        rounds = self.round_log()
        return rounds if rounds.multi_round_epochs else None

    def with_rounds(self, df):
        """A source's rows with their round ``r(x)`` (:data:`ROUND`) when the lineage has multi-round checkpoints and
        the job a deduplicate (:meth:`round_log_if_needed`); ``df`` otherwise."""
        rounds = self.round_log_if_needed()
        if rounds is None:
            return df
        from pyspark.sql.types import LongType, StructField, StructType
        return df.mapInArrow(round_task(rounds), StructType([*df.schema.fields, StructField(ROUND, LongType())]))

    def round_log(self) -> RoundLog:
        """The round log of the validated lineage (read once per plan)."""
        if self._round_log is None:
            self._round_log = read_round_log(self.runner.ckpt_fio, self.runner.job_root, upto_epoch=self.prefix.epoch,
                                             upto_id=self.prefix.checkpoint_id)
        return self._round_log

