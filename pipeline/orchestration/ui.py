"""The FastAPI app of the Airflow plugin: checkpoint history pages and a small JSON API.

Mounted by ``plugins/epochal_plugin.py`` at ``/epochal`` inside Airflow's api-server and shown in the UI
nav (*Browse > Epochal checkpoints*) and as a *Checkpoints* tab of each epoch DAG. Routes::

    GET /epochal/                                   jobs
    GET /epochal/jobs/<job>/                        checkpoints and savepoints of a job
    GET /epochal/jobs/<job>/checkpoints/<id>        one checkpoint (per-operator acks, state, positions)
    GET /epochal/jobs/<job>/savepoints/<id>         one savepoint
    GET /epochal/dags/<dag id>                      redirect to the job of an epoch DAG
    GET /epochal/api/jobs[/<job>/checkpoints[/<id>]]  the same as JSON

**Auth**: Airflow does not authenticate plugin apps, so every route does: the caller's Airflow JWT (the UI's
``_token`` cookie, or ``Authorization: Bearer``) is checked with the configured auth manager, and the user
must be allowed to read the job's epoch DAG. Pages redirect anonymous browsers to Airflow's login page;
the JSON API answers 401/403.

S3 settings for reading the checkpoint store: the Airflow connection ``EPOCHAL_AWS_CONN_ID`` (default
``epochal_s3``) or the api-server's ``AWS_*`` environment; the checkpoint root is ``PIPELINE_CHECKPOINT_URI``.

Over 400 lines: the plugin's FastAPI app, one small route per page or API call.
"""

import html
import logging
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from pipeline.exceptions import EpochalError, ObjectNotFoundError
from pipeline.fileio import file_io_for, join_uri
from pipeline.jobs import job_names
from pipeline.orchestration.checkpoint_stats import configuration, counts, latest_failed, lineage, summary
from pipeline.orchestration.history import CheckpointHistory, list_jobs
from pipeline.orchestration.keepup import JobLag, job_lag
from pipeline.orchestration.names import data_docs_url, epoch_dag_id
from pipeline.orchestration.settings import airflow_server_connection, load_pipeline_config, resolve_s3_settings
from pipeline.quality.docs_site import CONTENT_TYPES, site_uri

__all__ = ["create_app", "render_job_page", "render_detail_page", "render_index_page", "data_docs_url"]

log = logging.getLogger(__name__)

_CSS = """
body{font-family:-apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:16px;color:#1a202c}
h1{font-size:1.4rem;margin:0 0 4px 0} h2{font-size:1.1rem;margin:20px 0 6px 0}
.sub{color:#4a5568;margin-bottom:12px;font-size:.9rem}
table{border-collapse:collapse;width:100%;font-size:.85rem;margin-bottom:8px}
th,td{border-bottom:1px solid #e2e8f0;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f7fafc;font-weight:600} td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.s-COMPLETED{color:#2f855a;font-weight:600} .s-PENDING{color:#b7791f;font-weight:600} .s-CORRUPT{color:#c53030;font-weight:600} .s-FAILED{color:#c53030;font-weight:600}
.badge{display:inline-block;padding:1px 6px;border-radius:8px;background:#edf2f7;font-size:.75rem;margin-left:4px}
.head{background:#ebf8ff} a{color:#2b6cb0;text-decoration:none} a:hover{text-decoration:underline}
.kv td:first-child{color:#4a5568;width:220px} code{font-size:.8rem}
.warn{background:#fffaf0;border:1px solid #fbd38d;padding:8px;border-radius:4px;margin:8px 0}
.ok{background:#f0fff4;border:1px solid #9ae6b4;padding:8px;border-radius:4px;margin:8px 0}
"""


def _e(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _bytes(n: Any) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _ms(v: Any) -> str:
    if v is None:
        return "-"
    v = float(v)
    return f"{v:.0f} ms" if v < 10_000 else f"{v / 1000:.1f} s"


def _page(title: str, body: str, *, refresh: int = 0) -> str:
    meta = f"<meta http-equiv='refresh' content='{int(refresh)}'>" if refresh > 0 else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'>{meta}<title>{_e(title)}</title>"
            f"<style>{_CSS}</style></head><body>{body}</body></html>")


REFRESH_SECONDS = 15


def _stat_cell(v: Any, fmt: Callable[[Any], str]) -> str:
    return fmt(v) if v is not None else "-"


