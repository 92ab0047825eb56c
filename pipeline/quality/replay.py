"""Determinism under replay: restore checkpoint n-1 in a scratch location, re-run exactly epoch n, compare.

A ``process`` operator runs a user function whose meaning only the user's code defines, so the batch plan
cannot model it (docs/batch.md). What Epochal can prove for it is invariant 5: replaying epoch *n* from
checkpoint *n-1* with the barriers checkpoint *n* recorded gives the same state and the same staged output.
A function that reads a module-level counter, the wall clock or an unseeded random generator breaks
exactly-once (a re-run after a crash would commit other rows than the first attempt staged), and this
check catches it.

How (:func:`replay_checkpoint`):

1. checkpoint *n* must be an aligned exactly-once checkpoint whose parent *n-1* is retained, is of the same
   lineage (epoch *n - 1*, its barriers are *n*'s restore positions) and is not a savepoint round;
2. a scratch checkpoint root and sink root are made under the same storage scheme (a temporary directory
   for ``file://``, ``<root>/_replay/<token>/`` for ``s3://``); the job's ``job.json`` is copied there and
   barrier *n* is written to the scratch barrier log from checkpoint *n*'s ``_metadata``. The job's own
   checkpoints, barrier log, shared state files, sinks and dead letters are only read;
3. checkpoint *n-1* is restored there (NO_CLAIM: the replay writes fresh bases, never a delta on the job's
   files) and epoch *n* runs with *n*'s parallelism; sinks are staged and committed in Epochal's own format
   (the staged Parquet is the same for every format; no catalog is touched);
4. every state table of every operator is read through the runtime's own reader
   (:func:`pipeline.state.backend.load_chain`: chains, checksums) and compared with checkpoint *n*'s as a
   row multiset (:func:`pipeline.state.changelog.diff`), and so is the output each sink staged for epoch *n*;
5. the scratch roots are deleted.
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.barriers.events import AlignmentLabel, CheckpointingMode
from pipeline.exceptions import CorruptCheckpointError, EpochalError
from pipeline.fileio import file_io_for, join_uri
from pipeline.job import ProcessNode
from pipeline.layout import JobLayout, checkpoint_dir_name, replay_root
from pipeline.layout.dead_letters import DEFAULT_DEAD_LETTER_DIR
from pipeline.runtime.driver.cursor import cursor_from_metadata
from pipeline.runtime.driver.runner import JobRunner
from pipeline.state.backend import load_chain
from pipeline.state.chain import StateChain
from pipeline.state.changelog import OP_COLUMN, can_diff, diff

__all__ = ["ObjectReplay", "ReplayResult", "replay_checkpoint", "process_objects", "EXAMPLES"]

log = logging.getLogger("epochal.quality")

EXAMPLES = 5  # example rows per side of a difference


@dataclass(frozen=True, slots=True)
class ObjectReplay:
    """One state table (``state/<uid>/<name>``) or sink (``sink/<table>``) compared after the replay."""

    obj: str
    rows_checkpoint: int
    rows_replayed: int
    only_checkpoint: int = 0                            # rows of checkpoint n the replay did not produce
    only_replayed: int = 0                              # rows the replay produced that checkpoint n lacks
    examples_checkpoint: tuple[Mapping[str, Any], ...] = ()
    examples_replayed: tuple[Mapping[str, Any], ...] = ()

    @property
    def equal(self) -> bool:
        return self.only_checkpoint == 0 and self.only_replayed == 0

    def describe(self, checkpoint: str) -> str:
        if self.equal:
            return f"{self.obj}: {self.rows_checkpoint} rows, replay identical"
        return (f"{self.obj} of {checkpoint} differs after replaying the epoch: {self.only_checkpoint} of its "
                f"{self.rows_checkpoint} rows not reproduced, {self.only_replayed} of {self.rows_replayed} replayed "
                f"rows not in the checkpoint; e.g. checkpoint {list(self.examples_checkpoint)[:2]} vs replay "
                f"{list(self.examples_replayed)[:2]}")


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """The outcome of replaying checkpoint ``checkpoint`` (epoch ``epoch``) from its parent."""

    job: str
    checkpoint: str                                     # chk-<n>
    epoch: int
    parent_id: int | None
    objects: tuple[ObjectReplay, ...] = ()
    not_checked: Mapping[str, str] = field(default_factory=dict)   # obj -> why (the whole replay, or one object)
    duration_s: float = 0.0
    scratch: str = ""

    @property
    def ran(self) -> bool:
        return bool(self.objects)

    @property
    def success(self) -> bool:
        return all(o.equal for o in self.objects)

    def messages(self) -> list[str]:
        head = (f"determinism under replay of {self.checkpoint} (epoch {self.epoch}, replayed from "
                f"{checkpoint_dir_name(str(self.parent_id))} in {self.duration_s:.1f} s): ")
        out = [head + o.describe(self.checkpoint) for o in self.objects if not o.equal]
        if self.ran and self.success:
            out.append(head + f"{len(self.objects)} objects identical")
        out += [f"NOT CHECKED by replay: {o}: {why}" for o, why in sorted(self.not_checked.items())]
        return out


def process_objects(job) -> set[str]:
    """Objects of ``job`` the batch plan cannot model because of a ``process`` node: the process operators'
    state, every operator downstream of one and the sinks they feed (``state/<uid>``, ``sink/<table>``)."""
    tainted: set[int] = set()
    for op in job.operators():
        nid = job.node_id(op)
        if isinstance(op, ProcessNode) or any(job.chain_to(i)[0] in tainted for i in op.inputs):
            tainted.add(nid)
    out = {f"state/{job.nodes[n].uid}" for n in tainted}
    out |= {f"sink/{s.table}" for s in job.sinks() if s.parent in tainted}
    return out


def _refusal(runner, cp) -> str | None:
    """Why checkpoint ``cp`` cannot be replayed (None: it can)."""
    md = cp.metadata
    if md.is_savepoint:
        return f"{cp.describe()} is a savepoint (it re-snapshots its parent's epoch; nothing is replayed)"
    if md.alignment != AlignmentLabel.ALIGNED or md.checkpoint_mode != CheckpointingMode.EXACTLY_ONCE:
        return (f"checkpoint {md.checkpoint_id} is {md.checkpoint_mode}/{md.alignment}: what it holds depends on "
                "timing; only aligned exactly-once checkpoints are replayed")
    if md.parent_id is None:
        return f"checkpoint {md.checkpoint_id} has no parent (the job's first epoch, or a bootstrap)"
    return None


def _parent(runner, cp):
    """The retained parent of ``cp`` in the same lineage, or the reason there is none."""
    md = cp.metadata
    try:
        parent = runner.coordinator.store.get(md.parent_id)
    except EpochalError as e:
        return None, f"parent checkpoint {md.parent_id} of checkpoint {md.checkpoint_id} is not retained ({e})"
    pmd = parent.metadata
    if pmd.epoch != md.epoch - 1:
        return None, (f"parent checkpoint {pmd.checkpoint_id} is at epoch {pmd.epoch}, not {md.epoch - 1} (checkpoint "
                      f"{md.checkpoint_id} is a restore point, not a processed epoch)")
    behind = [f"{s}/partition={p}" for s, parts in pmd.positions.items() for p, pos in parts.items()
              if (b := md.barriers.get(s, {}).get(p)) is None or (pos.seq, pos.row) > (b.seq, b.row)]
    if behind:
        return None, (f"parent checkpoint {pmd.checkpoint_id} is of another lineage: its positions of {behind} are "
                      f"not before checkpoint {md.checkpoint_id}'s barriers")
    return parent, None


def _scratch_root(uri: str, token: str) -> tuple[str, Path | None]:
    if uri.startswith("file://"):
        d = Path(tempfile.mkdtemp(prefix=f"epochal-replay-{token}-"))
        return d.as_uri(), d
    return replay_root(uri, token), None


def _read_parquet(fileio, fh, what: str) -> pa.Table:
    import hashlib

    import pyarrow.parquet as pq

    data = fileio.read_bytes(fh.uri)
    if len(data) != fh.bytes or hashlib.sha256(data).hexdigest() != fh.sha256:
        raise CorruptCheckpointError(f"{what}: file {fh.uri} checksum/size mismatch")
    return pq.read_table(io.BytesIO(data))


def _state_tables(fileio, md) -> dict[str, pa.Table]:
    """``state/<uid>/<name>`` -> every row of that state in checkpoint ``md`` (the runtime's chain reader)."""
    parts: dict[str, list[pa.Table]] = {}
    for uid, handles in md.operators.items():
        for h in handles:
            key = f"state/{uid}/{h.name}"
            parts.setdefault(key, [])
            if h.file is None:
                continue
            chain = StateChain(h.file, tuple(h.deltas), h.rows)
            parts[key].append(load_chain(fileio, chain, md.name, warm=False))
    return {k: _concat(v) for k, v in parts.items()}


def _sink_tables(fileio, md) -> dict[str, pa.Table]:
    return {f"sink/{t}": _concat([_read_parquet(fileio, fh, f"{md.name} sink {t}") for fh in sh.files])
            for t, sh in md.sinks.items()}


def _concat(tables: list[pa.Table]) -> pa.Table:
    tables = [t for t in tables if t.num_rows or t.num_columns]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="permissive")


