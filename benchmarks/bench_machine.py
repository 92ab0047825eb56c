"""The shared machine, for the benchmarks: progress lines, waiting for a quiet CPU, the CPU of a process tree
and of everything else while it runs (foreign CPU), and running a command under that monitor."""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

HZ = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1


# ------------------------------------------------------------------------------------------------ output
def say(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------------------- CPU accounting
def _machine_busy_jiffies() -> int:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4]  # all but idle and iowait


def _proc_table() -> dict[int, tuple[int, str, int, int]]:
    """pid -> (ppid, comm, own cpu jiffies, reaped children's cpu jiffies)."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        lp, rp = s.find("("), s.rfind(")")
        rest = s[rp + 2:].split()
        out[int(d)] = (int(rest[1]), s[lp + 1:rp], int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14]))
    return out


def machine_busy_fraction(window_s: float) -> float:
    b0 = _machine_busy_jiffies()
    time.sleep(window_s)
    return (_machine_busy_jiffies() - b0) / (window_s * HZ * NCPU)


def wait_quiet(gate: float, max_wait: float, window_s: float = 3.0) -> dict:
    """Wait until the machine's busy share (all cores) over ``window_s`` drops below ``gate``."""
    t0 = time.time()
    worst, n = 0.0, 0
    while True:
        frac = machine_busy_fraction(window_s)
        n += 1
        worst = max(worst, frac)
        if frac < gate:
            return {"busy_before": round(frac, 3), "waited_s": round(time.time() - t0, 1), "quiet": True}
        if time.time() - t0 > max_wait:
            say(f"  machine still busy ({100 * frac:.0f}% of {NCPU} cores) after {max_wait:.0f}s: measuring anyway "
                "(the run will be marked disturbed if others take CPU during it)")
            return {"busy_before": round(frac, 3), "waited_s": round(time.time() - t0, 1), "quiet": False}
        if n == 1 or n % 10 == 0:
            say(f"  waiting for a quiet CPU: busy {100 * frac:.0f}% of {NCPU} cores (gate {100 * gate:.0f}%)")


