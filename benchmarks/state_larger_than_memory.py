#!/usr/bin/env python3
"""State larger than memory: a join whose state is several times the memory a Python worker may use.

    .venv/bin/python benchmarks/state_larger_than_memory.py --limit-mib 600 --epochs 10 --probes 300000
    .venv/bin/python benchmarks/state_larger_than_memory.py --backends rocksdb ...   # one backend only

The job (of this benchmark's own making): ``probes(probe_id, site, payload)`` join ``acks(ack_id, probe_id)`` on
``probe_id`` (inner, TTL longer than the run) -> sink. Every epoch brings ``--probes`` new probes with a
``--payload``-byte payload; only ``--ack-every``-th probe is ever acknowledged (in the same or the next epoch), so the
join's left state grows by about ``--probes`` rows per epoch and is never released (the state that grows in a
real join: never-matched rows).

**The memory limit is enforced**: a watchdog samples the resident set (VmRSS) of every Python process of Spark in
the run (the executors' daemon and the workers it forks) every 100 ms and SIGKILLs one above ``--limit-mib`` (as a
container's OOM killer would); Spark then fails the task, the round and the run. The JVM is not a Python worker:
its peak is reported apart and not limited (``-Xmx`` bounds it). The figure reported per backend: completed or
not, peak RSS of each Python worker (VmHWM, and the watchdog's maximum) and how it splits at its peak (anonymous /
file-backed; private / shared with the daemon it was forked from, and PSS), the daemon's and the JVM's peaks, the
load average during the run, the state's size in memory (Arrow bytes of the final state) and on storage, and an
exactly-once check of the sink against an oracle (every acknowledged probe exactly once, nothing else). Each
backend runs in a fresh process; the executors' settings (``PIPELINE_STATE_*``) come from the environment.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bench_common import proc_kb_fields, process_tree

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2024, 2, 1, tzinfo=UTC)
EPOCH_S = 60


def _schemas():
    import pyarrow as pa
    ts = pa.timestamp("us", tz="UTC")
    probes = pa.schema([("probe_id", pa.string()), ("site", pa.int64()), ("payload", pa.string()), ("_ingest_ts", ts)])
    acks = pa.schema([("ack_id", pa.string()), ("probe_id", pa.string()), ("_ingest_ts", ts)])
    return probes, acks


def _job():
    from pipeline.job import Job
    probes, acks = _schemas()
    job = Job("probe_acks", max_parallelism=32)
    p = job.source("probes", probes, key="probe_id")
    a = job.source("acks", acks, key="probe_id")
    p.join(a, on="probe_id", uid="probe_ack", ttl_seconds=10 * 365 * 86400).sink("acked")
    return job


def generate(src: Path, epochs: int, probes: int, payload: int, ack_every: int) -> set[tuple[str, str]]:
    """The sources; returns the oracle: every (probe_id, ack_id) pair the join must emit exactly once."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    ps, as_ = _schemas()
    oracle: set[tuple[str, str]] = set()
    pad = "x" * payload
    half = probes // 2
    for e in range(epochs):
        start = T0 + timedelta(seconds=e * EPOCH_S)
        for part in range(2):
            ids = [f"p{e:03d}-{part}-{i:08d}" for i in range(half)]
            ts = [start + timedelta(seconds=EPOCH_S * i / half) for i in range(half)]
            d = src / "probes" / f"partition={part}"
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"probe_id": ids, "site": [i % 977 for i in range(half)],
                                     "payload": [pad] * half, "_ingest_ts": ts}, schema=ps), d / f"{e:08d}.parquet")
            # acks of every ack_every-th probe: half of them in the same epoch, half in the next one
            acked = [(f"p{e:03d}-{part}-{i:08d}", f"a{e:03d}-{part}-{i:08d}") for i in range(0, half, ack_every)]
            now = [x for j, x in enumerate(acked) if j % 2 == 0 or e == epochs - 1]
            later = [x for j, x in enumerate(acked) if j % 2 == 1 and e < epochs - 1]
            rows = now + [(p, a) for (p, a) in _carry.get(part, [])]
            _carry[part] = later
            oracle.update(rows)
            d = src / "acks" / f"partition={part}"
            d.mkdir(parents=True, exist_ok=True)
            n = len(rows)
            pq.write_table(pa.table({"ack_id": [a for _, a in rows], "probe_id": [p for p, _ in rows],
                                     "_ingest_ts": [start + timedelta(seconds=EPOCH_S * i / max(1, n))
                                                    for i in range(n)]}, schema=as_), d / f"{e:08d}.parquet")
    return oracle


_carry: dict[int, list[tuple[str, str]]] = {}