def _examples(t: pa.Table) -> tuple[dict, ...]:
    t = t.drop_columns([c for c in (OP_COLUMN,) if c in t.column_names])
    return tuple({k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in r.items()}
                 for r in t.slice(0, EXAMPLES).to_pylist())


def compare_tables(obj: str, original: pa.Table, replayed: pa.Table) -> ObjectReplay:
    """Row-multiset comparison of one object (the changelog diff: rows of ``original`` only are -1)."""
    import pyarrow.compute as pc

    if original.num_rows == 0 and replayed.num_rows == 0:
        return ObjectReplay(obj, 0, 0)
    if original.num_columns == 0 or replayed.num_columns == 0 or original.schema != replayed.schema:
        if sorted(original.column_names) == sorted(replayed.column_names) and original.num_columns:
            replayed = replayed.select(original.column_names).cast(original.schema)
        else:
            return ObjectReplay(obj, original.num_rows, replayed.num_rows, original.num_rows, replayed.num_rows,
                                _examples(original), _examples(replayed))
    if not can_diff(original.schema):  # nested columns: compare their text form
        original = pa.table({c: pc.cast(original[c], pa.string()) if pa.types.is_nested(original.schema.field(c).type)
                             else original[c] for c in original.column_names})
        replayed = pa.table({c: pc.cast(replayed[c], pa.string()) if pa.types.is_nested(replayed.schema.field(c).type)
                             else replayed[c] for c in replayed.column_names})
    d = diff(original, replayed)
    plus = d.filter(pc.equal(d[OP_COLUMN], 1))
    minus = d.filter(pc.equal(d[OP_COLUMN], -1))
    return ObjectReplay(obj, original.num_rows, replayed.num_rows, minus.num_rows, plus.num_rows,
                        _examples(minus), _examples(plus))


