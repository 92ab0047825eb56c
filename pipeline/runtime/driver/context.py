"""RuntimeContext: what every part of a running job shares (Flink: the JobMaster's view of one job).

The job graph, the configuration, the clocks, the storage ports of the three roots, the checkpoint
coordinator and the (lazily started) Spark session. The modules of the runtime - the cursor
(:mod:`pipeline.runtime.driver.cursor`), the barrier log (:mod:`pipeline.runtime.driver.barrier_log`), epoch planning
(:mod:`pipeline.runtime.driver.epoch_planner`), the round executor (:mod:`pipeline.runtime.driver.round_executor`), the
Spark plan of a round (:mod:`pipeline.runtime.driver.spark_plan`) and checkpoint finalisation
(:mod:`pipeline.runtime.driver.finalize`) - each take this context; :class:`~pipeline.runtime.driver.runner.JobRunner`
builds it once and is a thin facade over them.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pipeline.barriers.events import CheckpointingMode
from pipeline.checkpoint.coordinator import CheckpointCoordinator
from pipeline.clock import Clock, clock_from_iso
from pipeline.config import PipelineConfig
from pipeline.epochs import EpochClock
from pipeline.exceptions import (
    ConditionalWriteError,
    ConfigError,
    CorruptCheckpointError,
    EpochalError,
    ObjectNotFoundError,
)
from pipeline.fileio import file_io_for, join_uri
from pipeline.job import Job, SinkNode, SourceNode, StatefulNode
from pipeline.layout import JobLayout
from pipeline.master import connect_url, probe_connect, probe_executor_storage
from pipeline.runtime.driver.lookup_pins import check_lookup_joins
from pipeline.runtime.operators.dead_letters import DeadLetterFiles, superseding_checkpoints, sweep_dead_letters
from pipeline.runtime.operators.registry import traits_for
from pipeline.runtime.operators.writer_nodes import sink_writers

# the built-in operators register their builders and traits (pipeline.runtime.operators.registry) when imported
from pipeline.runtime.spark import operator_plans as _operator_plans  # noqa: F401
from pipeline.runtime.spark import over_plan as _over_plan  # noqa: F401
from pipeline.runtime.spark import timed_join_plan as _timed_join_plan  # noqa: F401
from pipeline.runtime.spark.session import get_spark, is_connect_session, ship_job_code, start_python_workers
from pipeline.sink.formats import open_sink_table, sink_requests_counting
from pipeline.sink.table import CommittedTable
from pipeline.sink.table_format import resolve_format
from pipeline.sink.two_phase import TwoPhaseCommitSink

__all__ = ["RuntimeContext"]

log = logging.getLogger("epochal")


class RuntimeContext:
    """Shared state of one running job (see module docstring)."""

    def __init__(self, job: Job, config: PipelineConfig, *, clock: Clock | None = None,
                 runner_id: str | None = None, echo: Callable[[str], None] | None = None) -> None:
        self.job = job
        self.config = config
        self.clock = clock or clock_from_iso(config.clock_now)
        self.epochs = EpochClock(config.epoch_seconds)
        self.echo: Callable[[str], None] = echo or (lambda msg: log.info(msg))
        self.ckpt_fio = file_io_for(config.checkpoint_uri)
        self.src_fio = file_io_for(config.source_uri)
        self.sink_fio = file_io_for(config.sink_uri)
        self.job_root = join_uri(config.checkpoint_uri, job.name)
        self.sink_root = join_uri(config.sink_uri, job.name)
        self.dead_letter_root = config.dead_letter_root
        self.coordinator = CheckpointCoordinator(
            self.ckpt_fio, config.checkpoint_uri, job.name,
            checkpoint_timeout_s=config.checkpoint_timeout_seconds,
            tolerable_failed_checkpoints=config.tolerable_failed_checkpoints,
            retained_checkpoints=config.retained_checkpoints, runner_id=runner_id)
        self.coordinator.discard_listeners.append(self.sweep_superseded_dead_letters)
        self.validate_job()
        url = connect_url(config.spark_master)
        if url is not None:  # a Spark Connect server that does not answer: refused before anything is written
            probe_connect(url)
        self.max_parallelism = self._ensure_job_json()
        self.spark_session: Any = None
        self._tables: dict[str, CommittedTable] = {}   # table(): one object per sink table
        self._spark_opening: _SessionOpening | None = None  # start_spark(): a Connect session opened in a thread
        self.spark_start_s = 0.0  # time spent starting / connecting to Spark (in the background, if started so)
        # source contract (pipeline.source.contract): the latest listing, and dead letters of this run that
        # the next checkpoint's stats must count
        self.source_listing: dict = {}
        self.source_inventory_behind: dict = {}  # inventory entries behind an incremental listing (epoch_planner)
        self.contract_dead_letters: dict[str, int] = {}
        self.unexpected_dead_letters: dict[str, int] | None = None
        # round clock: the configured clock when the runner starts, advancing with the elapsed time (a
        # fixed PIPELINE_CLOCK_NOW still lets alignment timeouts be measured across rounds)
        self._clock_base_s = self.clock.now_us() / 1e6
        self._mono_base_s = time.monotonic()

    # ------------------------------------------------------------------------------------------ setup
    def aligning_operators(self) -> list[StatefulNode]:
        """The operators whose inputs a checkpoint aligns (an unaligned one parks their in-flight rows as channel
        state): the trait ``parks_channels`` (the join)."""
        return [o for o in self.job.operators() if traits_for(o).parks_channels]

    def validate_job(self) -> None:
        if not self.job.sinks() and not self.job.operators():
            raise ConfigError(f"job {self.job.name!r} has neither a sink nor a stateful operator: it computes nothing "
                              "that could be seen")
        check_lookup_joins(self.job, self.config)   # side tables open; aligned exactly-once (lookup_pins)
        for op in self.job.operators():   # what each operator's runtime refuses (OperatorTraits.check)
            check = traits_for(op).check
            if check is not None:
                check(self.job, op, self.config)
        joins = self.aligning_operators()
        if self.config.checkpoint_mode == CheckpointingMode.AT_LEAST_ONCE or self.config.unaligned:
            what = ("PIPELINE_UNALIGNED=true" if self.config.unaligned
                    else f"PIPELINE_CHECKPOINT_MODE={self.config.checkpoint_mode}")
            if len(joins) > 1:
                raise ConfigError(f"job {self.job.name!r}: {what} is supported for jobs with one multi-input operator "
                                  f"(has joins {[j.uid for j in joins]}); use aligned exactly-once checkpoints")
        if self.config.unaligned and joins:
            join = joins[0]
            for side in join.inputs:
                base = self.job.chain_to(side)[0]
                if not isinstance(self.job.nodes[base], SourceNode):
                    raise ConfigError(f"job {self.job.name!r}: unaligned checkpoints need the inputs of join "
                                      f"{join.uid!r} to be sources (through select/filter)")
            for src in self.job.sources():
                users = [o.uid for o in self.consumers(self.job.node_id(src))]
                if users != [join.uid]:
                    raise ConfigError(f"job {self.job.name!r}: with unaligned checkpoints every source must feed "
                                      f"only the join {join.uid!r}; source {src.name!r} feeds {users}")

    def _ensure_job_json(self) -> int:
        uri = JobLayout(self.job_root).job_json()
        doc = {"job": self.job.name, "max_parallelism": self.job.max_parallelism,
               "operators": self.job.operator_uids(), "sources": self.job.source_names(),
               "sinks": self.job.sink_tables(), "created": self.epochs.iso(self.clock.now_us())}
        try:
            self.ckpt_fio.write_bytes(uri, (json.dumps(doc, indent=1) + "\n").encode(), if_none_match=True)
            return self.job.max_parallelism
        except ConditionalWriteError:
            existing = json.loads(self.ckpt_fio.read_bytes(uri))
            if existing.get("job") != self.job.name:
                raise ConfigError(f"{uri} belongs to job {existing.get('job')!r}, not {self.job.name!r}") from None
            return int(existing["max_parallelism"])  # fixed when the job was first created

    @property
    def spark(self):
        if self.spark_session is None:
            opening, self._spark_opening = self._spark_opening, None
            self.spark_session = opening.result() if opening is not None else self._open_spark()
        return self.spark_session

    def _open_spark(self):
        t0 = time.monotonic()
        spark = get_spark(self.config.spark_master, self.config.parallelism)
        if is_connect_session(spark):
            ship_job_code(self.job)
            # the server's executors use their own S3 settings: unusable ones fail here, before the first write
            probe_executor_storage(spark, self.job_root, self.config.spark_master)
        else:  # a local executor's Python workers start while the driver restores and plans the first round
            start_python_workers(spark)
        self.spark_start_s = time.monotonic() - t0
        return spark

    def start_spark(self) -> None:
        """Start Spark before the first side effect. A Spark Connect session is opened in a background thread,
        so that the restore's S3 reads overlap it (the server answered the probe when this context was built);
        :meth:`await_spark` / :meth:`require_spark`, called before the first write, wait for it and raise its
        error. A classic master (a driver JVM in this process) starts here, synchronously."""
        if not self.open_spark_in_background():
            self.require_spark()

    def open_spark_in_background(self) -> bool:
        """Spark Connect: begin opening the session in a background thread (see :meth:`start_spark`); False
        (nothing started) for a classic master."""
        if self.spark_session is not None or self._spark_opening is not None:
            return True
        if connect_url(self.config.spark_master) is None:
            return False
        self._spark_opening = _SessionOpening(self._open_spark)
        return True

    def await_spark(self) -> None:
        """Wait for a session :meth:`start_spark` is opening, if any (its error is raised here)."""
        if self._spark_opening is not None:
            self.require_spark()

    def require_spark(self) -> None:
        """Start (or connect to) Spark now: commands that need it call this before their first side effect, so
        an unusable master (a Spark Connect server that does not answer) fails before anything is claimed or
        written. Waits for a session :meth:`start_spark` is opening."""
        _ = self.spark

    def round_now(self) -> float:
        """The round clock in seconds (recorded in every round plan; alignment times are measured with it)."""
        return self._clock_base_s + (time.monotonic() - self._mono_base_s)

    # ------------------------------------------------------------------------------------ job graph
    def consumers(self, nid: int) -> list:
        """Stateful operators and sink writers (:mod:`pipeline.runtime.operators.sink_writer`) that read the output of node
        ``nid`` (through stateless steps: maps and unions)."""
        return [op for op in [*self.job.operators(), *sink_writers(self.job)]
                if any(nid in self.job.bases(i) for i in op.inputs)]

    # ---------------------------------------------------------------------------------------- sinks
    def table(self, table: str) -> CommittedTable:
        """The sink table in its format (Iceberg / Delta / Epochal's commit log; ``pipeline.sink.formats``), one
        object per table for the runner's life: a Delta table keeps its loaded log and reads only the commits after
        it (``update_incremental``), where a new object per epoch listed and replayed the whole ``_delta_log``
        (a warm process's epochs, ``run --follow``)."""
        if table not in self.job.sink_tables():
            raise ConfigError(f"job {self.job.name!r} has no sink table {table!r} (has {self.job.sink_tables()})")
        cached = self._tables.get(table)
        if cached is not None:
            return cached
        s = next(s for s in self.job.sinks() if s.table == table)
        opened = open_sink_table(self.sink_fio, self.config, self.job.name, table, mode=s.mode, key=s.key,
                                 partition_by=s.partition_by,
                                 fmt=resolve_format(table, s.format, self.config.sink_format))
        self._tables[table] = opened
        return opened

    def sink_requests_counting(self) -> dict[str, str]:
        """Per sink table: whether its S3 requests are counted (``CheckpointStats.sink_s3_requests_counting``)."""
        return {s.table: sink_requests_counting(resolve_format(s.table, s.format, self.config.sink_format),
                                                self.config) for s in self.job.sinks()}

    def sink(self, sink: SinkNode) -> TwoPhaseCommitSink:
        return TwoPhaseCommitSink(self.table(sink.table), mode=sink.mode, key=list(sink.key))

    def recover_sinks(self, md, *, restoring: bool = True) -> None:
        """recoverAndCommit: (re-)commit the sink transactions of a completed checkpoint (idempotent)."""
        for sink in self.job.sinks():
            if sink.table in md.sinks:
                self.sink(sink).recover_and_commit(md, restoring=restoring)

    def sweep_dead_letters(self, md) -> None:
        """Leave each operator dead letter of completed checkpoint ``md``'s epoch exactly once: delete what ``md``
        does not count and no other completed checkpoint owns (:mod:`pipeline.runtime.operators.dead_letters`; run after
        the sink commit and on every restore, so a kill in the middle is finished by the next start)."""
        kept = DeadLetterFiles.from_extra(md.extra or {}, md.epoch)
        if not kept.files or not self.dead_letter_root:
            return
        store = self.coordinator.store

        def completed(cid: int) -> bool:
            try:
                store.get(cid)
                return True
            except ObjectNotFoundError:
                return False
            except CorruptCheckpointError:
                return True  # not ours to judge: keep its files

        try:
            res = sweep_dead_letters(file_io_for(self.dead_letter_root), self.dead_letter_root, self.job.name,
                                     md.checkpoint_id, kept, completed)
        except EpochalError as e:  # the sweep must never fail a run (the next completion or restore redoes it)
            self.echo(f"WARNING: dead letters of checkpoint {md.checkpoint_id} (epoch {md.epoch}): sweep failed: {e}")
            return
        if res.deleted_attempts or res.deleted_files:
            self.echo(f"dead letters of epoch {kept.epoch}: removed {res.deleted_attempts} directory(ies) of "
                      f"checkpoint attempts that never completed and {res.deleted_files} file(s) of failed task "
                      f"attempts (checkpoint {md.checkpoint_id} counts its own)")

    def sweep_superseded_dead_letters(self, discarded, retained) -> None:
        """Retention discarded checkpoints: a discarded checkpoint of a rewound branch whose epoch a newer retained
        checkpoint completed again with dead letters of its own leaves its dead letters behind (the sweep kept
        them while it was a completed checkpoint). Sweep that epoch again for the newer checkpoint, so a reader
        sees the epoch's dead records once. Main-line checkpoints (no newer checkpoint of their epoch) keep theirs."""
        for z in superseding_checkpoints(discarded, retained):
            self.sweep_dead_letters(z.metadata)

    def cleanup_sink_garbage(self, after: int | None = None, *, full: bool | None = None) -> None:
        """Delete staged sink output of aborted/crashed checkpoints. Spares completed checkpoints (their
        commit may still be recovered) and the newest claimed id (a runner may still be working on it).

        ``after`` (the restored checkpoint id): only the staging of ids claimed after it, or after the oldest
        retained checkpoint's parent if that is lower (the ids of a run killed before its own sweep), is looked
        at (:meth:`~pipeline.sink.table.CommittedTable.recent_garbage`, O(ids since), not O(all commits ever)).
        ``full`` (default: when ``after`` is None) sweeps every ``data/txn-*`` dir of the table."""
        full = after is None if full is None else full
        protect: set[int] = set(self.coordinator.store.ids())
        newest = self.coordinator.counter.latest_claimed()
        if after is not None and protect:
            # ids claimed by a run killed before its end-of-run sweep lie in the gaps of the retained lineage
            # (restored 4, the killed run's round claimed 5..7, a later run's checkpoints 8, 9 have parents 4, 8):
            # sweep from the oldest retained checkpoint's parent, not only after the restored one
            # (the oldest retained checkpoint has no parent: the lineage started from nothing, so every id below it
            # was a run killed before its first checkpoint completed)
            parent = self.coordinator.store.get(min(protect)).metadata.parent_id
            after = min(after, -1 if parent is None else parent)
        for sink in self.job.sinks():
            try:
                n = self.table(sink.table).cleanup(protect=protect, protect_from_id=newest, after=after, full=full)
                if n:
                    self.echo(f"sink {sink.table}: removed {n} uncommitted staging dir(s) of aborted checkpoints")
            except EpochalError as e:  # cleanup must never fail a run
                self.echo(f"WARNING: sink {sink.table}: cleanup failed: {e}")


class _SessionOpening:
    """A Spark session being opened in a daemon thread (a task process that never needs it exits anyway)."""

    def __init__(self, open_session: Callable[[], Any]) -> None:
        self._open = open_session
        self._session: Any = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="epochal-spark-connect", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._session = self._open()
        except BaseException as e:  # noqa: BLE001 - handed to the thread that needs the session
            self._error = e

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._session