def _restore_text(e: dict) -> str:
    """One restore or rewind, named for what it was (a rewind is not a restore)."""
    src = ("the start of the sources" if e.get("from_id") is None else
           f"{_e(e.get('from_kind'))} " + (f"<a href='checkpoints/{_e(e['from_id'])}'>{_e(e['from_id'])}</a>"
                                           if e.get("from_kind") == "checkpoint" else _e(e["from_id"]))
           + (f" (epoch {_e(e['from_epoch'])})" if e.get("from_epoch") is not None else ""))
    if e.get("kind") == "rewind":
        what = f"rewound to {src} to re-run epoch {_e(e.get('rerun_epoch'))}"
    else:
        what = (f"restored from {src}" + (f" as checkpoint <a href='checkpoints/{_e(e['checkpoint_id'])}'>"
                                          f"{_e(e['checkpoint_id'])}</a>" if e.get("checkpoint_id") else "")
                + (f" at parallelism {_e(e['parallelism'])}" if e.get("parallelism") else ""))
    return what + (f" <code>{_e(e['from_location'])}</code>" if e.get("from_kind") == "savepoint"
                   and e.get("from_location") else "")


def _restores_html(restores: list[dict]) -> str:
    if not restores:
        return ""
    rows = "".join(f"<tr><td>{_e(e.get('at'))}</td><td>{_e(e.get('kind'))}</td><td>{_restore_text(e)}</td><td>"
                   + (", ".join(f"<a href='checkpoints/{i}'>{i}</a>" for i in e.get("abandoned") or ()) or "none")
                   + "</td></tr>" for e in restores)
    return ("<h2>Restores and rewinds</h2><table><tr><th>Time (UTC)</th><th>Kind</th><th>What</th>"
            f"<th>Abandoned checkpoints</th></tr>{rows}</table>")


def _summary_html(checkpoints: list[dict], savepoints: list[dict], head: int | None,
                  restores: list[dict] | None = None, triggered: int | None = None) -> str:
    restores = restores or []
    c = counts(checkpoints, savepoints, restores=restores, triggered=triggered)
    sm = summary(checkpoints)
    lin = lineage(checkpoints, savepoints, head)
    rows = "".join(
        f"<tr><td>{label}</td>" + "".join(f"<td class='num'>{_stat_cell(sm[k][q], f)}</td>"
                                          for q in ("min", "avg", "max", "p50", "p90", "p99")) + "</tr>"
        for label, k, f in (("End-to-end duration", "duration_ms", _ms),
                            ("Checkpointed data size", "checkpointed_bytes", _bytes),
                            ("Full state size", "state_bytes", _bytes),
                            ("Sink output staged", "sink_bytes", _bytes), ("Alignment time", "alignment_ms", _ms)))
    r = lin["latest_restore"]
    if restores:   # the restore log names what happened (a rewind is not a restore)
        restore = f"{_e(restores[0].get('at'))}: {_restore_text(restores[0])}"
    elif r:
        restore = (f"checkpoint <a href='checkpoints/{r['checkpoint_id']}'>{r['checkpoint_id']}</a> (epoch "
                   f"{_e(r['epoch'])}) continues from {_e(r['from_kind'])} {_e(r['from_id'])}"
                   + (f" <code>{_e(r['from_location'])}</code>" if r.get("from_location") else ""))
    else:
        restore = "none (the job was never restored or rewound)"
    abandoned = (", ".join(f"<a href='checkpoints/{i}'>{i}</a>" for i in lin["abandoned"])
                 + " (completed, but not on the latest checkpoint's lineage: a restore or rewind left them)"
                 ) if lin["abandoned"] else "none"
    lf = latest_failed(checkpoints)
    failed = (f"<a href='checkpoints/{lf['checkpoint_id']}'>{lf['checkpoint_id']}</a>: {_e(lf.get('problem'))}"
              if lf else "none")
    return ("<h2>Overview</h2><table class='kv'>"
            f"<tr><td>Counts</td><td>triggered {c['triggered']} &middot; completed {c['completed']} &middot; failed "
            f"{c['failed']} &middot; in progress or aborted {c['in_progress_or_aborted']} &middot; corrupt "
            f"{c['corrupt']} &middot; savepoints {c['savepoints']} &middot; restored {c['restored']} &middot; "
            f"rewound {c['rewound']}</td></tr>"
            f"<tr><td>Latest restore or rewind</td><td>{restore}</td></tr>"
            f"<tr><td>Latest failed checkpoint</td><td>{failed}</td></tr>"
            f"<tr><td>Abandoned branch</td><td>{abandoned}</td></tr></table>"
            "<h2>Summary (completed checkpoints)</h2><table><tr><th></th><th class='num'>Minimum</th>"
            "<th class='num'>Average</th><th class='num'>Maximum</th><th class='num'>p50</th>"
            f"<th class='num'>p90</th><th class='num'>p99</th></tr>{rows}</table>" + _restores_html(restores))


def _config_html(config_rows: list[tuple[str, str]]) -> str:
    if not config_rows:
        return ""
    return ("<h2>Configuration</h2><table class='kv'>"
            + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in config_rows) + "</table>")


