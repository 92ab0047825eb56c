"""Nexmark runner: generate events, run each query with the CLI while SIGKILLing it, compare the committed
output exactly with the DuckDB reference, measure events/s, print a table.

    python -m benchmarks.nexmark.run [--events N] [--queries q0,q3,...] [--kills K] [--json]
                                     [--markdown FILE] [--s3] [--peer] [--steady] [--read export|direct]

Per query:

1. ``job()`` of ``benchmarks.nexmark.queries.qN``; :class:`NotExpressible` -> "not expressible yet: <what>";
2. exactness: ``python -m pipeline run --job benchmarks.nexmark.queries.qN:job --epochs k`` (k = the input's
   epochs / (K + 1), so kills land in different epochs) in its own process group, killed K times at random
   moments (a kill point inside the process - reading, writing state, between state and ``_metadata``, between
   ``_metadata`` and the sink commit, after the commit - or an external SIGKILL of the group a random delay after
   the first read), resumed until every epoch is done; then the committed rows of the sink table
   (``python -m pipeline export``, or read in this process with ``--read direct``) are compared with the
   reference as multisets of rows (timestamps as microseconds, decimals and floats rounded to 6 places);
3. throughput (unless ``--no-measure``): one clean run of the query from scratch with the default settings;
   events/s = source records read / the rounds' processing time (JVM start excluded), per core = / the cores
   of ``local[*]``;
4. with ``--peer``: the same query on Spark Structured Streaming (:mod:`benchmarks.nexmark.peer`) where it can
   express it, in a fresh JVM, its row count checked against the reference;
5. with ``--steady``: the steady state (:func:`measure_steady`): one epoch per round in one warm process, events/s
   and the latency per checkpoint (p50 / p95).

A run that fails (not killed) is reported with its last error line: a shape the engine refuses shows here as
"refused: <message>".
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks.nexmark.generator import NexmarkConfig, write_sources
from benchmarks.nexmark.queries import QUERIES, NotExpressible

REPO = Path(__file__).resolve().parents[2]
KILL_POINTS = ("reading", "writing_state", "after_state_before_metadata", "after_metadata_before_commit",
               "after_commit")


def log(msg: str) -> None:
    print(time.strftime("%H:%M:%S"), msg, file=sys.stderr, flush=True)


@dataclass
class QueryResult:
    query: str
    status: str                       # "exact" | "NOT exact" | "not expressible yet" | "failed"
    detail: str = ""
    runs: int = 0
    kills_landed: int = 0
    kill_moments: list = field(default_factory=list)
    reference_rows: int = 0
    output_rows: int = 0
    events: int = 0
    seconds: float | None = None      # rounds' processing time of the clean run
    events_per_s: float | None = None
    events_per_s_per_core: float | None = None
    wall_s: float | None = None       # whole clean run, JVM start included
    peer_events_per_s: float | None = None
    peer_detail: str = ""
    # --steady: one epoch per round in one warm process (as when epochs arrive one at a time)
    steady_events_per_s: float | None = None
    steady_latency_ms_p50: float | None = None   # per checkpoint: the round's processing + its checkpoint
    steady_latency_ms_p95: float | None = None


# --- comparing -------------------------------------------------------------------------------------------------
def _norm_value(v: Any) -> Any:
    if isinstance(v, (float, Decimal)):
        return round(float(v), 6)
    return v


def normalise(t: pa.Table, columns: list[str]) -> Counter:
    """Multiset of rows: timestamps as int microseconds since the epoch (UTC), decimals and floats rounded."""
    cols = []
    for c in columns:
        a = t[c]
        if pa.types.is_timestamp(a.type):
            a = a.cast(pa.timestamp("us", tz="UTC") if a.type.tz else pa.timestamp("us")).cast(pa.int64())
        cols.append(a.to_pylist())
    return Counter(tuple(_norm_value(v) for v in row) for row in zip(*cols))


def compare(got: pa.Table, expected: pa.Table) -> tuple[bool, str]:
    if got.num_rows == 0 and expected.num_rows == 0:  # a sink table never written has no columns
        return True, ""
    gc, ec = sorted(got.column_names), sorted(expected.column_names)
    if gc != ec:
        return False, f"columns differ: output {got.column_names}, reference {expected.column_names}"
    cols = expected.column_names
    g, e = normalise(got, cols), normalise(expected, cols)
    if g == e:
        return True, ""
    missing, extra = e - g, g - e
    dup = sum(n for r, n in (g - e).items() if r in e)
    ex = next(iter(missing or extra))
    return False, (f"missing {sum(missing.values())}, extra {sum(extra.values())} (of which duplicates {dup}); "
                   f"e.g. {'missing' if missing else 'extra'} {dict(zip(cols, ex))}")


# --- running ---------------------------------------------------------------------------------------------------
def _job_ref(q: str) -> str:
    return f"benchmarks.nexmark.queries.{q}:job"


def _env(roots: dict[str, str], epoch_seconds: int, parallelism: int, extra: dict[str, str]) -> dict[str, str]:
    return {"PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "PIPELINE_SOURCE_URI": roots["src"], "PIPELINE_CHECKPOINT_URI": roots["ckpt"],
            "PIPELINE_SINK_URI": roots["sink"], "PIPELINE_EPOCH_SECONDS": str(epoch_seconds),
            "PIPELINE_PARALLELISM": str(parallelism), **extra}


def _tail(lines: list[str]) -> str:
    useful = [ln for ln in lines if ln.strip() and not ln.startswith("EPOCHAL_PHASE") and "WARN" not in ln[:40]]
    return useful[-1] if useful else "(no output)"


def run_with_kills(q: str, env: dict[str, str], epochs: int, kills: int, rng: random.Random,
                   res: QueryResult) -> str | None:
    """Runs the query to the end of its input with ``kills`` SIGKILLs on the way; None or the failure."""
    from pipeline.testing.jobproc import run_job_process
    per_run = max(1, math.ceil(epochs / (kills + 1)))
    attempts = 0
    while res.kills_landed < kills and attempts < 4 * kills + 2:
        attempts += 1
        kw: dict = {}
        run_env = dict(env)
        if rng.random() < 0.5:
            point = rng.choice(KILL_POINTS)
            n = rng.randint(1, 2)
            run_env["EPOCHAL_KILL_AT"] = f"{point}:{n}"
            moment = f"at {point} #{n}"
        else:
            delay = rng.uniform(0.0, 4.0)
            kw = {"kill_when": lambda line: line == "EPOCHAL_PHASE reading", "kill_delay_s": delay}
            moment = f"{delay:.1f}s after the first read"
        r = run_job_process(["run", "--job", _job_ref(q), "--epochs", str(per_run), "--json"], run_env,
                            timeout_s=1800, cwd=str(REPO), **kw)
        res.runs += 1
        if r.returncode == -9:
            res.kills_landed += 1
            res.kill_moments.append(moment)
            log(f"  {q}: run {res.runs} SIGKILLed {moment} after {r.wall_s:.1f}s")
        elif r.returncode == 0:
            done = json.loads(r.stdout).get("epochs_completed", [])
            log(f"  {q}: run {res.runs} completed {len(done)} epoch(s) in {r.wall_s:.1f}s (kill {moment} did not land)")
            if not done:  # the input is consumed: no kill can land any more
                break
        else:
            return f"run failed (exit {r.returncode}): {_tail(r.stderr_lines)}"
    r = run_job_process(["run", "--job", _job_ref(q)], env, timeout_s=3600, cwd=str(REPO))
    res.runs += 1
    if r.returncode != 0:
        return f"run failed (exit {r.returncode}): {_tail(r.stderr_lines)}"
    log(f"  {q}: final run completed in {r.wall_s:.1f}s")
    return None


def read_committed(q: str, table: str, env: dict[str, str], how: str, out_dir: Path) -> pa.Table:
    if how == "direct":  # the rows export would write, read in this process (no Spark)
        from pipeline.config import load_config
        from pipeline.jobs import get_job
        from pipeline.runtime.driver.runner import JobRunner
        runner = JobRunner(get_job(_job_ref(q)), load_config(env={**os.environ, **env}), echo=lambda m: None)
        return runner.ctx.table(table).read()
    from pipeline.testing.jobproc import run_job_process
    shutil.rmtree(out_dir, ignore_errors=True)
    r = run_job_process(["export", "--job", _job_ref(q), "--table", table, "--to", str(out_dir)], env,
                        timeout_s=1800, cwd=str(REPO))
    if r.returncode != 0:
        raise RuntimeError(f"export failed (exit {r.returncode}): {_tail(r.stderr_lines)}")
    import pyarrow.dataset as ds
    return ds.dataset(str(out_dir), format="parquet").to_table()


def measure(q: str, env: dict[str, str], res: QueryResult) -> None:
    from pipeline.testing.jobproc import run_job_process
    r = run_job_process(["run", "--job", _job_ref(q), "--json"], env, timeout_s=3600, cwd=str(REPO))
    if r.returncode != 0:
        res.detail += f"; measured run failed: {_tail(r.stderr_lines)}"
        return
    d = json.loads(r.stdout)
    secs = sum(x["duration_s"] + x.get("checkpoint_s", 0.0) for x in d["rounds"])
    res.events = sum(d["records"].values())
    res.seconds, res.wall_s = round(secs, 2), round(r.wall_s, 1)
    if secs > 0:
        res.events_per_s = round(res.events / secs)
        res.events_per_s_per_core = round(res.events / secs / (os.cpu_count() or 1))


def measure_steady(q: str, env: dict[str, str], res: QueryResult) -> None:
    """The steady state (issue 31, item 7): a fresh run of the query with one epoch per round
    (``PIPELINE_MAX_EPOCHS_PER_ROUND=1``), every epoch already closed, so each round starts as soon as the previous
    checkpoint completed, in one warm process (Spark session, Python workers and state kept, as ``run --follow``
    keeps them). Per checkpoint, latency = the round's processing + its checkpoint (the time from an epoch being
    ready to its checkpoint completing, when the process waits for it); events/s = records / the sum of those
    (JVM start excluded). The first round (JVM warm-up, the plan) is left out of the latencies."""
    from pipeline.testing.jobproc import run_job_process
    r = run_job_process(["run", "--job", _job_ref(q), "--json"], {**env, "PIPELINE_MAX_EPOCHS_PER_ROUND": "1"},
                        timeout_s=3600, cwd=str(REPO))
    if r.returncode != 0:
        res.detail += f"; steady run failed: {_tail(r.stderr_lines)}"
        return
    d = json.loads(r.stdout)
    per = [x["duration_s"] + x.get("checkpoint_s", 0.0) for x in d["rounds"]]
    if sum(per) > 0:
        res.steady_events_per_s = round(sum(d["records"].values()) / sum(per))
    warm = sorted(per[1:]) or sorted(per)
    if warm:
        res.steady_latency_ms_p50 = round(1000 * warm[len(warm) // 2])
        res.steady_latency_ms_p95 = round(1000 * warm[min(len(warm) - 1, math.ceil(0.95 * len(warm)) - 1)])


def run_query(q: str, *, data: dict, work: Path, roots_for: Callable[[str], dict[str, str]], args: argparse.Namespace,
              rng: random.Random, con) -> QueryResult:
    res = QueryResult(q, "failed")
    mod = importlib.import_module(f"benchmarks.nexmark.queries.{q}")
    try:
        mod.job()
    except NotExpressible as e:
        res.status, res.detail = "not expressible yet", e.missing
        return res
    expected = con.execute(mod.reference()).to_arrow_table()
    res.reference_rows = expected.num_rows
    env = _env(roots_for(q), args.epoch_seconds, args.parallelism, {})
    failure = run_with_kills(q, env, data["epochs"], args.kills, rng, res)
    if failure:
        res.detail = ("refused: " if "configuration error" in failure or "exit 2" in failure else "") + failure
        return res
    got = read_committed(q, mod.SINK, env, args.read, work / q / "export")
    res.output_rows = got.num_rows
    ok, diff = compare(got, expected)
    res.status, res.detail = ("exact", "") if ok else ("NOT exact", diff)
    if not args.no_measure:
        measure(q, _env(roots_for(q + "_measure"), args.epoch_seconds, args.parallelism, {}), res)
    if args.steady:
        measure_steady(q, _env(roots_for(q + "_steady"), args.epoch_seconds, args.parallelism, {}), res)
    if args.peer:
        from benchmarks.nexmark.peer import PEER_QUERIES, run_peer
        if q in PEER_QUERIES:
            p = run_peer(q, data["local_src"], work / q / "peer")
            res.peer_events_per_s = p.get("events_per_s")
            res.peer_detail = ("rows match the reference" if p.get("rows") == expected.num_rows
                               else f"rows {p.get('rows')} != reference {expected.num_rows}")
        else:
            res.peer_detail = "the peer cannot express it"
    return res


def markdown(results: list[QueryResult], meta: dict) -> str:
    lines = [f"Nexmark on Epochal: {meta['events']:,} events ({meta['rows']}), rate {meta['rate']:g}/s of event time, "
             f"{meta['partitions']} partitions, {meta['epochs']} epochs of {meta['epoch_seconds']} s, "
             f"{meta['kills']} SIGKILL{'' if meta['kills'] == 1 else 's'} per query, parallelism {meta['parallelism']}, {meta['cores']} cores, "
             f"load before {meta['load_before']}, after {meta['load_after']} ({meta['date']})", "",
             "| query | runs | exact after kills | events/s | events/s per core | SSS peer events/s "
             "| steady events/s | steady latency p50 / p95 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.status == "not expressible yet":
            lines.append(f"| {r.query} | - | not expressible yet: {r.detail} | - | - | - | - | - |")
            continue
        exact = ("yes" if r.status == "exact" else f"NO: {r.detail}") + (
            f" ({r.kills_landed} kill{'' if r.kills_landed == 1 else 's'}, {r.output_rows:,} rows)" if r.status in ("exact", "NOT exact") else "")
        if r.status == "failed":
            exact = f"failed: {r.detail}"
        eps = f"{r.events_per_s:,}" if r.events_per_s else "-"
        epc = f"{r.events_per_s_per_core:,}" if r.events_per_s_per_core else "-"
        peer = f"{r.peer_events_per_s:,}" if r.peer_events_per_s else (r.peer_detail or "-")
        steady = f"{r.steady_events_per_s:,}" if r.steady_events_per_s else "-"
        lat = (f"{r.steady_latency_ms_p50:,} / {r.steady_latency_ms_p95:,} ms"
               if r.steady_latency_ms_p50 is not None else "-")
        lines.append(f"| {r.query} | {r.runs} | {exact} | {eps} | {epc} | {peer} | {steady} | {lat} |")
    return "\n".join(lines) + "\n"


def combine(files: list[str], out: str | None) -> int:
    """One table, in query order, from the ``--json`` outputs of runs over the same data (same events, rate,
    seed): the load is the first run's before and the last run's after."""
    docs = [json.loads(Path(f).read_text()) for f in files]
    meta = dict(docs[0]["meta"], load_after=docs[-1]["meta"]["load_after"], date=docs[-1]["meta"]["date"])
    for d in docs[1:]:
        same = ("events", "rate", "partitions", "epoch_seconds", "kills")
        if any(d["meta"][k] != meta[k] for k in same):
            raise SystemExit(f"--combine: runs differ in {[k for k in same if d['meta'][k] != meta[k]]}")
    byq = {r["query"]: QueryResult(**r) for d in docs for r in d["results"]}
    table = markdown([byq[q] for q in QUERIES if q in byq], meta)
    if out:
        Path(out).write_text(table)
    print(table)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=50_000)
    ap.add_argument("--rate", type=float, default=1_000.0, help="events per second of event time")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--epoch-seconds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--queries", default=",".join(QUERIES), help="comma-separated, e.g. q0,q3,q21")
    ap.add_argument("--kills", type=int, default=2, help="SIGKILLs per query")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--read", choices=("export", "direct"), default="export",
                    help="committed rows by `python -m pipeline export` or read in this process")
    ap.add_argument("--no-measure", action="store_true", help="skip the clean throughput run")
    ap.add_argument("--peer", action="store_true", help="also run the Spark Structured Streaming peer")
    ap.add_argument("--steady", action="store_true",
                    help="also measure the steady state: one epoch per round, latency per checkpoint")
    ap.add_argument("--s3", action="store_true", help="sources, checkpoints and sinks on a moto S3 server")
    ap.add_argument("--workdir", default=None, help="default: a temporary directory, removed at the end")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--markdown", default=None, metavar="FILE", help="write the results table here")
    ap.add_argument("--combine", nargs="+", metavar="JSON", default=None,
                    help="no run: one table from the --json outputs of several runs over the same data")
    args = ap.parse_args(argv)
    if args.combine:
        return combine(args.combine, args.markdown)
    queries = [q.strip() for q in args.queries.split(",") if q.strip()]
    unknown = [q for q in queries if q not in QUERIES]
    if unknown:
        ap.error(f"unknown queries {unknown}")
    rng = random.Random(args.seed)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="nexmark-"))
    work.mkdir(parents=True, exist_ok=True)
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    cfg = NexmarkConfig(events=args.events, rate=args.rate, seed=args.seed, partitions=args.partitions)
    local_src = work / "src"
    summary = write_sources(local_src.as_uri(), cfg)
    first, last = summary["event_time"]
    # every row's _ingest_ts lies in [first, last] ms: the epochs the run will complete
    epochs = last // 1000 // args.epoch_seconds - first // 1000 // args.epoch_seconds + 1
    data = {"epochs": epochs, "local_src": str(local_src)}
    log(f"generated {args.events} events {summary['rows']} into {local_src}: {epochs} epochs of {args.epoch_seconds} s")
    moto = None
    if args.s3:
        from pipeline.fileio import file_io_for
        from pipeline.testing.moto_server import spawn_moto_server
        moto = spawn_moto_server(["nexmark"])
        os.environ.update(moto.env())
        fio = file_io_for("s3://nexmark/src")
        for p in local_src.rglob("*.parquet"):
            fio.write_bytes("s3://nexmark/src/" + p.relative_to(local_src).as_posix(), p.read_bytes())

        def roots_for(q: str) -> dict[str, str]:
            return {"src": "s3://nexmark/src", "ckpt": f"s3://nexmark/{q}/ckpt", "sink": f"s3://nexmark/{q}/sink"}
    else:
        def roots_for(q: str) -> dict[str, str]:
            return {"src": local_src.as_uri(), "ckpt": (work / q / "ckpt").as_uri(),
                    "sink": (work / q / "sink").as_uri()}
    from benchmarks.nexmark.reference import connect
    con = connect(local_src, args.epoch_seconds)
    results = []
    try:
        for i, q in enumerate(queries, 1):
            log(f"[{i}/{len(queries)}] {q}")
            t0 = time.monotonic()
            res = run_query(q, data=data, work=work, roots_for=roots_for, args=args, rng=rng, con=con)
            log(f"[{i}/{len(queries)}] {q}: {res.status}{': ' + res.detail if res.detail else ''} "
                f"({time.monotonic() - t0:.0f} s)")
            results.append(res)
    finally:
        if moto is not None:
            moto.stop()
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    meta = {"events": args.events, "rows": summary["rows"], "rate": args.rate, "partitions": args.partitions,
            "epochs": epochs, "epoch_seconds": args.epoch_seconds, "kills": args.kills,
            "parallelism": args.parallelism, "cores": os.cpu_count(), "load_before": " ".join(load_before),
            "load_after": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "storage": "moto S3" if args.s3 else "file://"}
    table = markdown(results, meta)
    if args.markdown:
        Path(args.markdown).write_text(table)
        log(f"table written to {args.markdown}")
    if args.json:
        print(json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=1, default=str))
    else:
        print(table)
    bad = [r for r in results if r.status in ("NOT exact", "failed")]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
