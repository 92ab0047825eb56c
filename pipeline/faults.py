"""Fault injection (a test double that ships with the package).

``EPOCHAL_KILL_AT="<point>[:<n>]"`` sends a real SIGKILL to the current process on the n-th time the
named point is reached (default the first). Several points may be given separated by commas. Points:
``reading``, ``writing_state``, ``after_state_before_metadata``, ``after_metadata_before_commit``,
``after_commit``, ``after_commit_log_before_table_commit`` (an Iceberg/Delta sink: Epochal's commit log
entry is written, the table commit is not), ``retention`` (before each subsumed checkpoint is discarded) and
``dead_letter_sweep`` (after each deletion of dead letters a completed checkpoint does not count). Without the variable, :func:`fault_point` costs one dict lookup.

Points are also reached inside Spark's Python workers (``reading``, ``writing_state``). With
``EPOCHAL_KILL_SCOPE=group`` the whole process group is killed (driver, JVM, workers: a lost machine;
:mod:`pipeline.testing.jobproc` starts jobs in their own session and sets it); otherwise only the process
that reached the point dies (a lost worker, which fails the Spark job and aborts the checkpoint).

``EPOCHAL_FAIL_AT="<point>[:<n>]"`` (same points) raises :class:`~pipeline.exceptions.InjectedFailure` instead
of killing: a failure the process sees and survives (a sink that refuses a commit, a source read that aborts).
:class:`pipeline.testing.doubles.FailingSink` and :class:`~pipeline.testing.doubles.AbortingSource` set it.
"""
from __future__ import annotations

import os
import signal
import sys

from pipeline import settings
from pipeline.exceptions import InjectedFailure

__all__ = ["fault_point", "reset_fault_counts", "FAULT_POINTS", "KILL_ENV", "FAIL_ENV"]

KILL_ENV = "EPOCHAL_KILL_AT"
FAIL_ENV = "EPOCHAL_FAIL_AT"

FAULT_POINTS = ("reading", "writing_state", "after_state_before_metadata",
                "after_metadata_before_commit", "after_commit_log_before_table_commit", "after_commit",
                "retention", "dead_letter_sweep")
_hits: dict[str, int] = {}
_fail_hits: dict[str, int] = {}


def reset_fault_counts() -> None:
    """Forget how often each point was reached in this process (the ``<n>`` of the specs counts from here)."""
    _hits.clear()
    _fail_hits.clear()


def _targets(env: str = KILL_ENV) -> dict[str, int]:
    spec = settings.raw(env) or ""
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, n = part.partition(":")
        out[name] = int(n or 1)
    return out


def fault_point(name: str) -> None:
    """Mark a phase; progress markers go to stderr so that crash tests can aim their SIGKILLs."""
    if settings.raw("EPOCHAL_PHASE_MARKERS"):
        print(f"EPOCHAL_PHASE {name}", file=sys.stderr, flush=True)
    fails = _targets(FAIL_ENV)
    if name in fails:
        _fail_hits[name] = _fail_hits.get(name, 0) + 1
        if _fail_hits[name] == fails[name]:
            print(f"EPOCHAL_FAULT failure injected at {name} (hit {_fail_hits[name]})", file=sys.stderr, flush=True)
            raise InjectedFailure(f"injected failure at {name} (hit {_fail_hits[name]}; {FAIL_ENV}="
                                  f"{settings.raw(FAIL_ENV) or ''})")
    targets = _targets()
    if name not in targets:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == targets[name]:
        print(f"EPOCHAL_FAULT SIGKILL at {name} (hit {_hits[name]})", file=sys.stderr, flush=True)
        if settings.raw("EPOCHAL_KILL_SCOPE") == "group":
            # Spark's Python workers run in process groups of their own: kill the job's session group
            # (the driver and its JVM), then this process
            try:
                os.killpg(os.getsid(0), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        os.kill(os.getpid(), signal.SIGKILL)