def _acks_cell(row: dict) -> str:
    if row.get("acks") is None:
        return f"0/{_e(row.get('expected_acks') or '?')}" if row.get("status") == "PENDING" else "-"
    per = ", ".join(f"{_e(o['uid'])} {o['acks']}/{o['subtasks']}" for o in row.get("operators", []))
    return f"{row['acks']}/{row['expected_acks']}" + (f"<br><small>{per}</small>" if per else "")


def _requests_cell(row: dict) -> str:
    req = row.get("s3_requests")
    if not req:
        return "-"
    kinds = " ".join(f"{_e(k.upper())} {_e(v)}" for k, v in req.items() if v)
    ereq = row.get("executor_s3_requests")  # the executors' (exact, or approximate: Spark Connect)
    executors = (f"<br><small>executors {sum(ereq.values())} ({_e(row.get('executor_s3_requests_counting') or 'approximate')})"
                 "</small>") if ereq else ""
    return f"{sum(req.values())}" + (f"<br><small>{kinds}</small>" if kinds else "") + executors


#: what the pages say for a job whose epoch DAG this Airflow does not have (it runs by the CLI or elsewhere)
NO_DAG = "<span class='sub'>no epoch DAG in this Airflow</span>"


def render_index_page(jobs: list[dict]) -> str:
    rows = "".join(
        f"<tr><td><a href='jobs/{quote(j['job'])}/'>{_e(j['job'])}</a></td>"
        f"<td>{_e(j['dag_id']) if j.get('dag_id') else NO_DAG}</td>"
        f"<td class='num'>{_e(j.get('checkpoints'))}</td><td class='num'>{_e(j.get('head'))}</td></tr>"
        for j in jobs)
    body = ("<h1>Epochal checkpoints</h1><div class='sub'>Jobs with checkpoints under the configured "
            "checkpoint root</div><table><tr><th>Job</th><th>Epoch DAG</th><th class='num'>Checkpoints</th>"
            f"<th class='num'>Latest</th></tr>{rows or '<tr><td colspan=4>no jobs yet</td></tr>'}</table>")
    return _page("Epochal checkpoints", body)


def _history_table(rows: list[dict], link: str, head: int | None) -> str:
    out = ["<table><tr><th>ID</th><th>Status</th><th class='num'>Epoch (ends at)</th><th>Trigger time</th>"
           "<th class='num'>Duration</th><th class='num'>Checkpointed / full size</th><th class='num'>Alignment</th>"
           "<th class='num'>S3 requests</th><th>Acks (per operator)</th><th class='num'>Parallelism</th><th class='num'>Parent</th>"
           "<th>Records</th></tr>"]
    for r in rows:
        cid = r["checkpoint_id"]
        ident = (f"<a href='{link}/{cid}'>{cid}</a>" if cid >= 0 and r.get("location") else str(cid) if cid >= 0
                 else "?")
        if head is not None and cid == head and r["kind"] == "checkpoint":
            ident += "<span class='badge'>latest</span>"
        recs = ", ".join(f"{_e(k)} {v}" for k, v in sorted((r.get("records") or {}).items())) or "-"
        cls = " class='head'" if head is not None and cid == head and r["kind"] == "checkpoint" else ""
        out.append(
            f"<tr{cls}><td>{ident}</td><td class='s-{_e(r['status'])}'>{_e(r['status'])}"
            + (f"<br><small>{_e(r.get('problem'))}</small>" if r["status"] in ("FAILED", "CORRUPT") and r.get("problem")
               else "") + "</td>"
            f"<td class='num'>{_e(r.get('epoch'))}<br><small>{_e(r.get('barrier_time') or '')}</small></td>"
            f"<td>{_e(r.get('trigger_time') or '-')}</td>"
            f"<td class='num'>{_ms(r.get('duration_ms'))}</td>"
            f"<td class='num'>{_bytes(r.get('checkpointed_bytes'))} / {_bytes(r.get('state_bytes'))}</td>"
            f"<td class='num'>{_ms(r.get('alignment_ms'))}</td><td class='num'>{_requests_cell(r)}</td>"
            f"<td>{_acks_cell(r)}</td>"
            f"<td class='num'>{_e(r.get('parallelism'))}</td><td class='num'>{_e(r.get('parent_id'))}</td>"
            f"<td>{recs}</td></tr>")
    out.append("</table>")
    return "".join(out)


