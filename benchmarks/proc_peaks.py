#!/usr/bin/env python3
"""Peak memory of every process of a command's process tree, named by what it is (JVM, Python worker, driver...).

    .venv/bin/python benchmarks/proc_peaks.py [--interval 0.1] [--out peaks.json] -- <command> [args...]

Samples ``/proc/<pid>/status`` (VmRSS, VmHWM) and ``cmdline`` of the command and all its descendants every
``--interval`` seconds until the command exits, then prints one line per process with its peak RSS (the larger
of the sampled maximum and VmHWM), sorted by peak, and the load average. Benchmarks that select "pyspark
processes" by their command line also match the **JVM** (its class path is ``.../pyspark/jars/*``): this tool
tells them apart (``role``, :func:`bench_common.process_role`: ``jvm``, ``python-worker`` (a PySpark daemon or a
worker forked from it), ``python``, ``other``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench_common import cmdline_of, descendants, process_role, status_bytes

__all__ = ["main"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--out", default="")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command")
    proc = subprocess.Popen(cmd)
    seen: dict[int, dict] = {}
    loads = []
    while proc.poll() is None:
        for pid in descendants(proc.pid) + [proc.pid]:
            cl = cmdline_of(pid)  # read every time: a launcher script (spark-submit) execs the JVM in the same process
            if not cl:
                continue
            rec = seen.setdefault(pid, {"pid": pid, "peak": 0})
            rec.update(cmdline=cl[:300], role=process_role(cl))
            rec["peak"] = max(rec["peak"], status_bytes(pid, "VmRSS"), status_bytes(pid, "VmHWM"))
        loads.append(os.getloadavg()[0])
        time.sleep(args.interval)
    rows = sorted(seen.values(), key=lambda r: -r["peak"])
    print(f"exit {proc.returncode}; load average during the run {min(loads, default=0):.1f}-{max(loads, default=0):.1f}")
    for r in rows:
        if r["peak"] >= 50 << 20:
            print(f"{r['peak'] / 2**20:8.0f} MiB  {r['role']:<13} pid {r['pid']:<7} {r['cmdline'][:140]}")
    if args.out:
        Path(args.out).write_text(json.dumps({"exit": proc.returncode, "load": [min(loads, default=0),
                                                                                 max(loads, default=0)],
                                              "processes": rows}, indent=1))
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