def replay_checkpoint(runner, cp) -> ReplayResult:
    """Replay checkpoint ``cp`` (a CompletedCheckpoint of ``runner``'s job) from its parent in a scratch
    location and compare (see module docstring). Never raises for a checkpoint that cannot be replayed: the
    result's ``not_checked`` says why; a replay that fails while running is reported the same way, with the
    error."""
    t0 = time.perf_counter()
    md = cp.metadata
    name = md.name
    everything = "every process-dependent object"

    def done(objects=(), not_checked=None, scratch="") -> ReplayResult:
        return ReplayResult(runner.job.name, name, md.epoch, md.parent_id, tuple(objects), dict(not_checked or {}),
                            time.perf_counter() - t0, scratch)

    why = _refusal(runner, cp)
    parent = None
    if why is None:
        parent, why = _parent(runner, cp)
    if why is not None or parent is None:
        return done(not_checked={everything: why or f"no parent of checkpoint {md.checkpoint_id}"})
    token = f"{runner.job.name}-c{md.checkpoint_id}-{uuid.uuid4().hex[:8]}"
    config = runner.config
    ckpt_root, ckpt_dir = _scratch_root(config.checkpoint_uri, token)
    sink_root, sink_dir = _scratch_root(config.sink_uri, token)
    scratch = dataclasses.replace(config, checkpoint_uri=ckpt_root, sink_uri=sink_root,
                                  dead_letter_uri=join_uri(ckpt_root, DEFAULT_DEAD_LETTER_DIR), sink_format="epochal",
                                  iceberg_catalog="", iceberg_catalog_uri="", validate_after_epoch=False,
                                  retained_checkpoints=max(2, config.retained_checkpoints))
    ckpt_fio, sink_fio = file_io_for(ckpt_root), file_io_for(sink_root)
    try:
        src_layout = JobLayout(runner.job_root)
        dst_layout = JobLayout(join_uri(ckpt_root, runner.job.name))
        ckpt_fio.write_bytes(dst_layout.job_json(), runner.ckpt_fio.read_bytes(src_layout.job_json()))
        barriers = {s: {p: pos.to_dict() for p, pos in parts.items()} for s, parts in md.barriers.items()}
        doc = {"job": runner.job.name, "epoch": md.epoch, "barrier_time": md.barrier_time, "barriers": barriers,
               "idle_partitions": {}, "written_at": md.created_at, "replay_of": name}
        ckpt_fio.write_bytes(dst_layout.barrier(md.epoch), (json.dumps(doc, indent=1) + "\n").encode())
        replayer = JobRunner(runner.job, scratch, clock=runner.clock, runner_id=f"replay-{token}",
                             echo=lambda m: log.debug("replay %s: %s", name, m), listeners=[])
        if runner.spark_started:  # the same Spark session (get_spark returns the active one)
            replayer.ctx.spark_session = runner.ctx.spark_session
        cursor = cursor_from_metadata(parent.metadata)
        cursor.materialize = True   # NO_CLAIM: fresh bases in the scratch root, never a delta on the job's files
        summaries = replayer.planner.summaries(cursor)
        logged = replayer.barrier_log.barriers_for(md.epoch, summaries, cursor)
        assert logged is not None
        _, rounds = replayer.complete_epoch(cursor, md.epoch, logged, summaries, parallelism=md.parallelism)
        replayed = replayer.coordinator.store.get(rounds[-1].checkpoint_id).metadata
        objects = []
        mine = _state_tables(runner.ckpt_fio, md)
        theirs = _state_tables(ckpt_fio, replayed)
        for obj in sorted(set(mine) | set(theirs)):
            objects.append(compare_tables(obj, mine.get(obj, pa.table({})), theirs.get(obj, pa.table({}))))
        mine = _sink_tables(runner.sink_fio, md)
        theirs = _sink_tables(sink_fio, replayed)
        for obj in sorted(set(mine) | set(theirs)):
            objects.append(compare_tables(obj, mine.get(obj, pa.table({})), theirs.get(obj, pa.table({}))))
        return done(objects, scratch=ckpt_root)
    except Exception as e:  # noqa: BLE001 - reported: the replay could not prove determinism
        log.exception("replay of %s failed", name)
        return done(not_checked={everything: f"the replay of epoch {md.epoch} from checkpoint {md.parent_id} "
                                             f"failed: {type(e).__name__}: {e}"}, scratch=ckpt_root)
    finally:
        for fio, root, d in ((ckpt_fio, ckpt_root, ckpt_dir), (sink_fio, sink_root, sink_dir)):
            try:
                if d is not None:
                    import shutil
                    shutil.rmtree(d, ignore_errors=True)
                else:
                    fio.delete_prefix(root)
            except Exception as e:  # noqa: BLE001 - a leftover scratch dir must not fail the validation
                log.warning("could not delete the replay scratch %s: %s", root, e)
