"""Profile: where the batch evaluation of a validation spends its time, step by step (prints figures; not a test)

    .venv/bin/python benchmarks/validate_steps.py --root /tmp/vb     # data prepared by validate_bench.py

Runs in one process, on the newest checkpoint of ``orders_payments`` under ``--root`` (prepare it with
``benchmarks/validate_bench.py --root DIR``): Spark start, the plan's compilation, then every frame the plan
caches (sources, ranked ``unique`` join sides, join outputs read twice) one by one, a count of every object, and
the executor-side summaries the recovery suites compare (``BatchPlan.materialize``) - each with its wall time,
the CPU time of the whole process tree (JVM and Python workers) and the load average. The steps run one after
the other, so each one's figure is what it adds on top of the cached frames before it.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

from bench_common import tree_cpu_s
from validate_bench import _config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="directory prepared by validate_bench.py")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--explain", action="store_true", help="print the physical plan of every object first")
    a = ap.parse_args(argv)
    from pipeline.jobs import get_job
    from pipeline.quality.jobspec import job_objects
    from pipeline.quality.recovery import plan_recomputation
    from pipeline.runtime.driver.runner import JobRunner

    def step(name, fn):
        c, t = tree_cpu_s(), time.perf_counter()
        out = fn()
        print(f"{name:<45} wall {time.perf_counter() - t:6.1f} s   cpu {tree_cpu_s() - c:6.1f} s   "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
        return out

    r = JobRunner(get_job("orders_payments"), _config(Path(a.root).resolve(), parallelism=a.parallelism),
                  echo=lambda m: None)
    md = r.coordinator.store.latest().metadata
    step("spark session", lambda: r.spark)
    objs = job_objects(r.job, r.config.state_ttl_seconds)
    plan = step("compile", lambda: plan_recomputation(r, md, set(objs.specs)))
    if a.explain:
        for o, df in plan.result.objects().items():
            print(f"== physical plan of {o}")
            df.explain()
    for i, df in enumerate(list(plan.result.cached)):
        step(f"cached frame {i} ({len(df.columns)} columns)", df.count)
    for o, df in plan.result.objects().items():
        step(f"count {o}", df.count)
    specs = {o: dataclasses.replace(s, columns=plan.columns[o]) if o in plan.columns else s
             for o, s in objs.specs.items()}
    rec = step("summaries on the executors (materialize)", lambda: plan.materialize(specs, int(md.max_parallelism)))
    plan.release()
    print("expected rows:", rec.stats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