def render_job_page(job: str, dag_id: str | None, checkpoints: list[dict], savepoints: list[dict],
                    head: int | None, control: dict, info: dict, *, config_rows: list[tuple[str, str]] | None = None,
                    refresh: int = 0, restores: list[dict] | None = None, triggered: int | None = None,
                    lag: JobLag | None = None) -> str:
    """Over 8 parameters: one argument per section of the page (checkpoints, savepoints, restores, control, config,
    ...), the rest keywords. ``lag``: whether the job keeps up with its epochs (a warning when it falls behind)."""
    completed = sum(1 for r in checkpoints if r["status"] == "COMPLETED")
    pending = sum(1 for r in checkpoints if r["status"] == "PENDING")
    warn = ""
    if control.get("stopped"):
        warn = (f"<div class='warn'>Job stopped with savepoint <code>{_e(control.get('stopped_savepoint'))}</code>"
                " - epoch runs are skipped until the job is restored.</div>")
    if lag is not None and lag.now is not None:
        warn += (f"<div class='warn'><b>{_e(lag.summary())}</b></div>" if lag.behind
                 else f"<div class='ok'>{_e(lag.summary())}</div>")
    runs = (f" &middot; <a href='../../../dags/{quote(dag_id)}/runs' target='_top'>Airflow runs of {_e(dag_id)}</a>"
            if dag_id else "")
    auto = (f"auto-refresh every {refresh} s (<a href='?refresh=0'>stop</a>)" if refresh
            else f"<a href='?refresh={REFRESH_SECONDS}'>auto-refresh</a>")
    body = (f"<h1>Checkpoint history: {_e(job)}</h1>"
            + (f"<div class='sub'>Epoch DAG <code>{_e(dag_id)}</code>" if dag_id
               else "<div class='sub'>No epoch DAG in this Airflow")
            + f" &middot; {completed} completed, {pending} pending"
            f" &middot; max parallelism {_e(info.get('max_parallelism'))} &middot; latest checkpoint {_e(head)}"
            f"{runs} &middot; <a href='data-docs/'>Data Docs</a> &middot; {auto} &middot; "
            f"<a href='../../'>all jobs</a></div>{warn}"
            + (_summary_html(checkpoints, savepoints, head, restores, triggered) if checkpoints else "")
            + "<h2>Checkpoints</h2>" + (_history_table(checkpoints, "checkpoints", head) if checkpoints
                                        else _empty_state(dag_id))
            + "<h2>Savepoints</h2>" + (_history_table(savepoints, "savepoints", None) if savepoints
                                       else "<p>No savepoints.</p>")
            + _config_html(config_rows or []))
    return _page(f"Checkpoints {job}", body, refresh=refresh)


def _empty_state(dag_id: str | None) -> str:
    if not dag_id:
        return ("<div class='warn'>No checkpoint yet. This Airflow has no epoch DAG for this job: run it with "
                "<code>epochal run</code>; the first completed epoch appears here.</div>")
    return (f"<div class='warn'>No checkpoint yet. Turn on and trigger the epoch DAG <code>{_e(dag_id)}</code> "
            "(or run <code>epochal run</code>); the first completed epoch appears here. This page refreshes "
            "itself.</div>")


def render_not_found_page(job: str, cid: int, kind: str, why: str, checkpoints: list[int],
                          savepoints: list[int]) -> str:
    """An unknown checkpoint/savepoint id: what was asked, a way back to the job's history, the ids there are
    (the page lives at ``/jobs/<job>/<kind>s/<id>``, so the links are relative to that folder)."""
    def links(ids: list[int], folder: str) -> str:
        return ", ".join(f"<a href='../{folder}/{i}'>{i}</a>" for i in ids) or "none"
    body = (f"<h1>No {_e(kind)} {cid} of job {_e(job)}</h1><p>{_e(why)}</p>"
            f"<p><a href='../'>&larr; Back to the checkpoint history of {_e(job)}</a></p>"
            f"<p>Retained checkpoints: {links(sorted(checkpoints), 'checkpoints')}</p>"
            f"<p>Savepoints: {links(sorted(savepoints), 'savepoints')}</p>")
    return _page(f"Epochal: no {kind} {cid} of {job}", body)


_SUBTASK_STATS = (("Acknowledged (after trigger)", "ack_ms", _ms), ("Sync", "sync_ms", _ms),
                  ("Async", "async_ms", _ms), ("Alignment", "alignment_ms", _ms),
                  ("Start delay", "start_delay_ms", _ms), ("State size", "state_bytes", _bytes))


def _subtask_summary_html(subtasks: list[dict]) -> str:
    """Per operator, minimum / average / maximum over its subtasks (Flink's per-operator summary)."""
    by_op: dict[str, list[dict]] = {}
    for t in subtasks:
        by_op.setdefault(str(t.get("uid")), []).append(t)
    if not by_op:
        return ""
    rows = []
    for uid, ts in by_op.items():
        for label, key, fmt in _SUBTASK_STATS:
            vals = [float(t[key]) for t in ts if t.get(key) is not None]
            if not vals:
                continue
            rows.append(f"<tr><td>{_e(uid)}</td><td>{label}</td><td class='num'>{fmt(min(vals))}</td>"
                        f"<td class='num'>{fmt(sum(vals) / len(vals))}</td><td class='num'>{fmt(max(vals))}</td></tr>")
    return ("<h2>Per operator over its subtasks</h2><table><tr><th>Operator</th><th></th><th class='num'>Minimum</th>"
            "<th class='num'>Average</th><th class='num'>Maximum</th></tr>" + "".join(rows) + "</table>")


