"""Helpers shared by the benchmarks (imported as a sibling module: the benchmarks run as scripts)."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["tree_cpu_s", "write_oneshot", "process_role", "descendants", "cmdline_of", "status_bytes",
           "peak_rss_by_role"]


def proc_stats() -> dict[int, tuple[int, int]]:
    """Every live process (Linux /proc; {} elsewhere): pid -> (parent pid, CPU ticks of it and its reaped
    children: utime + stime + cutime + cstime)."""
    procs = {}
    for d in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            rest = st[st.rfind(")") + 2:].split()
            procs[int(d)] = (int(rest[1]), sum(int(x) for x in rest[11:15]))
    return procs


def tree_cpu_s() -> float:
    """CPU seconds of this process and every live descendant (JVM, Python daemon and workers), each with its
    reaped children's: the work done, whatever other processes on the machine take."""
    hz = os.sysconf("SC_CLK_TCK")
    procs = proc_stats()
    mine, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        mine.add(pid)
        todo.extend(c for c, (pp, _) in procs.items() if pp == pid and c not in mine)
    return sum(procs[p][1] for p in mine if p in procs) / hz


def write_oneshot(r, out_dir: Path) -> tuple[int, dict[str, int]]:
    """The one-shot recompute: the job's batch plan (``pipeline.batch``) over its whole history up to the live
    epoch, every sink table and state object written as Parquet under ``out_dir``. Returns the epoch and the
    rows written per object."""
    from pipeline.batch.bootstrap.plan import plan_bootstrap
    from pipeline.batch.evaluation.plan import evaluate
    from pipeline.batch.evaluation.prefix import Prefix, barrier_log, scan_settings
    plan, _ = plan_bootstrap(r)
    tuples = {s: {int(p): (pos.seq, pos.row) for p, pos in parts.items()} for s, parts in plan.barriers.items()}
    res = evaluate(r, r.job, Prefix(plan.epoch, int(r.config.epoch_seconds), tuples,
                                    barrier_log(r.ckpt_fio, r.job_root, plan.epoch)))
    rows = {}
    with scan_settings(r.spark, plan.parallelism):   # as `epochal bootstrap` / `epochal batch` read the sources
        for obj, df in sorted(res.objects().items()):
            path = out_dir / obj
            df.write.mode("overwrite").parquet(str(path))
            rows[obj] = r.spark.read.parquet(str(path)).count()
    res.release()
    return plan.epoch, rows


def process_role(cmdline: str) -> str:
    """What a process of a Spark run is, from its command line: ``jvm`` (the driver JVM: its class path is
    ``.../pyspark/jars/*``, so a test for "pyspark" in the command line matches it too), ``python-worker``
    (PySpark's daemon or a worker forked from it: ``-m pyspark.daemon`` / ``-m pipeline.runtime.spark.worker_daemon
    pyspark.worker``), ``python`` (the driver, moto, ...), ``other``."""
    exe = cmdline.split(" ", 1)[0]
    if exe.endswith("/java") or exe == "java":
        return "jvm"
    if "python" in exe.rsplit("/", 1)[-1] and ("pyspark.daemon" in cmdline or "worker_daemon" in cmdline
                                                or "pyspark.worker" in cmdline):
        return "python-worker"
    if "python" in exe.rsplit("/", 1)[-1]:
        return "python"
    return "other"


def descendants(root: int) -> list[int]:
    """The live descendants of ``root`` (Linux /proc; [] elsewhere)."""
    return list(process_tree(root))


def process_tree(root: int) -> dict[int, int]:
    """pid -> parent pid of every live process below ``root`` (Linux /proc; {} elsewhere)."""
    parents = {pid: ppid for pid, (ppid, _) in proc_stats().items()}
    out = {}
    for pid in parents:
        p, n = pid, 0
        while p in parents and p != root and n < 64:
            p, n = parents[p], n + 1
        if p == root and pid != root:
            out[pid] = parents[pid]
    return out


def cmdline_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def proc_kb_fields(pid: int, name: str, fields: tuple[str, ...]) -> dict[str, int]:
    """The ``<field>: <n> kB`` lines of ``/proc/<pid>/<name>`` (``status``, ``smaps_rollup``) among ``fields``, in
    bytes; {} if the process is gone."""
    out: dict[str, int] = {}
    try:
        for ln in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            k, _, v = ln.partition(":")
            if k in fields:
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def status_bytes(pid: int, field: str) -> int:
    """``VmRSS`` / ``VmHWM`` (bytes) of ``pid``; 0 if it is gone."""
    return proc_kb_fields(pid, "status", (field,)).get(field, 0)


def peak_rss_by_role(root: int) -> dict[str, list[int]]:
    """VmHWM (bytes) of every live descendant of ``root``, by :func:`process_role`, largest first."""
    out: dict[str, list[int]] = {}
    for pid in descendants(root):
        out.setdefault(process_role(cmdline_of(pid)), []).append(status_bytes(pid, "VmHWM"))
    return {k: sorted(v, reverse=True) for k, v in out.items()}
