"""Operator dead letters: where they are written, and the sweep that leaves each dead record exactly once.

Layout (one directory per operator, epoch and checkpoint attempt)::

    <dead-letter root>/<job>/operator=<uid>/epoch-<m>/chk-<id>/<file>

A window writes its late and unassignable records there (Parquet), a join the rows that violate its ``unique``
declaration (JSON lines). Tasks write under the id of the checkpoint they work for, so an attempt that never
completes (SIGKILL between the dead letters and ``_metadata``, an aborted checkpoint) leaves its files under
its own ``chk-<id>``, and the replay of the epoch writes the same records again under the new id; inside the
completing checkpoint's directory, a failed Spark task attempt may leave a file its retry wrote again.

**Which files count.** A completed checkpoint lists, per operator, the dead-letter files its tasks acknowledged
(``_metadata`` ``extra.dead_letter_files``, :class:`DeadLetterFiles`); its stats count their rows
(``dead_letters["operator=<uid>"]``).

**The sweep** (:func:`sweep_dead_letters`), run after the checkpoint's sinks are committed and again on every
restore of a checkpoint (recoverAndCommit-style: a kill in the middle is finished by the next start):

1. per operator the checkpoint lists: ONE listing of ``operator=<uid>/epoch-<m>/`` (this epoch's files only:
   O(new files), never the operator's history);
2. a file in the checkpoint's own directory that it does not list (a failed task attempt's): deleted;
3. a ``chk-<id>`` directory of another id: deleted whole if checkpoint ``id`` is not a completed checkpoint (a
   crashed or aborted attempt of the same epoch; one ``_metadata`` read per such id), kept otherwise (a retained
   checkpoint of a rewound branch: its own files stay as long as it is retained);
4. the files the checkpoint lists are never deleted, so a kill at any point loses nothing.

**A rewound branch.** Step 3 keeps the directory of a retained checkpoint of the same epoch (a restore or a
rewind may still come back to it). When retention later discards it, nothing would list that epoch again, so
its dead letters would stay beside the newer branch's: :func:`superseding_checkpoints` names, for the
checkpoints retention discarded, the newer retained checkpoint of the same epoch with dead letters of its own,
and the runtime sweeps that epoch again for it (``RuntimeContext.sweep_superseded_dead_letters``). A discarded
main-line checkpoint (no newer checkpoint completed its epoch) keeps its dead letters: they are the epoch's
only copy. A kill between the discard and that sweep leaves the old branch's files until the epoch is swept
again (its next completion or restore).

Source bad records need no sweep: their file names are a function of the split's position
(``<source>/partition=<p>/<seq>-<row>.jsonl``), so a replay overwrites the same file. An operator's dead letters
cannot be named that way: the key-group ranges in their names change when a job resumes at another parallelism.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from pipeline.checkpoint.recovery_fields import DEAD_LETTER_FILES_KEY
from pipeline.faults import fault_point
from pipeline.layout import checkpoint_dir_name, checkpoint_id_of
from pipeline.layout.dead_letters import (  # the keys live in the layout; re-exported here
    attempt_dead_letter_dir,
    dead_letter_name,
    epoch_dead_letter_prefix,
    operator_dead_letter_prefix,
)

__all__ = ["DeadLetterFiles", "SweepResult", "dead_letter_name", "operator_dead_letter_prefix",
           "epoch_dead_letter_prefix", "attempt_dead_letter_dir", "sweep_dead_letters", "superseding_checkpoints", "files_of_reports"]



@dataclass(frozen=True, slots=True)
class DeadLetterFiles:
    """The operator dead-letter files one completed checkpoint counts (``_metadata`` ``extra``)."""

    epoch: int
    files: Mapping[str, tuple[str, ...]]   # operator uid -> file URIs

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "files": {u: list(fs) for u, fs in sorted(self.files.items())}}

    @classmethod
    def from_extra(cls, extra: Mapping, epoch: int) -> DeadLetterFiles:
        d = extra.get(DEAD_LETTER_FILES_KEY) or {}
        return cls(int(d.get("epoch", epoch)), {str(u): tuple(str(f) for f in fs)
                                                 for u, fs in (d.get("files") or {}).items()})


@dataclass(frozen=True, slots=True)
class SweepResult:
    listed: int = 0            # listings made (one per operator with dead letters in the checkpoint)
    deleted_files: int = 0     # stray files of failed task attempts in the checkpoint's own directory
    deleted_attempts: int = 0  # directories of attempts that never completed


def sweep_dead_letters(fileio, dead_letter_root: str, job: str, checkpoint_id: int, kept: DeadLetterFiles,
                       is_completed: Callable[[int], bool]) -> SweepResult:
    """Delete the dead letters of ``kept.epoch`` that completed checkpoint ``checkpoint_id`` does not count and no
    other completed checkpoint owns (see the module docstring). ``is_completed(id)``: checkpoint ``id`` has a
    readable ``_metadata``. Crash-safe and idempotent: it only deletes what no completed checkpoint counts."""
    listed = files_n = attempts = 0
    own = checkpoint_dir_name(checkpoint_id)
    for uid, files in sorted(kept.files.items()):
        if not files:
            continue
        prefix = epoch_dead_letter_prefix(dead_letter_root, job, uid, kept.epoch)
        keep = set(files)
        by_dir: dict[str, list[str]] = {}
        for fi in fileio.list(f"{prefix}/", recursive=True):
            rest = fi.uri[len(prefix):].lstrip("/")
            d, sep, _ = rest.partition("/")
            if sep:
                by_dir.setdefault(d, []).append(fi.uri)
        listed += 1
        for d, uris in sorted(by_dir.items()):
            cid = checkpoint_id_of(d)
            if cid is None:
                continue  # not an attempt directory: not ours to judge
            if d == own:
                for u in sorted(set(uris) - keep):  # a failed task attempt's file (its retry's is counted)
                    fileio.delete(u)
                    files_n += 1
                    fault_point("dead_letter_sweep")
            elif not is_completed(cid):
                fileio.delete_prefix(f"{prefix}/{d}")
                attempts += 1
                fault_point("dead_letter_sweep")
    return SweepResult(listed, files_n, attempts)


def superseding_checkpoints(discarded: Sequence, retained: Sequence) -> list:
    """The retained checkpoints whose epoch must be swept again after retention discarded ``discarded`` (both:
    completed checkpoints with ``checkpoint_id``, ``epoch`` and ``metadata.extra``): for each discarded
    checkpoint that counted dead letters, the newest retained checkpoint of the same epoch with a higher id that
    counts dead letters too (a newer branch completed that epoch again). Each at most once, in id order."""
    def counts(cp) -> bool:
        return bool(DeadLetterFiles.from_extra(cp.metadata.extra or {}, cp.epoch).files)

    newest: dict[int, object] = {}
    for cp in sorted(retained, key=lambda c: c.checkpoint_id):
        if counts(cp):
            newest[cp.epoch] = cp
    out: dict[int, object] = {}
    for cp in discarded:
        z = newest.get(cp.epoch)
        if z is not None and z.checkpoint_id > cp.checkpoint_id and counts(cp):  # type: ignore[attr-defined]
            out[z.checkpoint_id] = z  # type: ignore[attr-defined]
    return [out[k] for k in sorted(out)]


def files_of_reports(reports: Sequence) -> dict[str, list[str]]:
    """Per operator uid, the dead-letter file URIs of ``reports`` (task reports of kind DEAD_LETTER)."""
    out: dict[str, list[str]] = {}
    for r in reports:
        if r.file is not None and r.rows:
            out.setdefault(r.operator_uid, []).append(r.file.uri)
    return out