class TreeMonitor(threading.Thread):
    """Samples the CPU of a process tree and of the whole machine while the tree runs.

    Own CPU = the tree's processes' user+system time (maximum seen per pid, so exited workers still count),
    plus, for JVMs, the CPU of children they reaped without us seeing them (short-lived helpers), minus
    tree members the JVM reaped after we had seen them (no double counting). Foreign CPU = machine busy
    time - own CPU - this benchmark process's own CPU, as a share of all cores. ``services``: long-running
    processes that serve the measured run (the moto S3 server of ``--s3``): their CPU during the run counts
    as own CPU (kind ``moto s3``), not as foreign.
    """

    def __init__(self, pid: int, interval: float = 0.5, services: Sequence[int] = ()) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.services = set(services)
        procs = _proc_table()
        self.service_base = {p: procs[p][2] for p in self.services if p in procs}  # CPU before the run
        self.own: dict[int, int] = {}            # pid -> max own jiffies
        self.reaped: dict[int, int] = {}         # java pid -> max cutime+cstime
        self.last: dict[int, tuple[int, int]] = {}   # pid -> (ppid, own+children) last seen
        self.comm: dict[int, str] = {}
        self.stop_ev = threading.Event()
        self.b0 = _machine_busy_jiffies()
        self.me0 = sum(os.times()[:2])
        self.t0 = time.time()
        self.samples: list[tuple[float, float]] = []  # (t, foreign fraction in the interval)
        self._prev = (self.t0, self.b0, 0)

    def sample(self) -> None:
        procs = _proc_table()
        tree, frontier = set(), {self.pid} | self.services
        children: dict[int, list[int]] = {}
        for p, (pp, *_rest) in procs.items():
            children.setdefault(pp, []).append(p)
        while frontier:
            tree |= frontier
            frontier = {c for p in frontier for c in children.get(p, ()) if c not in tree}
        for p in tree & procs.keys():
            pp, comm, own, kids = procs[p]
            self.own[p] = max(self.own.get(p, 0), own)
            self.comm[p] = comm
            if comm == "java":
                self.reaped[p] = max(self.reaped.get(p, 0), kids)
            self.last[p] = (pp, own + kids)
        now, busy = time.time(), _machine_busy_jiffies()
        ours = self.ours()
        t_prev, b_prev, o_prev = self._prev
        if now > t_prev:
            self.samples.append((now - self.t0, max(0.0, (busy - b_prev) - (ours - o_prev)) / ((now - t_prev) * HZ * NCPU)))
        self._prev = (now, busy, ours)

    def ours(self) -> int:
        total = sum(self.own.values()) + sum(self.reaped.values()) - sum(self.service_base.values())
        # tree members seen alive whose parent is a JVM and that are gone: their CPU is in the JVM's
        # reaped-children counter too
        for p, (pp, cpu) in self.last.items():
            if pp in self.reaped and not os.path.exists(f"/proc/{p}"):
                total -= cpu
        return max(total, 0)

    def by_kind(self) -> dict[str, float]:
        """Own CPU seconds by process kind: jvm, python driver (the tree's root), python workers, other."""
        out: dict[str, float] = {}
        for p, j in self.own.items():
            comm = self.comm.get(p, "?")
            kind = "jvm" if comm == "java" else ("driver" if p == self.pid else
                                                  ("python workers" if comm.startswith("python") else "other"))
            if p in self.services:
                kind, j = "moto s3", j - self.service_base.get(p, 0)
            out[kind] = out.get(kind, 0) + j / HZ
        out["jvm helpers (reaped)"] = max(0.0, (sum(self.reaped.values()) - sum(
            cpu for p, (pp, cpu) in self.last.items() if pp in self.reaped and not os.path.exists(f"/proc/{p}")))) / HZ
        return {k: round(v, 1) for k, v in out.items()}

    def run(self) -> None:
        while not self.stop_ev.wait(self.interval):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - monitoring must never break a run
                pass

    def finish(self) -> dict:
        self.stop_ev.set()
        self.join()
        wall = time.time() - self.t0
        me = (sum(os.times()[:2]) - self.me0) * HZ
        busy = _machine_busy_jiffies() - self.b0
        ours = self.ours()
        foreign = max(0.0, busy - ours - me)
        peak = max((f for _, f in self.samples), default=0.0)
        return {"own_cpu_s": round(ours / HZ, 1), "foreign_cpu_pct": round(100 * foreign / (wall * HZ * NCPU), 1),
                "foreign_peak_pct": round(100 * peak, 1), "cpu_by_kind_s": self.by_kind()}


@dataclass
class ProcResult:
    returncode: int
    stdout: str
    stderr: list[str]
    wall_s: float
    cpu: dict
    marks: dict[str, float] = field(default_factory=dict)  # stderr marker -> seconds since start


def run_monitored(cmd: Sequence[str], env: dict[str, str], *, label: str, echo: Callable[[str], bool] | None = None,
                  timeout_s: float = 7200, cwd: str | None = None, services: Sequence[int] = ()) -> ProcResult:
    """Run ``cmd`` in its own session, stream selected stderr lines as progress, sample CPU."""
    t0 = time.time()
    p = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True, cwd=cwd)
    mon = TreeMonitor(p.pid, services=services)
    mon.start()
    out: list[str] = []
    t_out = threading.Thread(target=lambda: out.append(p.stdout.read()), daemon=True)  # type: ignore[union-attr]
    t_out.start()
    killer = threading.Timer(timeout_s, lambda: _killpg(p.pid))
    killer.daemon = True
    killer.start()
    err: list[str] = []
    marks: dict[str, float] = {}
    assert p.stderr is not None
    for line in p.stderr:
        line = line.rstrip("\n")
        err.append(line)
        if line.startswith("BENCH_"):
            marks[line.split()[0]] = time.time() - t0
        if echo is not None and echo(line):
            print(f"   {label} | {line}", flush=True)
    p.wait()
    killer.cancel()
    t_out.join(30)
    wall = time.time() - t0
    cpu = mon.finish()
    _killpg(p.pid)  # nothing of the group may survive (JVM, Python workers)
    return ProcResult(p.returncode, "".join(out), err, wall, cpu, marks)


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
