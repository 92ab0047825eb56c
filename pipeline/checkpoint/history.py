"""Checkpoint history: the one projection of checkpoint metadata into history rows.

:class:`CheckpointRow` is built once from a checkpoint's ``_metadata`` (:func:`row_from_metadata`); the Airflow
checkpoint view (:mod:`pipeline.orchestration.history`) shows it as is, and ``checkpoints list|show`` prints
:func:`checkpoint_summary` - the same row under the CLI's ``--json`` keys.

(Formerly ``pipeline/inspect.py``, which shadowed the standard library's ``inspect`` when ``pipeline/`` was on
``sys.path``, as under spark-submit.)
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from pipeline.checkpoint.completed import CompletedCheckpoint
from pipeline.checkpoint.coordinator import CheckpointCoordinator
from pipeline.checkpoint.metadata import CheckpointMetadata
from pipeline.checkpoint.stats import OperatorStats
from pipeline.checkpoint.store import CheckpointDirStatus

__all__ = ["CheckpointRow", "row_from_metadata", "checkpoint_summary", "list_checkpoints", "show_checkpoint",
           "format_list", "format_show"]


class SnapshotReader(Protocol):
    """What the history reads of a job's runner (:class:`~pipeline.runtime.driver.runner.JobRunner`): its
    checkpoint coordinator and a snapshot by id or savepoint URI (the checkpoint package does not import the
    runtime)."""

    @property
    def coordinator(self) -> CheckpointCoordinator: ...

    def load_snapshot(self, ref: str) -> CompletedCheckpoint: ...


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """One line of the history table (a COMPLETED checkpoint or savepoint, or a PENDING / CORRUPT / FAILED
    directory, whose stats fields are None)."""

    checkpoint_id: int
    kind: str                    # checkpoint | savepoint
    status: str                  # COMPLETED | PENDING | CORRUPT | FAILED
    epoch: int | None
    barrier_time: str | None
    trigger_time: str | None
    duration_ms: float | None
    state_bytes: int | None
    sink_bytes: int | None
    alignment_ms: float | None
    acks: int | None
    expected_acks: int | None
    parallelism: int | None
    parent_id: int | None
    location: str
    records: Mapping[str, int] = field(default_factory=dict)
    operators: tuple[OperatorStats, ...] = ()
    problem: str | None = None
    checkpointed_bytes: int | None = None   # what this checkpoint wrote; ``state_bytes`` is the full state
    state_rows: int | None = None
    sync_ms: float | None = None
    async_ms: float | None = None
    rounds: int | None = None
    checkpoint_mode: str | None = None
    alignment: str | None = None
    mode_used: str | None = None
    backlog: Mapping[str, int] = field(default_factory=dict)
    dead_letters: Mapping[str, int] = field(default_factory=dict)
    sink_rows: Mapping[str, int] = field(default_factory=dict)
    s3_requests: Mapping[str, int] | None = None  # the driver's S3 requests by kind (CheckpointStats.s3_requests)
    executor_s3_requests: Mapping[str, int] | None = None  # the executors' (CheckpointStats.executor_s3_requests)
    executor_s3_requests_counting: str | None = None  # "exact" | "approximate" (CheckpointStats); None: not recorded

    @property
    def start_delay_ms(self) -> float:
        return max((o.start_delay_ms for o in self.operators), default=0.0)

    @property
    def inflight_bytes(self) -> int:
        return sum(o.inflight_bytes for o in self.operators)

    def to_dict(self) -> dict[str, Any]:
        """The Airflow checkpoint view's JSON."""
        d = asdict(self)
        for k in ("records", "backlog", "dead_letters", "sink_rows"):
            d[k] = dict(getattr(self, k))
        d["s3_requests"] = None if self.s3_requests is None else dict(self.s3_requests)
        d["executor_s3_requests"] = None if self.executor_s3_requests is None else dict(self.executor_s3_requests)
        d["operators"] = [o.to_dict() for o in self.operators]
        return d

    def summary(self) -> dict[str, Any]:
        """The ``checkpoints list|show --json`` keys (CLI contract)."""
        return {
            "id": self.checkpoint_id, "kind": self.kind, "status": self.status, "epoch": self.epoch,
            "barrier_time": self.barrier_time, "parent_id": self.parent_id, "trigger_time": self.trigger_time,
            "duration_ms": self.duration_ms, "state_bytes": self.state_bytes or 0, "state_rows": self.state_rows or 0,
            "checkpointed_bytes": self.checkpointed_bytes or 0, "sync_ms": self.sync_ms or 0,
            "async_ms": self.async_ms or 0, "alignment_ms": self.alignment_ms or 0,
            "acks": f"{self.acks}/{self.expected_acks}" if self.acks is not None else "",
            "rounds": self.rounds or 1, "mode": self.checkpoint_mode, "alignment": self.alignment,
            "parallelism": self.parallelism, "backlog": dict(self.backlog), "dead_letters": dict(self.dead_letters),
            "sink_rows": dict(self.sink_rows), "location": self.location, "mode_used": self.mode_used,
            "start_delay_ms": self.start_delay_ms, "inflight_bytes": self.inflight_bytes,
            "s3_requests": None if self.s3_requests is None else dict(self.s3_requests),
            "executor_s3_requests": None if self.executor_s3_requests is None else dict(self.executor_s3_requests),
            "executor_s3_requests_counting": self.executor_s3_requests_counting,
        }