def render_detail_page(job: str, d: dict) -> str:
    s = d["summary"]
    kv = [("Status", f"<span class='s-{_e(s['status'])}'>{_e(s['status'])}</span>"), ("Type", _e(s["kind"])),
          ("Epoch", _e(s.get("epoch"))), ("Barrier time (epoch end)", _e(s.get("barrier_time"))),
          ("Trigger time", _e(s.get("trigger_time"))), ("Duration", _ms(s.get("duration_ms"))),
          ("Checkpointed data size", _bytes(s.get("checkpointed_bytes"))),
          ("Full state size", _bytes(s.get("state_bytes"))), ("Sink output staged", _bytes(s.get("sink_bytes"))),
          ("Alignment time", _ms(s.get("alignment_ms"))),
          ("Acks", f"{_e(s.get('acks'))}/{_e(s.get('expected_acks'))}"),
          ("Parallelism / max", f"{_e(s.get('parallelism'))} / {_e(d.get('max_parallelism'))}"),
          ("Checkpoint mode / alignment", f"{_e(d.get('checkpoint_mode'))} / {_e(d.get('alignment'))}"),
          ("Sync / async", f"{_ms(d.get('sync_ms'))} / {_ms(d.get('async_ms'))}"),
          ("Rounds", _e(d.get("rounds"))), ("Parent", _e(s.get("parent_id"))),
          ("Location", f"<code>{_e(s.get('location'))}</code>")]
    taken = d.get("taken_by") or {}
    if taken.get("airflow"):   # the run and task (its log) that took it, in this Airflow
        a = taken["airflow"]
        kv.append(("Taken by", f"<a href='../../../../dags/{quote(a['dag_id'])}/runs/{quote(a['run_id'], safe='')}/"
                               f"tasks/{quote(a['task_id'])}' target='_top'>{_e(a['dag_id'])} / {_e(a['run_id'])} / "
                               f"{_e(a['task_id'])}</a> (try {_e(a['try_number'])}, task log)"))
    elif taken.get("runner"):
        kv.append(("Taken by", f"<code>{_e(taken['runner'])}</code> (not an Airflow task)"))
    if s.get("problem"):
        kv.append(("Problem", _e(s["problem"])))
    kvs = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in kv)
    ops = "".join(
        f"<tr><td>{_e(o['uid'])}</td><td class='num'>{o['acks']}/{o['subtasks']}</td><td class='num'>{o['rows']}</td>"
        f"<td class='num'>{_bytes(o['bytes'])}</td><td class='num'>{_ms(o['sync_ms'])}</td>"
        f"<td class='num'>{_ms(o['async_ms'])}</td><td class='num'>{_ms(o['alignment_ms'])}</td>"
        f"<td class='num'>{_ms(o['start_delay_ms'])}</td><td class='num'>{_bytes(o['inflight_bytes'])}</td>"
        f"<td>{_e(o['mode'])}</td></tr>" for o in d.get("operators", []))
    subs = "".join(
        f"<tr><td>{_e(t['uid'])}</td><td class='num'>{t['subtask']}</td>"
        f"<td class='num'>{_ms(t['ack_ms']) if t.get('ack_ms') is not None else '-'}</td>"
        f"<td class='num'>{_ms(t['sync_ms'])}</td><td class='num'>{_ms(t['async_ms'])}</td>"
        f"<td class='num'>{_ms(t['alignment_ms'])}</td><td class='num'>{_ms(t['start_delay_ms'])}</td>"
        f"<td class='num'>{_bytes(t['state_bytes'])}</td><td class='num'>{t['state_rows']}</td>"
        f"<td class='num'>{t['in_rows']}</td></tr>" for t in d.get("subtasks", []))
    per_op = _subtask_summary_html(d.get("subtasks", []))
    srcs = "".join(f"<tr><td>{_e(x['source'])}</td><td class='num'>{_e(x['partition'])}</td>"
                   f"<td class='num'>{_e(x['position'])}</td><td class='num'>{_e(x['barrier'])}</td>"
                   f"<td class='num'>{_e(d.get('backlog', {}).get(x['source'], ''))}</td></tr>"
                   for x in d.get("sources", []))
    state = "".join(f"<tr><td>{_e(h['operator'])}</td><td class='num'>{h['subtask']}</td><td>{_e(h['name'])}</td>"
                    f"<td class='num'>{_e(h['key_groups'])}</td><td class='num'>{h['rows']}</td>"
                    f"<td class='num'>{_bytes(h['bytes'])}</td><td><code>{_e(h['sha256'])}</code></td></tr>"
                    for h in d.get("state", []))
    sinks = "".join(f"<tr><td>{_e(t['table'])}</td><td class='num'>{t['files']}</td><td class='num'>{t['rows']}</td>"
                    f"<td class='num'>{_bytes(t['bytes'])}</td><td>{'yes' if t['full'] else 'no'}</td></tr>"
                    for t in d.get("sinks", []))
    dl = ", ".join(f"{_e(k)}: {v}" for k, v in sorted((d.get("dead_letters") or {}).items())) or "none"
    title = f"{s['kind'].capitalize()} {s['checkpoint_id']}"
    body = (f"<h1>{_e(title)} of {_e(job)}</h1><div class='sub'><a href='../'>back to the checkpoint history</a>"
            " &middot; <a href='../data-docs/'>Data Docs (data quality)</a></div><table class='kv'>" + kvs + "</table>"
            "<h2>Acknowledgements per operator</h2><table><tr><th>Operator</th><th class='num'>Acks</th>"
            "<th class='num'>State rows</th><th class='num'>State size</th><th class='num'>Sync</th>"
            "<th class='num'>Async</th><th class='num'>Alignment</th><th class='num'>Start delay</th>"
            "<th class='num'>In-flight persisted</th><th>Mode</th></tr>" + (ops or "<tr><td colspan=10>-</td></tr>")
            + "</table><h2>Acknowledgements per subtask</h2><table><tr><th>Operator</th><th class='num'>Subtask</th>"
            "<th class='num'>Acknowledged (after trigger)</th><th class='num'>Sync</th><th class='num'>Async</th>"
            "<th class='num'>Alignment</th><th class='num'>Start delay</th><th class='num'>State size</th>"
            "<th class='num'>State rows</th><th class='num'>Records in</th></tr>"
            + (subs or "<tr><td colspan=10>- (not recorded by this checkpoint)</td></tr>")
            + "</table>" + per_op + "<h2>Sources: restore position and barrier per partition (file seq:row)</h2><table><tr>"
            "<th>Source</th><th class='num'>Partition</th><th class='num'>Position</th><th class='num'>Barrier</th>"
            "<th class='num'>Backlog (source)</th></tr>" + (srcs or "<tr><td colspan=5>-</td></tr>") + "</table>"
            f"<div class='sub'>Dead letters: {dl}</div>"
            "<h2>Sink transactions</h2><table><tr><th>Table</th><th class='num'>Files</th><th class='num'>Rows</th>"
            "<th class='num'>Bytes</th><th>Full image</th></tr>" + (sinks or "<tr><td colspan=5>-</td></tr>")
            + "</table><h2>State handles</h2><table><tr><th>Operator</th><th class='num'>Subtask</th><th>State</th>"
            "<th class='num'>Key groups</th><th class='num'>Rows</th><th class='num'>Bytes</th><th>SHA-256</th></tr>"
            + (state or "<tr><td colspan=7>-</td></tr>") + "</table>")
    return _page(f"{title} {job}", body)


