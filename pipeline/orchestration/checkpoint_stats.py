"""Flink-style summaries of a job's checkpoint history (pure functions over history rows, as dicts).

* :func:`counts` - triggered (every id ever claimed), completed, failed (with a recorded reason: declined,
  expired, fenced), in progress / aborted (no ``_metadata``), corrupt, savepoints, restored and rewound (from the
  restore log, :mod:`pipeline.checkpoint.restores`);
* :func:`summary` - min / avg / max and the 50th, 90th and 99th percentiles of end-to-end duration, state size
  and alignment time over completed checkpoints (Flink's "Summary" tab);
* :func:`latest_failed` - the newest failed checkpoint and its reason;
* :func:`lineage` - the head's lineage (parent links), the latest restore (a checkpoint whose parent is a
  savepoint or not the previous completed checkpoint) and the checkpoints a restore or rewind **abandoned**
  (completed, newer than the fork point, not on the head's lineage);
* :func:`configuration` - the checkpointing configuration the api-server sees.

The history rows come from storage (:class:`~pipeline.orchestration.history.CheckpointHistory`), so all of
this survives process failures.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["counts", "summary", "lineage", "configuration", "latest_failed", "percentile"]


def counts(checkpoints: Iterable[Mapping[str, Any]], savepoints: Iterable[Mapping[str, Any]], *,
           restores: Iterable[Mapping[str, Any]] = (), triggered: int | None = None) -> dict[str, int]:
    """``triggered``: the newest claimed checkpoint id (ids are claimed once, from 1), or the rows' count."""
    rows = list(checkpoints)
    events = list(restores)
    return {"triggered": max(triggered or 0, max((int(r["checkpoint_id"]) for r in rows), default=0)),
            "restored": sum(e.get("kind") == "restore" for e in events),
            "rewound": sum(e.get("kind") == "rewind" for e in events),
            "completed": sum(r["status"] == "COMPLETED" for r in rows),
            "failed": sum(r["status"] == "FAILED" for r in rows),
            "in_progress_or_aborted": sum(r["status"] == "PENDING" for r in rows),
            "corrupt": sum(r["status"] == "CORRUPT" for r in rows),
            "savepoints": sum(1 for _ in savepoints)}


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by linear interpolation between the closest ranks (None: no values)."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mma(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"min": None, "avg": None, "max": None, "p50": None, "p90": None, "p99": None}
    return {"min": min(values), "avg": sum(values) / len(values), "max": max(values),
            "p50": percentile(values, 50), "p90": percentile(values, 90), "p99": percentile(values, 99)}


def latest_failed(checkpoints: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest FAILED checkpoint row (its ``problem`` is the recorded reason), or None."""
    failed = [r for r in checkpoints if r["status"] == "FAILED"]
    return max(failed, key=lambda r: int(r["checkpoint_id"])) if failed else None


def summary(checkpoints: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float | None]]:
    done = [r for r in checkpoints if r["status"] == "COMPLETED"]

    def col(name: str) -> list[float]:
        return [float(r[name]) for r in done if r.get(name) is not None]
    return {"duration_ms": _mma(col("duration_ms")), "state_bytes": _mma(col("state_bytes")),
            "checkpointed_bytes": _mma(col("checkpointed_bytes")),
            "sink_bytes": _mma(col("sink_bytes")), "alignment_ms": _mma(col("alignment_ms"))}


def lineage(checkpoints: Iterable[Mapping[str, Any]], savepoints: Iterable[Mapping[str, Any]],
            head: int | None) -> dict[str, Any]:
    """Head lineage, latest restore and abandoned checkpoints (ids)."""
    cps = {r["checkpoint_id"]: r for r in checkpoints if r["status"] == "COMPLETED"}
    sps = {r["checkpoint_id"]: r for r in savepoints if r.get("status") == "COMPLETED"}
    chain: list[int] = []
    cur = head
    seen: set[int] = set()
    while cur is not None and cur in cps and cur not in seen:
        seen.add(cur)
        chain.append(cur)
        cur = cps[cur].get("parent_id")
    restore = None
    done_ids = sorted(cps)
    for cid in chain:  # newest first
        parent = cps[cid].get("parent_id")
        older = [i for i in done_ids if i < cid]
        previous = older[-1] if older else None
        if parent is not None and (parent in sps or parent != previous):
            restore = {"checkpoint_id": cid, "from_id": parent,
                       "from_kind": "savepoint" if parent in sps else "checkpoint",
                       "from_location": (sps.get(parent) or cps.get(parent) or {}).get("location"),
                       "epoch": cps[cid].get("epoch")}
            break
    fork = restore["from_id"] if restore else None
    abandoned = sorted(i for i in cps if i not in seen and (fork is None or i > fork)) if head is not None else []
    return {"head": head, "lineage": chain, "latest_restore": restore, "abandoned": abandoned}


def configuration(config: Any, job_info: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, value) pairs: Flink's checkpoint configuration, in Epochal's terms."""
    c = config
    unaligned = "unaligned" if c.unaligned else (
        f"aligned, timeout {c.aligned_timeout_seconds:g} s" if c.aligned_timeout_seconds else "aligned")
    return [
        ("Checkpointing mode", str(c.checkpoint_mode)),
        ("Barrier alignment", unaligned),
        ("Epoch length (checkpoint interval)", f"{c.epoch_seconds} s"),
        ("Allowed lateness", f"{c.allowed_lateness_seconds} s"),
        ("Max records per input per round", f"{c.max_records_per_epoch:,}"),
        ("Checkpoint timeout", f"{c.checkpoint_timeout_seconds:g} s"),
        ("Tolerable failed checkpoints", str(c.tolerable_failed_checkpoints)),
        ("Retained checkpoints", str(c.retained_checkpoints)),
        ("Parallelism (default) / max parallelism", f"{c.parallelism} / {job_info.get('max_parallelism', c.max_parallelism)}"),
        ("Bad records", str(c.bad_records)),
        ("State TTL", f"{c.state_ttl_seconds} s"),
        ("Checkpoint storage", str(c.checkpoint_uri)),
    ]