def _argv(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return []


def role_of(argv: list[bytes], parent_argv: list[bytes]) -> str | None:
    """What a process of the run is: ``jvm`` (Spark's JVM), ``daemon`` (the executors' Python daemon: PySpark's
    or :mod:`pipeline.runtime.spark.worker_daemon`), ``worker`` (a Python worker: forked by the daemon, or started by
    the JVM without one), or None (not Spark's). The memory limit applies to the Python processes only: the JVM
    has its own bound (``-Xmx``). (Before 2026-11-26 the watchdog matched every process whose command line
    contained "pyspark", the JVM's class path included, so the JVM was counted, and killed, as a worker.)"""
    if not argv:
        return None
    exe = os.path.basename(argv[0])
    line = b" ".join(argv)
    if exe == b"java":
        return "jvm" if b"pyspark" in line else None
    if b"python" not in exe or not (b"pyspark" in line or b"worker_daemon" in line):
        return None
    module = argv[argv.index(b"-m") + 1] if b"-m" in argv[:-1] else b""
    parent_is_jvm = bool(parent_argv) and os.path.basename(parent_argv[0]) == b"java"
    return "daemon" if parent_is_jvm and b"daemon" in module else "worker"


def _status(pid: int) -> dict[str, int]:
    """The memory fields of ``/proc/<pid>/status`` in bytes (VmRSS, VmHWM, RssAnon, RssFile, RssShmem)."""
    return proc_kb_fields(pid, "status", ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"))


def smaps_rollup(pid: int) -> dict[str, int]:
    """Pss and the private (not shared with the daemon it was forked from) bytes of a process."""
    return proc_kb_fields(pid, "smaps_rollup", ("Pss", "Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty"))


class Watchdog(threading.Thread):
    """Kills any Python process of Spark in this run (daemon or worker) whose VmRSS exceeds the limit; remembers
    every process's peak (the JVM's too, reported apart) and, at each worker's peak, how its resident set splits
    (anonymous / file-backed, private / shared with the daemon)."""

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(daemon=True)
        self.limit, self.max_rss, self.killed = limit_bytes, 0, 0
        self.procs: dict[int, dict] = {}
        self.loads: list[float] = []
        self._halt = threading.Event()

    def run(self) -> None:
        me, tick = os.getpid(), 0
        while not self._halt.wait(0.1):
            tick += 1
            if tick % 10 == 0:
                self.loads.append(os.getloadavg()[0])
            for pid, ppid in process_tree(me).items():
                info = self.procs.get(pid)
                if info is None:
                    role = role_of(_argv(pid), _argv(ppid))
                    if role is None:
                        continue
                    info = self.procs[pid] = {"pid": pid, "role": role, "peak_rss": 0, "hwm": 0}
                st = _status(pid)
                rss = st.get("VmRSS", 0)
                info["hwm"] = max(info["hwm"], st.get("VmHWM", 0))
                if rss > info["peak_rss"]:
                    if info["role"] != "jvm" and rss > info.get("_rollup_at", 0) + (16 << 20):
                        info.update(smaps_rollup(pid), _rollup_at=rss)
                    info.update(peak_rss=rss, anon=st.get("RssAnon", 0), file=st.get("RssFile", 0))
                if info["role"] == "jvm":
                    continue
                self.max_rss = max(self.max_rss, rss)
                if rss > self.limit:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        self.killed += 1
                        info["killed"] = True
                    except OSError:
                        pass

    def stop(self) -> None:
        self._halt.set()

    def report(self) -> dict:
        procs = [{k: v for k, v in p.items() if not k.startswith("_")} for p in self.procs.values()]
        py = [p for p in procs if p["role"] != "jvm"]
        return {"workers_peak_rss": sorted((max(p["peak_rss"], p["hwm"]) for p in py if p["role"] == "worker"),
                                           reverse=True),
                "daemon_peak_rss": max((max(p["peak_rss"], p["hwm"]) for p in py if p["role"] == "daemon"),
                                       default=0),
                "jvm_peak_rss": max((max(p["peak_rss"], p["hwm"]) for p in procs if p["role"] == "jvm"), default=0),
                "processes": sorted(procs, key=lambda p: -max(p["peak_rss"], p["hwm"])),
                "watchdog_max_rss": self.max_rss, "workers_killed": self.killed,
                "load": [min(self.loads, default=0.0), max(self.loads, default=0.0)]}


def child(args) -> None:
    import pyarrow.parquet as pq

    from pipeline.config import load_config
    from pipeline.runtime.driver.cursor import cursor_from_metadata
    from pipeline.runtime.driver.runner import JobRunner
    root = Path(args.work)
    mode = args.mode
    cfg = load_config(env={}, source_uri=(root / "src").as_uri(), checkpoint_uri=(root / mode / "ckpt").as_uri(),
                      sink_uri=(root / mode / "sink").as_uri(), parallelism=2, epoch_seconds=EPOCH_S,
                      state_backend=mode, retained_checkpoints=2,
                      clock_now=(T0 + timedelta(seconds=EPOCH_S * (args.epochs + 2))).isoformat())
    dog = Watchdog(args.limit_mib << 20)
    dog.start()
    r = JobRunner(_job(), cfg, echo=lambda m: print(f"  [{mode}] {m}", flush=True))
    t0 = time.perf_counter()
    out: dict = {"backend": mode, "completed": False}
    try:
        rep = r.run(args.epochs)
        out["completed"] = len(rep.completed) == args.epochs
        out["epoch_s"] = [round(x.duration_s, 2) for x in rep.completed]
    except Exception as e:  # noqa: BLE001 - the figure is whether it completes
        out["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    dog.stop()
    out.update(dog.report())
    latest = r.coordinator.store.latest()
    if latest is not None:
        md = latest.metadata
        out["epoch"] = md.epoch
        handles = [h for hs in cursor_from_metadata(md).handles.get("probe_ack", {}).values() for h in hs if h.file]
        out["state_rows"] = sum(h.rows for h in handles)
        out["state_storage_bytes"] = sum(h.bytes for h in handles)
        if out["completed"]:
            r.export("acked", str(root / mode / "export"))
            t = pq.read_table(root / mode / "export").select(["probe_id", "ack_id"])
            got = list(zip(t["probe_id"].to_pylist(), t["ack_id"].to_pylist()))
            oracle = {tuple(x) for x in json.loads((root / "oracle.json").read_text())}
            out["exactly_once"] = len(got) == len(set(got)) and set(got) == oracle
            out["output_rows"] = len(got)
    Path(args.out).write_text(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--probes", type=int, default=300_000, help="new probes per epoch (both partitions)")
    ap.add_argument("--payload", type=int, default=200, help="payload bytes per probe")
    ap.add_argument("--ack-every", type=int, default=50)
    ap.add_argument("--limit-mib", type=int, default=600, help="RSS limit of each Python worker (enforced)")
    ap.add_argument("--backends", default="heap,rocksdb")
    ap.add_argument("--work", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("_child", nargs="?")
    ap.add_argument("--mode", default="")
    args = ap.parse_args()
    if args._child == "_child":
        child(args)
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="state-ltm-"))
    if not (work / "oracle.json").exists():
        oracle = generate(work / "src", args.epochs, args.probes, args.payload, args.ack_every)
        (work / "oracle.json").write_text(json.dumps(sorted(oracle)))
    state_mem = args.epochs * args.probes * (args.payload + 8 + 8 + 8 + 4 + 22 + 1 + 8)  # Arrow bytes, approx.
    print(f"{args.epochs} epochs x {args.probes} probes ({args.payload} B payload): join state ~{state_mem / 2**20:.0f} "
          f"MiB in Arrow, {state_mem / 2 / 2**20:.0f} MiB per subtask; worker limit {args.limit_mib} MiB "
          f"(load {os.getloadavg()[0]:.1f})", flush=True)
    results = {}
    for mode in args.backends.split(","):
        out = work / f"{mode}.json"
        shutil.rmtree(work / mode, ignore_errors=True)  # a fresh job (the sources and the oracle are reused)
        out.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": str(REPO), "PIPELINE_STATE_CACHE_DIR": str(work / mode / "cache"),
               "PIPELINE_STATE_CACHE_MAX_BYTES": "0"}
        subprocess.run([sys.executable, __file__, "_child", "--mode", mode, "--epochs", str(args.epochs),
                        "--work", str(work), "--out", str(out), "--limit-mib", str(args.limit_mib)], env=env,
                       check=False)
        res = json.loads(out.read_text()) if out.exists() else {"backend": mode, "completed": False}
        results[mode] = res
        mib = [f"{b / 2**20:.0f}" for b in res.get("workers_peak_rss") or []]
        for proc in res.get("processes") or []:
            split = (f" (anon {proc.get('anon', 0) / 2**20:.0f}, file {proc.get('file', 0) / 2**20:.0f}; "
                     f"private {(proc.get('Private_Clean', 0) + proc.get('Private_Dirty', 0)) / 2**20:.0f}, "
                     f"pss {proc.get('Pss', 0) / 2**20:.0f} MiB at a peak)") if proc["role"] != "jvm" else ""
            print(f"  {proc['role']:<6} pid {proc['pid']}: peak RSS {max(proc['peak_rss'], proc['hwm']) / 2**20:.0f} MiB"
                  f"{split}{' KILLED' if proc.get('killed') else ''}", flush=True)
        print(f"{mode}: completed={res.get('completed')} epochs={res.get('epoch')} wall={res.get('wall_s')} s "
              f"exactly_once={res.get('exactly_once')} output_rows={res.get('output_rows')} "
              f"state_rows={res.get('state_rows')} state_on_storage={res.get('state_storage_bytes', 0) / 2**20:.0f} MiB "
              f"workers_peak_rss=[{', '.join(mib)}] MiB daemon={res.get('daemon_peak_rss', 0) / 2**20:.0f} MiB "
              f"jvm={res.get('jvm_peak_rss', 0) / 2**20:.0f} MiB killed={res.get('workers_killed')} "
              f"median_epoch_s={sorted(res.get('epoch_s') or [0])[len(res.get('epoch_s') or [0]) // 2]} "
              f"{res.get('error', '')} (load {res.get('load', [0, 0])[0]:.1f}-{res.get('load', [0, 0])[1]:.1f})",
              flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