def row_from_metadata(md: CheckpointMetadata, location: str, status: str = "COMPLETED") -> CheckpointRow:
    """The history row of a checkpoint's (or savepoint's) metadata."""
    st = md.stats
    records = dict(md.recovery.records or {})
    return CheckpointRow(
        checkpoint_id=md.checkpoint_id, kind=md.kind, status=status, epoch=md.epoch, barrier_time=md.barrier_time,
        trigger_time=st.trigger_time if st else None, duration_ms=st.duration_ms if st else None,
        state_bytes=st.bytes if st else None, sink_bytes=sum(f.bytes for s in md.sinks.values() for f in s.files),
        alignment_ms=st.alignment_ms if st else None, acks=st.acks if st else None,
        expected_acks=st.expected_acks if st else None, parallelism=md.parallelism, parent_id=md.parent_id,
        location=location, records=records,
        operators=tuple(o for _, o in sorted(st.operators.items())) if st else (),
        checkpointed_bytes=st.checkpointed_bytes if st else None, state_rows=st.rows if st else None,
        sync_ms=st.sync_ms if st else None, async_ms=st.async_ms if st else None, rounds=st.rounds if st else None,
        checkpoint_mode=md.checkpoint_mode, alignment=md.alignment, mode_used=_mode_used(md),
        backlog=dict(st.backlog) if st else {}, dead_letters=dict(st.dead_letters) if st else {},
        sink_rows={t: s.rows for t, s in md.sinks.items()},
        s3_requests=st.s3_requests.to_dict() if st is not None and st.s3_requests is not None else None,
        executor_s3_requests=st.executor_s3_requests.to_dict()
        if st is not None and st.executor_s3_requests is not None else None,
        executor_s3_requests_counting=st.executor_s3_requests_counting.value
        if st is not None and st.executor_s3_requests_counting is not None else None)


def checkpoint_summary(cp: CompletedCheckpoint, status: str = "COMPLETED") -> dict[str, Any]:
    """One row of ``checkpoints list`` for a :class:`~pipeline.checkpoint.completed.CompletedCheckpoint`."""
    return row_from_metadata(cp.metadata, cp.location, status).summary()


def _mode_used(md: CheckpointMetadata) -> str:
    """The alignment mode actually used (per-operator modes, e.g. ``aligned_then_unaligned`` after a timeout)."""
    modes = sorted({o.mode for o in md.stats.operators.values()}) if md.stats else []
    al = md.recovery.alignment
    return str(al.get("mode_used") or (modes[0] if len(modes) == 1 else ",".join(modes) or md.alignment))


