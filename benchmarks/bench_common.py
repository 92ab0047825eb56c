"""Helpers shared by the benchmarks (imported as a sibling module: the benchmarks run as scripts)."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = ["tree_cpu_s", "write_oneshot"]


def tree_cpu_s() -> float:
    """CPU seconds of this process and every live descendant (JVM, Python daemon and workers), each with its
    reaped children's: the work done, whatever other processes on the machine take."""
    hz = os.sysconf("SC_CLK_TCK")
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            rest = st[st.rfind(")") + 2:].split()
            procs[int(d)] = (int(rest[1]), sum(int(x) for x in rest[11:15]))
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
    from pipeline.batch.bootstrap import plan_bootstrap
    from pipeline.batch.plan import evaluate
    from pipeline.batch.prefix import Prefix, barrier_log
    plan, _ = plan_bootstrap(r)
    tuples = {s: {int(p): (pos.seq, pos.row) for p, pos in parts.items()} for s, parts in plan.barriers.items()}
    res = evaluate(r, r.job, Prefix(plan.epoch, int(r.config.epoch_seconds), tuples,
                                    barrier_log(r.ckpt_fio, r.job_root, plan.epoch)))
    rows = {}
    for obj, df in sorted(res.objects().items()):
        path = out_dir / obj
        df.write.mode("overwrite").parquet(str(path))
        rows[obj] = r.spark.read.parquet(str(path)).count()
    res.release()
    return plan.epoch, rows