class _Backend:
    """Resolves config, S3 settings and FileIO in the api-server process (lazily, per request)."""

    def __init__(self, config_loader: Callable[[], Any] | None = None,
                 s3_resolver: Callable[[], Any] | None = None,
                 dag_ids_loader: Callable[[], set[str] | None] | None = None) -> None:
        self._config_loader = config_loader
        self._s3_resolver = s3_resolver
        self._dag_ids_loader = dag_ids_loader

    def dag_ids(self) -> set[str] | None:
        """The DAG ids this Airflow knows (not stale); None when that cannot be told (then every job is shown
        with its epoch DAG, as before)."""
        if self._dag_ids_loader is not None:
            return self._dag_ids_loader()
        try:
            from airflow.models.dag import DagModel
            from airflow.utils.session import create_session
            from sqlalchemy import select
            with create_session() as session:
                return set(session.scalars(select(DagModel.dag_id).where(DagModel.is_stale.is_(False))))
        except Exception as e:  # noqa: BLE001 - outside Airflow, or another Airflow version: unknown
            log.debug("epochal plugin: cannot list Airflow's DAGs: %s", e)
            return None

    def epoch_dag(self, job: str, known: set[str] | None = None) -> str | None:
        """The job's epoch DAG id if this Airflow has it (or cannot tell), else None."""
        dag = epoch_dag_id(job)
        known = self.dag_ids() if known is None else known
        return dag if known is None or dag in known else None

    def config(self):
        if self._config_loader is not None:
            return self._config_loader()
        return load_pipeline_config()

    def fileio_for(self, uri: str):
        if uri.startswith("s3://"):
            if self._s3_resolver is not None:
                s3 = self._s3_resolver()
            else:
                s3 = resolve_s3_settings(lookup=airflow_server_connection)
            return s3.file_io()
        return file_io_for(uri)

    def history(self, job: str):
        cfg = self.config()
        return CheckpointHistory(self.fileio_for(cfg.checkpoint_uri), cfg.checkpoint_uri, job,
                                 fileio_for=self.fileio_for)

    def jobs(self) -> list[str]:
        cfg = self.config()
        return list_jobs(self.fileio_for(cfg.checkpoint_uri), cfg.checkpoint_uri, job_names())


