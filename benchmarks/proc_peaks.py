#!/usr/bin/env python3
"""Peak memory of every process of a command's process tree, named by what it is (JVM, Python worker, driver...).

    .venv/bin/python benchmarks/proc_peaks.py [--interval 0.1] [--out peaks.json] -- <command> [args...]

Samples ``/proc/<pid>/status`` (VmRSS, VmHWM) and ``cmdline`` of the command and all its descendants every
``--interval`` seconds until the command exits, then prints one line per process with its peak RSS (the larger
of the sampled maximum and VmHWM), sorted by peak, and the load average. Benchmarks that select "pyspark
processes" by their command line also match the **JVM** (its class path is ``.../pyspark/jars/*``): this tool
tells them apart (``role``: ``jvm``, ``python-worker`` (a PySpark daemon or a worker forked from it), ``python``,
``other``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["role_of", "tree", "main"]


def role_of(cmdline: str) -> str:
    """What a process is, from its command line."""
    exe = cmdline.split(" ", 1)[0]
    if exe.endswith("/java") or exe == "java":
        return "jvm"
    if "pyspark.daemon" in cmdline or "worker_daemon" in cmdline or "pyspark/worker.py" in cmdline:
        return "python-worker"
    if "python" in exe:
        return "python"
    return "other"


def tree(root: int) -> list[int]:
    """``root`` and its descendants (Linux /proc)."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                for line in (d / "status").read_text().splitlines():
                    if line.startswith("PPid:"):
                        parents[int(d.name)] = int(line.split()[1])
                        break
            except OSError:
                continue
    out = []
    for pid in parents:
        p, n = pid, 0
        while p in parents and p != root and n < 64:
            p, n = parents[p], n + 1
        if p == root:
            out.append(pid)
    return out


def _status(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for ln in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = ln.partition(":")
            if k in ("VmRSS", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


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
        for pid in tree(proc.pid):
            st = _status(pid)
            if not st:
                continue
            try:  # read every time: a launcher script (spark-submit) execs the JVM in the same process
                cl = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            rec = seen.setdefault(pid, {"pid": pid, "peak": 0})
            rec.update(cmdline=cl[:300], role=role_of(cl))
            rec["peak"] = max(rec["peak"], st.get("VmRSS", 0), st.get("VmHWM", 0))
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