def list_checkpoints(runner: SnapshotReader) -> list[dict[str, Any]]:
    """Completed checkpoints (retained), corrupt/pending directories, and savepoints, oldest first."""
    store = runner.coordinator.store
    rows: list[dict[str, Any]] = []
    for info in store.inspect():
        if info.status is CheckpointDirStatus.COMPLETED and info.checkpoint is not None:
            rows.append(checkpoint_summary(info.checkpoint))
        else:
            rows.append({"id": info.checkpoint_id, "kind": "checkpoint", "status": info.status.name,
                         "problem": info.problem, "location": info.location})
    for sp in store.savepoints():
        rows.append(checkpoint_summary(sp))
    return rows


def show_checkpoint(runner: SnapshotReader, ref: str) -> dict[str, Any]:
    """Full detail of one checkpoint (id) or savepoint (URI): barriers, positions, per-operator acks."""
    cp = runner.load_snapshot(ref)
    md = cp.metadata
    d = checkpoint_summary(cp)
    d["positions"] = {s: {p: [pos.seq, pos.row] for p, pos in parts.items()} for s, parts in md.positions.items()}
    d["barriers"] = {s: {p: [pos.seq, pos.row] for p, pos in parts.items()} for s, parts in md.barriers.items()}
    d["operators"] = {}
    for uid, hs in md.operators.items():
        ops = md.stats.operators.get(uid) if md.stats else None
        d["operators"][uid] = {
            "stats": ops.to_dict() if ops else None,
            "handles": [{"subtask": h.subtask, "name": h.name, "kg": [h.kg_start, h.kg_end],
                         "uri": h.file.uri if h.file else None, "rows": h.rows, "bytes": h.bytes,
                         "sha256": h.file.sha256 if h.file else None,
                         "deltas": [f.uri for f in h.deltas], "persisted_bytes": h.checkpointed_bytes}
                        for h in hs]}
    d["subtasks"] = [t.to_dict() for t in md.stats.subtasks] if md.stats else []
    d["channel_state"] = [c.to_dict() for c in md.channel_state]
    d["sinks"] = {t: {"files": len(s.files), "rows": s.rows, "bytes": s.bytes, "full": s.full}
                  for t, s in md.sinks.items()}
    d["extra"] = dict(md.extra) if md.extra else {}
    return d


def _kb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.2f} MiB"