async def airflow_user(request) -> Any:
    """The Airflow user of this request (JWT from ``Authorization: Bearer`` or the UI's ``_token`` cookie);
    raises HTTPException 401/403 like Airflow's own API."""
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import resolve_user_from_token
    auth = request.headers.get("authorization", "")
    token = auth[7:].strip() if auth.lower().startswith("bearer ") else request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    return await resolve_user_from_token(token)


def airflow_can_read_dag(user: Any, dag_id: str | None) -> bool:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
    details = DagDetails(id=dag_id) if dag_id else None
    return bool(get_auth_manager().is_authorized_dag(method="GET", details=details, user=user))


def airflow_login_url(next_url: str) -> str:
    from airflow.api_fastapi.app import get_auth_manager
    url = get_auth_manager().get_url_login()
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}next={quote(next_url, safe='')}"


def create_app(*, backend: "_Backend | None" = None, authenticate: Callable | None = None,
               authorize: Callable[[Any, str | None], bool] | None = None,
               login_url: Callable[[str], str] | None = None):
    """The plugin's FastAPI app. The auth hooks default to Airflow's auth manager (tests may stub them).

    Over 80 lines: the FastAPI app's routes are declared inside it so they close over the backend and the auth
    hooks."""
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse

    be = backend or _Backend()
    authenticate = authenticate or airflow_user
    authorize = authorize or airflow_can_read_dag
    login_url = login_url or airflow_login_url
    app = FastAPI(title="Epochal checkpoints", description="Checkpoint history of Epochal jobs",
                  docs_url=None, redoc_url=None, openapi_url=None)

    async def _check(request: Request, job: str | None, *, html_page: bool):
        try:
            user = await authenticate(request)
        except HTTPException as e:
            if html_page and e.status_code == 401:
                return RedirectResponse(login_url(str(request.url)), status_code=302)
            raise
        if not authorize(user, epoch_dag_id(job) if job else None):
            raise HTTPException(status_code=403, detail=f"not allowed to read job {job or '*'}")
        return None

    def _err(e: Exception | str, status: int = 404):
        return HTMLResponse(_page("Epochal", f"<h1>Not found</h1><p>{_e(e)}</p>"), status_code=status)

    def _jobs_payload() -> list[dict]:
        out = []
        known = be.dag_ids()
        for job in be.jobs():
            h = be.history(job)
            rows = h.checkpoints() if h.exists() else []
            out.append({"job": job, "dag_id": be.epoch_dag(job, known),
                        "checkpoints": sum(r.status == "COMPLETED" for r in rows),
                        "head": h.head_id() if rows else None})
        return out

    @app.get("/", response_class=HTMLResponse)
    async def index(request: Request):
        if (resp := await _check(request, None, html_page=True)) is not None:
            return resp
        return HTMLResponse(render_index_page(_jobs_payload()))

    @app.get("/jobs/{job}/", response_class=HTMLResponse)
    async def job_page(job: str, request: Request):
        if (resp := await _check(request, job, html_page=True)) is not None:
            return resp
        h = be.history(job)
        cfg = be.config()
        try:
            refresh = max(0, int(request.query_params.get("refresh", REFRESH_SECONDS)))
        except ValueError:
            refresh = REFRESH_SECONDS
        if not h.exists():  # before the first checkpoint: an empty state, not "Not found"
            return HTMLResponse(render_job_page(job, be.epoch_dag(job), [], [], None, {}, {},
                                                config_rows=configuration(cfg, {}), refresh=refresh or REFRESH_SECONDS))
        info = h.job_info()
        cps = [r.to_dict() for r in h.checkpoints()]
        return HTMLResponse(render_job_page(job, be.epoch_dag(job), cps,
                                            [r.to_dict() for r in h.savepoints()], h.head_id(), h.control(),
                                            info, config_rows=configuration(cfg, info), refresh=refresh,
                                            restores=h.restores(), triggered=h.triggered(),
                                            lag=job_lag(job, cps, cfg.epoch_seconds, time.time())))

    @app.get("/jobs/{job}", include_in_schema=False)
    async def job_page_noslash(job: str, request: Request):
        return RedirectResponse(f"{quote(job)}/", status_code=307)

    async def _detail(job: str, cid: int, kind: str, request: Request):
        if (resp := await _check(request, job, html_page=True)) is not None:
            return resp
        h = be.history(job)
        try:
            d = h.detail(cid, kind=kind)
        except ObjectNotFoundError as e:
            try:
                retained = ([r.checkpoint_id for r in h.checkpoints() if r.status == "COMPLETED"],
                            [r.checkpoint_id for r in h.savepoints()]) if h.exists() else ([], [])
            except EpochalError:
                retained = ([], [])
            return HTMLResponse(render_not_found_page(job, cid, kind, str(e), *retained), status_code=404)
        return HTMLResponse(render_detail_page(job, d))

    @app.get("/jobs/{job}/checkpoints/{checkpoint_id}", response_class=HTMLResponse)
    async def checkpoint_page(job: str, checkpoint_id: int, request: Request):
        return await _detail(job, checkpoint_id, "checkpoint", request)

    @app.get("/jobs/{job}/savepoints/{savepoint_id}", response_class=HTMLResponse)
    async def savepoint_page(job: str, savepoint_id: int, request: Request):
        return await _detail(job, savepoint_id, "savepoint", request)

    @app.get("/jobs/{job}/data-docs/{path:path}")
    async def data_docs(job: str, path: str, request: Request):
        """The job's Great Expectations Data Docs, from the checkpoint store (offline-styled)."""
        from fastapi.responses import Response

        if (resp := await _check(request, job, html_page=True)) is not None:
            return resp
        parts = [p for p in (path or "index.html").split("/") if p]
        if any(p in (".", "..") for p in parts):
            raise HTTPException(status_code=400, detail="bad path")
        if not parts or path.endswith("/"):
            parts.append("index.html")
        cfg = be.config()
        uri = join_uri(site_uri(cfg.checkpoint_uri, job), *parts)
        try:
            data = be.fileio_for(uri).read_bytes(uri)
        except ObjectNotFoundError:
            if parts == ["index.html"]:
                return HTMLResponse(_page(f"Data Docs {job}", f"<h1>Data Docs: {_e(job)}</h1><div class='warn'>No "
                                          "data-quality results yet: they appear after the first restore or a run of "
                                          "the data-quality DAG.</div>"))
            return _err(f"no Data Docs file {'/'.join(parts)} for job {job!r}")
        ext = "." + parts[-1].rsplit(".", 1)[-1].lower() if "." in parts[-1] else ""
        return Response(data, media_type=CONTENT_TYPES.get(ext, "application/octet-stream"))

    @app.get("/dags/{dag_id}", include_in_schema=False)
    async def dag_redirect(dag_id: str, request: Request):
        for job in be.jobs():
            if epoch_dag_id(job) == dag_id or dag_id.startswith(epoch_dag_id(job) + "_"):
                return RedirectResponse(f"../jobs/{quote(job)}/", status_code=307)
        return _err(f"DAG {dag_id!r} is not an Epochal job DAG")

    # -- JSON -----------------------------------------------------------------------------------------
    @app.get("/api/jobs")
    async def api_jobs(request: Request):
        await _check(request, None, html_page=False)
        return JSONResponse(_jobs_payload())

    @app.get("/api/jobs/{job}/checkpoints")
    async def api_checkpoints(job: str, request: Request):
        await _check(request, job, html_page=False)
        h = be.history(job)
        cps, sps, head = [r.to_dict() for r in h.checkpoints()], [r.to_dict() for r in h.savepoints()], h.head_id()
        restores = h.restores()
        lag = job_lag(job, cps, be.config().epoch_seconds, time.time())
        return JSONResponse({"job": job, "head": head, "control": h.control(), "checkpoints": cps,
                             "lag": {**(lag.now.to_dict() if lag.now else {}), "summary": lag.summary(),
                                     "recent_completion_delays_s": list(lag.recent_delays_s)},
                             "savepoints": sps, "restores": restores,
                             "counts": counts(cps, sps, restores=restores, triggered=h.triggered()),
                             "summary": summary(cps), "latest_failed": latest_failed(cps),
                             "lineage": lineage(cps, sps, head)})

    @app.get("/api/jobs/{job}/checkpoints/{checkpoint_id}")
    async def api_checkpoint(job: str, checkpoint_id: int, request: Request):
        await _check(request, job, html_page=False)
        try:
            return JSONResponse(be.history(job).detail(checkpoint_id))
        except ObjectNotFoundError as e:
            raise HTTPException(status_code=404, detail=str(e)) from None

    @app.exception_handler(EpochalError)
    async def epochal_error(request: Request, exc: EpochalError):
        log.warning("epochal plugin: %s", exc)
        return JSONResponse({"detail": f"{type(exc).__name__}: {exc}"}, status_code=500)

    return app
