"""Run ``python -m pipeline ...`` as a child process and optionally SIGKILL it at a chosen moment.

Used by the demo and the crash tests. The child runs in its own session (process group) so that a
SIGKILL takes down the driver, its JVM and the Python workers together, like a lost machine.
Phase markers (``EPOCHAL_PHASE <point>``, see :mod:`pipeline.faults`) and progress lines on stderr let
the caller aim the kill at a phase of the checkpoint life cycle.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

__all__ = ["JobProcessResult", "run_job_process"]


@dataclass
class JobProcessResult:
    returncode: int
    stdout: str
    stderr_lines: list[str] = field(default_factory=list)
    killed: bool = False
    killed_at: str | None = None
    wall_s: float = 0.0


def run_job_process(args: Sequence[str], env: Mapping[str, str] | None = None, *,
                    kill_when: Callable[[str], bool] | None = None, kill_delay_s: float = 0.0,
                    echo: Callable[[str], None] | None = None, timeout_s: float = 1800.0,
                    cwd: str | None = None, on_line: Callable[[str], None] | None = None) -> JobProcessResult:
    """Run ``python -m pipeline <args>``; if ``kill_when(line)`` is true for a stderr line, SIGKILL the
    whole process group ``kill_delay_s`` seconds later. ``on_line`` sees every stderr line (phase markers
    included), e.g. to start an S3 outage at a phase."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYSPARK_PYTHON", sys.executable)
    full_env["EPOCHAL_PHASE_MARKERS"] = "1"
    full_env["EPOCHAL_KILL_SCOPE"] = "group"  # the child is a session leader: a kill takes the whole job
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env, cwd=cwd, start_new_session=True)
    res = JobProcessResult(returncode=-1, stdout="")
    out_chunks: list[str] = []
    t_out = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True)  # type: ignore[union-attr]
    t_out.start()
    timer: threading.Timer | None = None

    def kill(reason: str) -> None:
        if proc.poll() is None:
            res.killed, res.killed_at = True, reason
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    deadline = threading.Timer(timeout_s, lambda: kill("timeout"))
    deadline.daemon = True
    deadline.start()
    assert proc.stderr is not None
    for line in proc.stderr:
        line = line.rstrip("\n")
        res.stderr_lines.append(line)
        if on_line is not None:
            on_line(line)
        if echo and not line.startswith("EPOCHAL_PHASE") and "WARN" not in line[:40]:
            echo(line)
        if kill_when is not None and timer is None and not res.killed and kill_when(line):
            timer = threading.Timer(kill_delay_s, lambda l=line: kill(l))
            timer.daemon = True
            timer.start()
    proc.wait()
    deadline.cancel()
    if timer is not None:
        timer.join()
    try:  # make sure nothing of the group survives (the JVM, python workers)
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    t_out.join(5)
    res.returncode = proc.returncode
    res.stdout = "".join(out_chunks)
    res.wall_s = time.time() - t0
    return res