def format_list(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no checkpoints"
    hdr = f"{'id':>5} {'kind':<10} {'status':<10} {'epoch':>10} {'trigger time':<27} {'dur ms':>8} " \
          f"{'size':>11} {'align ms':>8} {'acks':>6} {'rounds':>6}  mode"
    out = [hdr]
    for r in rows:
        if r.get("status") != "COMPLETED":
            out.append(f"{r['id']:>5} {r['kind']:<10} {r['status']:<10} {r.get('problem') or ''}")
            continue
        out.append(f"{r['id']:>5} {r['kind']:<10} {r['status']:<10} {r['epoch']:>10} {str(r['trigger_time']):<27} "
                   f"{r['duration_ms'] or 0:>8.0f} {_kb(r['state_bytes']):>11} {r['alignment_ms'] or 0:>8.0f} "
                   f"{r['acks']:>6} {r['rounds']:>6}  {r.get('mode_used', '')}")
    return "\n".join(out)


def format_show(d: dict[str, Any]) -> str:
    lines = [f"{d['kind']} {d['id']} ({d['status']}): epoch {d['epoch']} (barrier {d['barrier_time']}), "
             f"parent {d['parent_id']}, mode {d['mode']}/{d['alignment']}, parallelism {d['parallelism']}",
             f"  location {d['location']}",
             f"  trigger {d['trigger_time']}, duration {d['duration_ms']:.0f} ms, checkpointed "
             f"{_kb(d.get('checkpointed_bytes', d['state_bytes']))} of full size {_kb(d['state_bytes'])}, "
             f"alignment {d['alignment_ms']:.0f} ms, acks {d['acks']}, rounds {d['rounds']}",
             f"  backlog {d['backlog']}, dead letters {d['dead_letters']}, sink rows {d['sink_rows']}"]
    req = d.get("s3_requests")
    if req is not None:
        lines.append("  S3 requests (driver, since the previous checkpoint): "
                     + ", ".join(f"{k.upper()} {v}" for k, v in req.items()) + f", total {sum(req.values())}")
    ereq = d.get("executor_s3_requests")
    if ereq is not None:
        how = {"exact": "exact: every task of this checkpoint's rounds",
               "approximate": "approximate: reported with the next operator task of each Python worker"}.get(
            str(d.get("executor_s3_requests_counting")), "approximate: not recorded how")
        lines.append(f"  S3 requests (executors, {how}): "
                     + ", ".join(f"{k.upper()} {v}" for k, v in ereq.items()) + f", total {sum(ereq.values())}")
    al = (d.get("extra") or {}).get("alignment")
    if al:
        lines.append(
            f"  alignment: configured {al.get('configured')}, used {al.get('mode_used')}"
            + (" (switched to unaligned at the alignment timeout)" if al.get("switched_to_unaligned") else "")
            + f", {al.get('alignment_ms', 0):.0f} ms, start delay {al.get('start_delay_ms', 0):.0f} ms, first barrier "
            f"in round {al.get('first_barrier_round')}, snapshot after round {al.get('snapshot_round')}"
            + (" (between rounds)" if al.get("between_rounds") else ""))
        if al.get("inflight_files") or al.get("inflight_ranges"):
            lines.append(f"  in-flight data (channel state): {al.get('inflight_rows', 0)} rows in "
                         f"{al.get('inflight_files', 0)} file(s), {al.get('inflight_bytes', 0)} bytes; "
                         f"{len(al.get('inflight_ranges') or [])} source range(s) (replayed, not copied)")
        if al.get("lagging"):
            lines.append(f"  lagging (barrier not known yet, open range): {', '.join(al['lagging'])}")
        if al.get("post_barrier_records"):
            lines.append(f"  post-barrier records in this snapshot (replayed again after a restore: at-least-once): "
                         f"{al['post_barrier_records']}")
    for s in sorted(d["barriers"]):
        lines.append(f"  barrier {s}: " + ", ".join(f"p{p}=({v[0]},{v[1]})" for p, v in sorted(d["barriers"][s].items())))
    for uid, op in d["operators"].items():
        st = op["stats"] or {}
        lines.append(f"  operator {uid}: acks {st.get('acks')}/{st.get('subtasks')}, rows {st.get('rows')}, "
                     f"bytes {st.get('bytes')}, sync {st.get('sync_ms', 0):.0f} ms, async {st.get('async_ms', 0):.0f} ms, "
                     f"alignment {st.get('alignment_ms', 0):.0f} ms, start delay {st.get('start_delay_ms', 0):.0f} ms, "
                     f"in-flight {st.get('inflight_bytes', 0)} bytes, mode {st.get('mode')}")
        for t in d.get("subtasks") or []:
            if t["uid"] == uid:
                ack = f"{t['ack_ms']:.0f} ms after trigger" if t.get("ack_ms") is not None else "time not recorded"
                lines.append(f"    subtask {t['subtask']}: acknowledged {ack}, sync {t['sync_ms']:.0f} ms, "
                             f"async {t['async_ms']:.0f} ms, state {t['state_bytes']} bytes, in {t['in_rows']} rows")
        for h in op["handles"]:
            chain = f" + {len(h['deltas'])} delta(s)" if h.get("deltas") else ""
            lines.append(f"    [{h['subtask']}] {h['name']:<6} kg {h['kg'][0]}-{h['kg'][1]} rows {h['rows']} "
                         f"bytes {h['bytes']} (this checkpoint wrote {h.get('persisted_bytes', h['bytes'])}) "
                         f"{h['uri'] or '(empty)'}{chain}")
    for c in d.get("channel_state") or []:
        if c.get("file"):
            f = c["file"]
            lines.append(f"  channel state {c['operator_uid']}[{c['subtask']}] {c['channel']}: file rows {f['rows']} "
                         f"bytes {f['bytes']} {f['uri']}")
        else:
            end = c.get("end")
            lines.append(f"  channel state {c['operator_uid']} {c['channel']}: source range "
                         f"({c['start']['seq']},{c['start']['row']}) .. "
                         + (f"({end['seq']},{end['row']})" if end else "barrier (not known yet)"))
    return "\n".join(lines)
