"""CheckpointIdCounter: checkpoint ids that strictly increase across restarts and are never reused.

An id is *claimed* by creating ``<job root>/ids/<id:012d>`` with a create-only write (S3
``If-None-Match: *``; locally ``os.link``). Exactly one runner can create a given claim object, so two
runners of the same job never get the same id. ``next()`` starts at one above the highest claim (and
above every ``checkpoints/chk-<id>`` directory, so a lost ``ids/`` folder cannot cause reuse) and
moves upward on conflict. The highest claim is never deleted, so "the max claimed id" survives and
is what fencing compares against: a runner whose checkpoint id is below ``latest_claimed()`` has
been superseded.

Pruning and the stale-listing hazard: a pruned claim object could be created again by a runner whose
listing is stale (listings are not snapshots while other runners create and delete claims). So

* a claim only counts if no higher claim is listed right after it was created (otherwise
  ``next()`` claims again, higher), and
* pruning keeps a window of the newest ``keep_claims`` ids (default 32) and only deletes claims below
  it. Claims inside the window stay put while a listing runs, so the check above sees them; an id
  could only be "resurrected" if ``keep_claims`` newer ids were claimed during one listing.

Listing cost: the counter remembers the highest claim it has seen (``floor``). Since the highest claim is never
deleted, every claim that matters (the newest, and any a concurrent runner made since) is at or above it, so
later listings start there (S3 ``StartAfter``): O(claims since), not O(``keep_claims``) per listing. Pruning
lists the whole window only when the new id is a multiple of ``keep_claims``, and otherwise deletes the one
claim that just left the window.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from dataclasses import dataclass

from pipeline import settings
from pipeline.checkpoint.metadata import iso_utc
from pipeline.exceptions import CheckpointError, ConditionalWriteError, ObjectNotFoundError, StorageError
from pipeline.fileio import FileIO, join_uri
from pipeline.layout import JobLayout, checkpoint_id_of, id_claim_name

__all__ = ["CheckpointIdCounter", "IdClaim", "default_runner_id", "airflow_task_of", "DEFAULT_KEEP_CLAIMS"]

log = logging.getLogger(__name__)

_MAX_ATTEMPTS = 1000
DEFAULT_KEEP_CLAIMS = 32


AIRFLOW_RUNNER_PREFIX = "airflow/"


def default_runner_id() -> str:
    """``host:pid:random`` - identifies a runner (coordinator) in claims and error messages. Inside an Airflow
    task (its ``AIRFLOW_CTX_*`` variables) it is ``airflow/<dag>/<run>/<task>/<try>@host:pid:random``, so the
    checkpoint history can link each checkpoint to the run and task log that took it (:func:`airflow_task_of`)."""
    own = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    ctx = [settings.raw(f"AIRFLOW_CTX_{k}") for k in ("DAG_ID", "DAG_RUN_ID", "TASK_ID", "TRY_NUMBER")]
    if all(ctx[:3]):
        return f"{AIRFLOW_RUNNER_PREFIX}{ctx[0]}/{ctx[1]}/{ctx[2]}/{ctx[3] or ''}@{own}"
    return own


def airflow_task_of(runner: str | None) -> dict[str, str] | None:
    """``{"dag_id", "run_id", "task_id", "try_number"}`` of a runner id made in an Airflow task, else None."""
    if not runner or not runner.startswith(AIRFLOW_RUNNER_PREFIX) or "@" not in runner:
        return None
    parts = runner[len(AIRFLOW_RUNNER_PREFIX):].rsplit("@", 1)[0].split("/")
    if len(parts) < 4:
        return None
    return {"dag_id": parts[0], "run_id": "/".join(parts[1:-2]), "task_id": parts[-2], "try_number": parts[-1]}


@dataclass(frozen=True, slots=True)
class IdClaim:
    """Who claimed a checkpoint id, and when."""

    checkpoint_id: int
    runner: str
    claimed_at: str


class CheckpointIdCounter:
    """Claims checkpoint ids for one job under ``<job root>/ids/``."""

    def __init__(self, fileio: FileIO, job_root: str, *, runner_id: str | None = None,
                 keep_claims: int = DEFAULT_KEEP_CLAIMS) -> None:
        if keep_claims < 1:
            raise ValueError(f"keep_claims must be >= 1, got {keep_claims}")
        self.keep_claims = keep_claims
        self.fileio = fileio
        self.job_root = job_root.rstrip("/")
        self.ids_uri = JobLayout(self.job_root).ids()
        self.runner_id = runner_id or default_runner_id()
        self._floor: int | None = None  # the highest claim seen: claims below it are never needed again

    def claim_uri(self, checkpoint_id: int) -> str:
        return join_uri(self.ids_uri, id_claim_name(checkpoint_id))

    def observe(self, checkpoint_id: int) -> None:
        """``checkpoint_id`` was claimed once (e.g. a completed checkpoint): the newest claim is at least that, so
        listings may start there."""
        self._floor = max(int(checkpoint_id), self._floor or 0)

    def _list_claims(self, floor: int | None) -> list[int]:
        start = self.claim_uri(floor - 1) if floor is not None and floor > 0 else None
        ids = []
        for fi in self.fileio.list(self.ids_uri, recursive=False, start_after=start):
            name = fi.uri.rsplit("/", 1)[-1]
            if name.isdigit():
                ids.append(int(name))
        return sorted(ids)

    def _claimed_ids(self) -> list[int]:
        """The claims at or above the highest claim seen before (all of them the first time; see module docstring:
        the highest claim is never deleted, so the newest is always among them), sorted."""
        ids = self._list_claims(self._floor)
        if ids:
            self._floor = max(ids[-1], self._floor or 0)
        return ids

    def _used_dir_ids(self) -> int:
        """Highest id among ``checkpoints/chk-<id>`` directories (0 if none)."""
        best = 0
        for name in self.fileio.list_dirs(JobLayout(self.job_root).checkpoints()):
            cid = checkpoint_id_of(name)
            if cid is not None:
                best = max(best, cid)
        return best

    def latest_claimed(self) -> int | None:
        """The highest claimed id, or None if no id was ever claimed."""
        ids = self._claimed_ids()
        return ids[-1] if ids else None

    def claim_info(self, checkpoint_id: int) -> IdClaim | None:
        """Who claimed ``checkpoint_id`` (None if the claim object is gone/pruned)."""
        try:
            d = json.loads(self.fileio.read_bytes(self.claim_uri(checkpoint_id)))
            return IdClaim(int(d["checkpoint_id"]), str(d.get("runner", "?")), str(d.get("claimed_at", "?")))
        except ObjectNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return IdClaim(checkpoint_id, "?", "?")

    def next(self, at_least: int = 1) -> int:
        """Claim and return a new id: above every existing claim/checkpoint dir and >= ``at_least``."""

        claimed = self._claimed_ids()
        candidate = max([at_least, self._used_dir_ids() + 1] + [c + 1 for c in claimed[-1:]])
        for _ in range(_MAX_ATTEMPTS):
            body = json.dumps({"checkpoint_id": candidate, "runner": self.runner_id, "claimed_at": iso_utc()})
            try:
                self.fileio.write_bytes(self.claim_uri(candidate), body.encode(), if_none_match=True)
            except ConditionalWriteError:
                log.info("checkpoint id %d of %s already claimed by another runner; trying higher",
                         candidate, self.job_root)
                claimed = self._claimed_ids()
                candidate = max([candidate + 1] + [c + 1 for c in claimed[-1:]])
                continue
            # The claim object was created, but ``candidate`` may be an id that was claimed before and
            # pruned since (our listing was stale). The highest claim is never deleted, so if a higher
            # claim exists now, ``candidate`` is not new: move above it and claim again.
            claimed = self._claimed_ids()
            if claimed and claimed[-1] > candidate:
                log.info("checkpoint id %d of %s is below the newest claim %d; trying higher",
                         candidate, self.job_root, claimed[-1])
                candidate = claimed[-1] + 1
                continue
            self._prune_below(candidate - self.keep_claims + 1)
            return candidate
        raise CheckpointError(f"could not claim a checkpoint id under {self.ids_uri} after {_MAX_ATTEMPTS} attempts")

    def _prune_below(self, checkpoint_id: int) -> None:
        if checkpoint_id <= 1:
            return
        if checkpoint_id % self.keep_claims != 0:  # only the claim that just left the window (a missing one is fine)
            try:
                self.fileio.delete(self.claim_uri(checkpoint_id - 1))
            except StorageError as e:  # pruning is best effort
                log.warning("could not prune checkpoint id claim %s: %s", self.claim_uri(checkpoint_id - 1), e)
            return
        for old in self._list_claims(None):
            if old >= checkpoint_id:
                break
            try:
                self.fileio.delete(self.claim_uri(old))
            except StorageError as e:  # pruning is best effort
                log.warning("could not prune checkpoint id claim %s: %s", self.claim_uri(old), e)
