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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["JobProcess", "JobProcessResult", "run_job_process"]


@dataclass
class JobProcessResult:
    returncode: int
    stdout: str
    stderr_lines: list[str] = field(default_factory=list)
    killed: bool = False
    killed_at: str | None = None
    wall_s: float = 0.0


def _job_env(env: Mapping[str, str] | None) -> dict[str, str]:
    full_env = dict(os.environ)
    full_env.update(env or {})
    full_env.setdefault("PYSPARK_PYTHON", sys.executable)
    full_env["EPOCHAL_PHASE_MARKERS"] = "1"
    full_env["EPOCHAL_KILL_SCOPE"] = "group"  # the child is a session leader: a kill takes the whole job
    return full_env


class JobProcess:
    """``python -m pipeline <args>`` running in the background (its own session, as :func:`run_job_process`
    starts it), for a caller that acts while it runs - writes source files, sends signals - and waits for
    conditions on its stderr lines (:meth:`wait_for`), never for a fixed time. Use as a context manager: leaving
    it kills whatever of the process group is still alive."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str] | None = None, *, cwd: str | None = None,
                 echo: Callable[[str], None] | None = None) -> None:
        self.args = list(args)
        self.t0 = time.time()
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._echo = echo
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=_job_env(env), cwd=cwd,
                                     start_new_session=True)
        self._out: list[str] = []
        self._t_out = threading.Thread(target=lambda: self._out.append(self.proc.stdout.read()),  # type: ignore[union-attr]
                                       daemon=True)
        self._t_out.start()
        self._t_err = threading.Thread(target=self._read_stderr, daemon=True)
        self._t_err.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()
            if self._echo and not line.startswith("EPOCHAL_PHASE") and "WARN" not in line[:40]:
                self._echo(line)
        with self._cond:
            self._cond.notify_all()

    def mark(self) -> int:
        """The number of stderr lines so far (``wait_for(..., after=mark)`` looks at later lines only)."""
        with self._cond:
            return len(self.lines)

    def wait_for(self, pred: Callable[[str], bool], *, count: int = 1, after: int = 0,
                 timeout_s: float = 600.0) -> str:
        """Block until ``count`` stderr lines (from line ``after`` on) satisfy ``pred`` (returns the ``count``-th);
        raises TimeoutError (with the log's tail) after ``timeout_s``, or RuntimeError if the process ends first."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                hits = [ln for ln in self.lines[after:] if pred(ln)]
                if len(hits) >= count:
                    return hits[count - 1]
                if self.proc.poll() is not None and not self._t_err.is_alive():
                    raise RuntimeError(f"process ended (exit {self.proc.returncode}) before the condition:\n"
                                       + self.log()[-4000:])
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no such line after {timeout_s} s:\n" + self.log()[-4000:])
                self._cond.wait(min(left, 1.0))

    def send(self, sig: int) -> None:
        """Send ``sig`` to the job's driver process only (as a supervisor stopping it does)."""
        self.proc.send_signal(sig)

    def kill_group(self) -> None:
        """SIGKILL the whole process group (driver, JVM, workers: a lost machine)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self, timeout_s: float = 600.0) -> int:
        """Wait for the process to exit (SIGKILL of the group after ``timeout_s``); returns its exit code."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill_group()
            self.proc.wait()
        self._t_err.join(10)
        self._t_out.join(10)
        _close_pipes(self.proc, self._t_out, self._t_err)
        return self.proc.returncode

    @property
    def stdout(self) -> str:
        return "".join(self._out)

    def log(self) -> str:
        with self._cond:
            return "\n".join(self.lines) + ("\n" + self.stdout if self.stdout else "")

    def __enter__(self) -> JobProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.kill_group()
        self.wait(60)
        self.kill_group()  # whatever of the group survived the driver (the JVM, python workers)


def _close_pipes(proc: subprocess.Popen, *readers: threading.Thread) -> None:
    """Close the child's stdout / stderr once nothing reads them any more (a reader still blocked, e.g. on a pipe a
    surviving grandchild holds open, keeps them: closing would wait for its read)."""
    if any(t.is_alive() for t in readers):
        return
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def run_job_process(args: Sequence[str], env: Mapping[str, str] | None = None, *,
                    kill_when: Callable[[str], bool] | None = None, kill_delay_s: float = 0.0,
                    echo: Callable[[str], None] | None = None, timeout_s: float = 1800.0,
                    cwd: str | None = None, on_line: Callable[[str], None] | None = None) -> JobProcessResult:
    """Run ``python -m pipeline <args>``; if ``kill_when(line)`` is true for a stderr line, SIGKILL the
    whole process group ``kill_delay_s`` seconds later. ``on_line`` sees every stderr line (phase markers
    included), e.g. to start an S3 outage at a phase."""
    full_env = _job_env(env)
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
    _close_pipes(proc, t_out)
    res.returncode = proc.returncode
    res.stdout = "".join(out_chunks)
    res.wall_s = time.time() - t0
    return res
