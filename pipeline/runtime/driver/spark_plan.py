"""The Spark plan of a round (Flink: the ExecutionGraph of the job, deployed once and fed per round).

:meth:`SparkPlan.steps` builds ``[(operator, its sinks, its consumers, DataFrame)]`` in topological order: source
reads -> stateless steps -> shuffles by key group -> operator tasks. :meth:`SparkPlan.process_round` runs it for
one round and returns the tasks' acknowledgements (their typed reports). This round's values (splits, parent state
handles, staging prefixes, TTL cutoff) reach the tasks in one of two ways:

* **classic session**: the plan is built once per shape and re-planned through the JVM each round; the values
  are Spark local properties of the driver thread (:mod:`pipeline.runtime.operators.round_params`);
* **Spark Connect** (no SparkContext, no local properties): the plan is built for every round with the values
  inside the task functions; the server analyses it anew (a few hundred ms per round).

:meth:`SparkPlan.process_epochs` runs one **tagged** round over several epochs: the splits of every epoch, each
tagged with its epoch, and per operator the values of every epoch in order (:mod:`pipeline.runtime.operators.round_params`;
Spark Connect: built for the round, the task functions carrying the values); the task reports come back with the
checkpoint they acknowledge (``TaskReport.checkpoint_id``).

After either, :attr:`SparkPlan.requests` holds the round's executor S3 requests (:mod:`pipeline.runtime.spark.task_requests`:
exact per task and epoch through an accumulator; Spark Connect: the tasks' approximate reports).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.barriers.events import CheckpointType
from pipeline.checkpoint.channel import Channel
from pipeline.checkpoint.report import ReportKind, TaskReport
from pipeline.faults import fault_point
from pipeline.fileio import join_uri
from pipeline.job import SourceNode
from pipeline.layout import (
    JobLayout,
    channel_prefix,
    checkpoint_dir_name,
    round_acks_prefix,
    round_state_prefix,
    round_unused_prefix,
    sink_staging_uri,
)
from pipeline.runtime.driver.context import RuntimeContext
from pipeline.runtime.driver.cursor import Cursor, files_by_channel
from pipeline.runtime.driver.lookup_pins import lookup_values

# the built-in operators register their builders (pipeline.runtime.operators.registry) when imported
from pipeline.runtime.operators.registry import traits_for
from pipeline.runtime.operators.report_codec import from_ipc
from pipeline.runtime.operators.round_params import (
    TAGGED_KEY,
    EmbeddedParams,
    RoundProperties,
    operator_key,
    operator_params,
    source_key,
)
from pipeline.runtime.operators.writer_nodes import SinkWriterNode, sink_writers
from pipeline.runtime.spark import operator_plans as _operator_plans  # noqa: F401
from pipeline.runtime.spark import over_plan as _over_plan  # noqa: F401
from pipeline.runtime.spark import timed_join_plan as _timed_join_plan  # noqa: F401
from pipeline.runtime.spark.dataflow import (
    OperatorIO,
    collect_handles,
    fresh_dataframe,
    operator_dataframe,
    split_dataframe,
    task_count,
)
from pipeline.runtime.spark.round_bytes import ReadBytes, ReadBytesCounter
from pipeline.runtime.spark.session import is_connect_session
from pipeline.runtime.spark.task_requests import RoundRequests, TaskRequestCounter
from pipeline.source.reader import META_FIELDS, make_split_reader
from pipeline.state.materialization import MaterializationPolicy
from pipeline.state.snapshot import SnapshotOptions

__all__ = ["SparkPlan", "EpochWork"]


@dataclass(frozen=True)
class EpochWork:
    """One epoch of a tagged round: its pending checkpoint, segments, own epochs and TTL low watermark."""

    pending: Any          # PendingCheckpoint
    epoch: int
    segments: dict        # {source: {partition: Segment}}
    own_epochs: Any       # InputEpochs
    low_epoch: int


class SparkPlan:
    """Builds (once per shape) and runs the Spark work of a round (see module docstring)."""

    def __init__(self, ctx: RuntimeContext) -> None:
        self.ctx = ctx
        self.plans: dict = {}   # round plans by shape (see steps)
        self._counters: dict[int, TaskRequestCounter | None] = {}  # by session (id): the plans' request counter
        self.requests = RoundRequests()  # the executors' S3 requests of the last round run (process_round/_epochs)
        self._read_counters: dict[int, ReadBytesCounter | None] = {}  # by session (id): rows/bytes the reads read
        self.read: ReadBytes | None = None  # what the last round's source reads read (None: not measured, Connect)

    def _counter(self) -> TaskRequestCounter | None:
        """The request counter of the session's plans (None: Spark Connect, no accumulators)."""
        spark = self.ctx.spark
        if id(spark) not in self._counters:
            self._counters[id(spark)] = TaskRequestCounter.for_session(spark)
        return self._counters[id(spark)]

    def _read_counter(self) -> ReadBytesCounter | None:
        """The session's counter of the rows and Arrow bytes the source reads read (None: Spark Connect)."""
        spark = self.ctx.spark
        if id(spark) not in self._read_counters:
            self._read_counters[id(spark)] = ReadBytesCounter.for_session(spark)
        return self._read_counters[id(spark)]

    def process_round(self, pending, rnd: int, P: int, cursor: Cursor, segments, epoch: int, *,
                      parked: frozenset[Channel] = frozenset(), staged: dict | None = None,
                      complete: bool = True, low_epoch: int | None = None,
                      own_epochs=None) -> list[TaskReport]:
        """The Spark work of one round; returns all task reports (the acks of every subtask).

        Operators feeding other operators are chained into the same Spark job (their output flows
        through Spark's shuffle; their acks are written as objects); the terminal operators run as one job.
        The plan comes from :meth:`steps` (built once per shape); this round's values (splits,
        parent state handles, staging prefixes, TTL cutoff) reach the tasks as local properties
        (:mod:`pipeline.runtime.operators.round_params`).
        Unaligned checkpoints: the join first replays ``cursor.inflight`` (channel state of the previous
        checkpoint); the rows of the ``parked`` channels (:class:`~pipeline.checkpoint.channel.Channel`) read this round are in
        flight at the join (the snapshot was taken before it consumed them): it writes them as channel state
        files (reports of kind CHANNEL) instead of processing them. ``staged``: sink output staged
        by earlier rounds of this checkpoint (an aggregate feeding an upsert sink merges it into its output).
        ``complete``: this round completes the checkpoint (a window's watermark advances and windows fire only
        then, :mod:`pipeline.runtime.operators.window`). ``low_epoch``: the low watermark ``L`` of the inputs, the TTL
        cutoff is ``end(L) - ttl`` (default: ``epoch``); ``own_epochs``
        (:class:`~pipeline.runtime.driver.input_epochs.InputEpochs`): the splits are cut at barriers and tagged with
        their records' own epoch.
        

        Over 8 parameters: the round's identity (pending, rnd, epoch), its inputs (cursor, segments) and the
        unaligned/tagged options, all keywords after the first."""
        ctx = self.ctx
        spark = ctx.spark
        fault_point("reading")
        splits = {node.name: [d for p, seg in segments[node.name].items()
                              for d in self._tagged(own_epochs, Channel(node.name, p), seg.splits)]
                  for node in ctx.job.sources()}
        values: dict[str, object] = {source_key(name): sp for name, sp in splits.items()}
        pins = lookup_values(ctx, [epoch])  # lookup joins: the epoch's pinned side-table versions
        values.update(pins)
        shape = tuple(sorted((name, task_count(len(sp), P)) for name, sp in splits.items()))
        spark.conf.set("spark.sql.shuffle.partitions", str(P))  # planned anew for every round's Dataset
        chained: list[tuple[str, str]] = []
        for op, sinks, consumers in self._topology():
            io = self._operator_io(op, sinks, consumers, pending, rnd, P, cursor, epoch, parked=parked, staged=staged,
                                   complete=complete, low_epoch=low_epoch)
            values[operator_key(op.uid)] = operator_params(io)
            if io.ack_prefix is not None:  # set exactly when the operator has consumers
                chained.append((op.uid, io.ack_prefix))
        rows: list[TaskReport] = []
        counter = self._counter()
        mark = counter.mark() if counter is not None else {}
        reads = self._read_counter()
        read_mark = reads.mark() if reads is not None else {}
        if is_connect_session(spark):  # the values inside the task functions: a plan of this round only
            # every round value by value (no local properties on Connect), as a tagged round does: the operators'
            # (the plan's task specs hold placeholders, as on a classic session), the sources' splits and the
            # lookup joins' pins
            with EmbeddedParams(values):
                steps = self._build(P, shape, parked, carried=values)
            rows = self._run(steps, fresh=None)
        else:
            with RoundProperties(spark, values):
                rows = self._run(self.steps(P, shape, parked), fresh=lambda df: fresh_dataframe(spark, df))
        rows = self._chained_acks(rows, chained)
        self.requests = counter.since(mark) if counter is not None else RoundRequests.reported(rows)
        self.read = reads.since(read_mark) if reads is not None else None
        return rows

    def _chained_acks(self, rows: list[TaskReport], chained: list[tuple[str, str]]) -> list[TaskReport]:
        """``rows`` plus the reports chained operators wrote as ack objects (the same codec, as Arrow IPC; read,
        then deleted), without the output of operators that have no sink (not sink output)."""
        ctx = self.ctx
        for _uid, prefix in chained:
            for f in ctx.ckpt_fio.list(prefix):
                rows.extend(from_ipc(ctx.ckpt_fio.read_bytes(f.uri)))
            ctx.ckpt_fio.delete_prefix(prefix)
        return [r for r in rows if not (r.kind is ReportKind.OUTPUT and r.name.startswith("exchange:"))]

    def _operator_io(self, op, sinks, consumers, pending, rnd: int, P: int, cursor: Cursor, epoch: int, *,
                     parked: frozenset, staged: dict | None, complete: bool, low_epoch: int | None) -> OperatorIO:
        """Operator ``op``'s values for round ``rnd`` of checkpoint ``pending`` (epoch ``epoch``).

        Over 8 parameters: :meth:`process_round`'s values for one operator, passed through."""
        ctx = self.ctx
        loc, cid = pending.location, pending.checkpoint_id
        ack_prefix = round_acks_prefix(loc, rnd, op.uid) if consumers else None
        ttl = None
        if hasattr(op, "ttl_seconds"):  # operators with state TTL: the epoch's cutoff (docs/operators.md)
            ttl_s = op.ttl_seconds if op.ttl_seconds is not None else ctx.config.state_ttl_seconds
            held = epoch if low_epoch is None else min(low_epoch, epoch)
            ttl = ctx.epochs.end_us(held) - ttl_s * 1_000_000 if ttl_s else None
        return OperatorIO(checkpoint=checkpoint_dir_name(cid), parallelism=P,
                          max_parallelism=ctx.max_parallelism, parent_handles=cursor.handles.get(op.uid, {}),
                          state_prefix=round_state_prefix(loc, rnd, op.uid),
                          output_prefix=(sink_staging_uri(join_uri(ctx.sink_root, sinks[0].table), cid)
                                         if sinks else round_unused_prefix(loc, rnd, op.uid)),
                          output_name=sinks[0].table if sinks else f"exchange:{op.uid}",
                          file_tag=f"r{rnd}", ttl_cutoff_us=ttl, ack_prefix=ack_prefix,
                          replay_handles=files_by_channel(cursor.inflight.get(op.uid, ())),
                          channel_prefix=(channel_prefix(loc, op.uid, rnd)
                                          if parked and traits_for(op).parks_channels else None),
                          prior_output=tuple((r.subtask, r.file) for r in (staged or {}).get(sinks[0].table, ())
                                             if r.file is not None)
                          if sinks and sinks[0].mode == "upsert" and traits_for(op).merges_upserts
                          else (),
                          epoch=epoch, barrier_us=ctx.epochs.end_us(epoch), complete=complete,
                          replayed=cursor.epoch is not None and cursor.epoch >= epoch,
                          snapshot=self.snapshot_options(pending, rnd, op.uid, cursor).to_params())

    def process_epochs(self, work: Sequence[EpochWork], P: int, cursor: Cursor) -> list[TaskReport]:
        """One tagged Spark round over the epochs of ``work`` (ascending, consecutive checkpoints): every epoch
        is round 0 of its own checkpoint. ``cursor``: where the first epoch starts (its parent's state handles,
        NO_CLAIM materialisation); later epochs continue from the state the tasks wrote for the epoch before.
        Returns the reports of every checkpoint, each with its ``checkpoint_id``."""
        ctx = self.ctx
        spark = ctx.spark
        fault_point("reading")
        splits: dict[str, list[dict]] = {node.name: [] for node in ctx.job.sources()}
        for w in work:
            for node in ctx.job.sources():
                splits[node.name] += [{**d, "tag": w.epoch} for p, seg in w.segments[node.name].items()
                                      for d in self._tagged(w.own_epochs, Channel(node.name, p), seg.splits)]
        values: dict[str, object] = {source_key(name): sp for name, sp in splits.items()}
        values.update(lookup_values(ctx, [w.epoch for w in work]))  # lookup joins: each epoch's pinned version
        shape = tuple(sorted((name, task_count(len(sp), P)) for name, sp in splits.items()))
        spark.conf.set("spark.sql.shuffle.partitions", str(P))
        later = Cursor()  # epochs after the first: parent state from the tasks, snapshots incremental
        chained: list[tuple[str, str]] = []
        for op, sinks, consumers in self._topology():
            entries = []
            for i, w in enumerate(work):
                io = self._operator_io(op, sinks, consumers, w.pending, 0, P, cursor if i == 0 else later, w.epoch,
                                       parked=frozenset(), staged=None, complete=True, low_epoch=w.low_epoch)
                entries.append({"checkpoint_id": w.pending.checkpoint_id, "epoch": w.epoch,
                                "params": operator_params(io)})
                if i == 0 and io.ack_prefix is not None:  # the tasks acknowledge every epoch in the first's
                    chained.append((op.uid, io.ack_prefix))
            values[operator_key(op.uid)] = {TAGGED_KEY: entries}
        counter = self._counter()
        mark = counter.mark() if counter is not None else {}
        reads = self._read_counter()
        read_mark = reads.mark() if reads is not None else {}
        if is_connect_session(spark):  # no local properties: the task functions carry the values (round_params)
            with EmbeddedParams(values):
                steps = self._build(P, shape, frozenset(), carried=values, tagged=True)
            rows = self._run(steps, fresh=None)
        else:
            with RoundProperties(spark, values):
                rows = self._run(self.steps(P, shape, frozenset(), tagged=True),
                                 fresh=lambda df: fresh_dataframe(spark, df))
        rows = self._chained_acks(rows, chained)
        self.requests = counter.since(mark) if counter is not None else RoundRequests.reported(rows)
        self.read = reads.since(read_mark) if reads is not None else None
        return rows

    @staticmethod
    def _tagged(own_epochs, ch: Channel, splits) -> list[dict]:
        dicts = [sp.as_dict() for sp in splits]
        return own_epochs.tag_splits(ch, dicts) if own_epochs is not None else dicts

    def row_epochs(self) -> bool:
        """Whether records carry their own epoch (a join or a deduplication consumes them)."""
        return any(traits_for(o).row_epochs for o in self.ctx.job.operators())

    @staticmethod
    def _run(steps: list[tuple], fresh) -> list[TaskReport]:
        """Execute a round's plan. An operator with several consumers is computed once for all of them
        (persisted; the first job computes it, the next read it). Without such an operator the terminal
        operators' reports (one schema) are unioned and collected as ONE Spark job, so their stages share one
        job's scheduling and run side by side on the cores; with one, each terminal operator stays its own job,
        one after the other, because two branches of one job could compute a persisted partition at once on
        two executors (its block lock is per executor), running the operator's side effects twice concurrently.
        ``fresh(df)``: a DataFrame to execute anew (re-used plans) or None (a plan of this round only)."""
        persisted, terminal = [], []
        for _op, _sinks, consumers, df in steps:
            df = fresh(df) if fresh is not None else df
            if consumers:
                if len(consumers) > 1:  # computed once for all its consumers (this round's data)
                    persisted.append(df.persist())
            else:
                terminal.append(df)
        rows: list[TaskReport] = []
        if terminal and not persisted:
            job = terminal[0]
            for df in terminal[1:]:
                job = job.union(df)
            rows = collect_handles(job)
        else:
            for df in terminal:
                rows.extend(collect_handles(df))
        for df in persisted:
            df.unpersist()
        return rows

    def _ttl_us(self, op) -> int | None:
        """The operator's state TTL in µs (None: no TTL), if it has one."""
        if not hasattr(op, "ttl_seconds"):
            return None
        s = op.ttl_seconds if op.ttl_seconds is not None else self.ctx.config.state_ttl_seconds
        return s * 1_000_000 if s else None

    def _topology(self) -> list[tuple]:
        """``[(operator or sink writer, its sinks, its consumers)]`` in topological order: each operator with the
        sink its own tasks write (:meth:`pipeline.job.Job.operator_sink`), each sink writer
        (:mod:`pipeline.runtime.operators.sink_writer`) after the nodes it reads."""
        ctx = self.ctx
        job = ctx.job
        order: list[tuple[int, int, Any]] = [(job.node_id(op), 0, op) for op in job.operators()]
        order += [(w.parent, 1, w) for w in sink_writers(job)]   # after its parent (node order is topological)
        out: list[tuple] = []
        for _nid, _w, op in sorted(order, key=lambda t: (t[0], t[1])):
            if isinstance(op, SinkWriterNode):
                out.append((op, [op.sink], []))
                continue
            nid = job.node_id(op)
            own = job.operator_sink(nid)
            out.append((op, [own] if own is not None else [], ctx.consumers(nid)))
        return out

    def snapshot_options(self, pending, rnd: int, uid: str, cursor: Cursor) -> SnapshotOptions:
        """How operator ``uid`` snapshots its state this round (docs/state.md): checkpoints write into the job's
        ``shared/`` area, incrementally; savepoints write bases into their own directory (self-contained); the
        first checkpoint after a restore writes bases (NO_CLAIM: it never references the files it came from)."""
        cfg = self.ctx.config
        savepoint = pending.kind == CheckpointType.SAVEPOINT
        return SnapshotOptions(
            checkpoint_id=pending.checkpoint_id, round=rnd,
            shared=None if savepoint else JobLayout(self.ctx.job_root).shared(uid),
            materialize=savepoint or cursor.materialize,
            policy=MaterializationPolicy(cfg.state_incremental, cfg.state_max_deltas, cfg.state_max_delta_ratio),
            backend=cfg.state_backend, job_root=self.ctx.job_root)

    def steps(self, P: int, shape: tuple, parked: frozenset, *, tagged: bool = False) -> list[tuple]:
        """The round's Spark plan, built once per (parallelism, source task counts, parked channels, tagged)
        and session: ``[(operator, its sinks, its consumers, DataFrame)]`` in topological order. The task
        functions read their per-round values from local properties, so nothing round-specific is in it."""
        key = (id(self.ctx.spark), P, shape, parked) + ((True,) if tagged else ())
        if key not in self.plans:
            self.plans[key] = self._build(P, shape, parked, tagged=tagged)
        return self.plans[key]

    def _build(self, P: int, shape: tuple, parked: frozenset, *, carried: dict | None = None,
               tagged: bool = False) -> list[tuple]:
        """Build the plan (its task specs hold placeholders: the tasks take this round's values from local
        properties, or on Spark Connect from the values embedded while it is built, :class:`EmbeddedParams`).
        ``carried`` (Spark Connect): this round's source splits, put into the read tasks. ``tagged``: a round of
        several epochs (records carry their epoch, :mod:`pipeline.runtime.operators.round_params`)."""
        ctx = self.ctx
        spark = ctx.spark
        tasks = dict(shape)
        inputs: dict[int, Any] = {}
        for i, node in enumerate(ctx.job.nodes):
            if isinstance(node, SourceNode):
                key_cols = [node.key] if node.key else []
                cfg = ctx.config
                jobname, dlq = ctx.job.name, ctx.dead_letter_root

                def factory(src, kc=key_cols, cfg=cfg, dlq=dlq, jobname=jobname):
                    return make_split_reader(src.schema, kc, cfg.bad_records, dlq, jobname)
                park = sorted(ch.partition for ch in parked if ch.source == node.name)
                read = ctx.job.columns_read(i)
                meta = None if read is None else [f.name for f in META_FIELDS
                                                  if f.name.lower() in read or (park and f.name == "_partition")]
                inputs[i] = split_dataframe(spark, tasks[node.name], node, factory, source_key(node.name), meta=meta,
                                            carried=carried, row_epochs=self.row_epochs(), tagged=tagged,
                                            requests=self._counter(), read_bytes=self._read_counter())
                if park:
                    from pyspark.sql import functions as F  # pyspark: imported where Spark already runs
                    inputs[i] = inputs[i].withColumn("_park", F.col("_partition").isin(park))
        steps = []
        for op, sinks, consumers in self._topology():
            # placeholders: the tasks take this round's values from the local property of the operator
            io = OperatorIO(checkpoint=checkpoint_dir_name("?"), parallelism=P, max_parallelism=ctx.max_parallelism,
                            parent_handles={}, state_prefix="", output_prefix="", output_name="", file_tag="",
                            ttl_cutoff_us=None, ack_prefix="" if consumers else None,
                            bad_records=ctx.config.bad_records, dead_letter_root=ctx.dead_letter_root,
                            ttl_us=self._ttl_us(op), epoch_us=ctx.config.epoch_seconds * 1_000_000, tagged=tagged,
                            requests=self._counter())
            df, _schema = operator_dataframe(spark, ctx.job, op, inputs, io)
            for s in sinks:  # open table formats: create the table, or refuse an incompatible schema change
                getattr(ctx.table(s.table), "prepare", lambda _schema: None)(_schema)
            if consumers:
                inputs[ctx.job.node_id(op)] = df
            steps.append((op, sinks, consumers, df))
        return steps
