"""A backfill Airflow created only partly before answering 503 (seen under load with a real scheduler: 3 of 4 runs,
then "database is locked") must not be taken as complete: the missing intervals get backfills of their own, after
the partial one completes, in order.

Airflow cannot be made to fail half-way on demand, so this drives :func:`create_backfill` against a small HTTP
server that speaks the part of Airflow's REST API it uses (``/auth/token``, ``/api/v2/backfills``, ``.../dry_run``,
``/api/v2/dags/<dag>/dagRuns``) with Airflow's response shapes; the real scheduler tests
(tests/airflow/test_real_airflow.py) run the same code against a real Airflow.
"""
from __future__ import annotations

import json
import threading
import urllib.parse
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipeline.orchestration.backfills import AirflowRestClient, create_backfill

pytestmark = pytest.mark.unit

DAG = "epochal_users_job"
T0 = datetime(2026, 11, 26, 8, tzinfo=UTC)
HOURS = [T0 + timedelta(hours=h) for h in range(4)]


def _z(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(s: str) -> datetime:
    return datetime.fromisoformat(s.replace("Z", "+00:00"))


class FakeAirflow:
    """Backfills and backfill runs of one DAG with hourly runs. ``fail_after``: the first creation commits the
    backfill row and that many runs, then answers 503 (None: no failure). ``orphan_polls``: a backfill without runs
    is completed by the housekeeping only after that many listings of the backfills (a real Airflow: about 2.5 min).
    ``hidden_polls``: the runs the failing creation committed show in the run listing only after that many listings
    of the backfills (they were not visible yet when the 503 came back)."""

    def __init__(self, fail_after: int | None, *, orphan_polls: int = 0, hidden_polls: int = 0) -> None:
        self.fail_after = fail_after
        self.orphan_polls = orphan_polls
        self.hidden_polls = hidden_polls
        self.listings = 0
        self.hidden_until: dict[str, int] = {}   # logical date -> listings after which the run is visible
        self.created_at_listing: dict[int, int] = {}
        self.backfills: list[dict] = []
        self.runs: dict[str, dict] = {}          # logical date -> run
        self.created: list[tuple[int, str]] = []  # (backfill id, logical date) in creation order
        self.posts = 0
        self.clock = datetime(2026, 11, 26, 12, tzinfo=UTC)
        self.lock = threading.Lock()

    def now(self) -> str:
        self.clock += timedelta(milliseconds=10)
        return self.clock.isoformat()

    def planned(self, body: dict) -> list[datetime]:
        lo, hi = _parse(body["from_date"]), _parse(body["to_date"])
        return [h for h in HOURS if lo <= h <= hi]

    def handle(self, method: str, path: str, body: dict | None) -> tuple[int, object]:
        with self.lock:
            u = urllib.parse.urlparse(path)
            q = urllib.parse.parse_qs(u.query)
            if u.path == "/auth/token":
                return 201, {"access_token": "t"}
            if u.path == "/api/v2/backfills" and method == "GET":
                self.listings += 1
                for b in self.backfills:   # the scheduler's housekeeping: a backfill whose runs are done completes
                    mine = [d for (i, d) in self.created if i == b["id"]]
                    if mine and any(self.listings < self.hidden_until.get(d, 0) for d in mine):
                        continue
                    if not mine and self.listings - self.created_at_listing[b["id"]] < self.orphan_polls:
                        continue
                    if b["completed_at"] is None and all(self.runs[d]["state"] == "success" for d in mine):
                        b["completed_at"] = self.now()
                bs = sorted(self.backfills, key=lambda b: -b["id"]) if q.get("order_by") == ["-id"] else self.backfills
                lim = int(q.get("limit", ["100"])[0])
                return 200, {"backfills": bs[:lim], "total_entries": len(self.backfills)}
            if u.path == "/api/v2/backfills/dry_run":
                return 200, {"backfills": [{"logical_date": _z(h)} for h in self.planned(body or {})],
                             "total_entries": len(self.planned(body or {}))}
            if u.path == "/api/v2/backfills" and method == "POST":
                assert body is not None
                self.posts += 1
                if any(b["completed_at"] is None for b in self.backfills):
                    return 409, {"detail": "There is already a running backfill"}
                b = {"id": len(self.backfills) + 1, "dag_id": DAG, "from_date": body["from_date"],
                     "to_date": body["to_date"], "created_at": self.now(), "completed_at": None}
                self.backfills.append(b)
                self.created_at_listing[b["id"]] = self.listings
                planned = self.planned(body)
                fail = self.fail_after is not None and self.posts == 1
                for h in planned[:self.fail_after] if fail else planned:
                    # the runs finish at once, as if the scheduler ran them (so the housekeeping completes it)
                    self.runs[_z(h)] = {"logical_date": _z(h), "queued_at": self.now(), "state": "success",
                                        "run_type": "backfill"}
                    self.created.append((b["id"], _z(h)))
                    if fail and self.hidden_polls:
                        self.hidden_until[_z(h)] = self.listings + self.hidden_polls
                if fail:
                    return 503, {"detail": "Database is locked. Backfill creation is not supported on SQLite"}
                return 200, b
            if u.path == f"/api/v2/dags/{DAG}/dagRuns":
                lo = _parse(q["logical_date_gte"][0]) if "logical_date_gte" in q else HOURS[0]
                hi = _parse(q["logical_date_lte"][0]) if "logical_date_lte" in q else HOURS[-1]
                rs = [r for d, r in sorted(self.runs.items()) if lo <= _parse(d) <= hi
                      and self.listings >= self.hidden_until.get(d, 0)
                      and (q.get("run_type") is None or r["run_type"] in q["run_type"])
                      and (q.get("state") is None or r["state"] in q["state"])]
                off, lim = int(q.get("offset", ["0"])[0]), int(q.get("limit", ["100"])[0])
                return 200, {"dag_runs": rs[off:off + lim], "total_entries": len(rs)}
            return 404, {"detail": f"{method} {path}"}


@pytest.fixture()
def fake():
    def serve(fail_after, **kw):
        f = FakeAirflow(fail_after, **kw)

        class H(BaseHTTPRequestHandler):
            def _do(self, method):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                status, d = f.handle(method, self.path, body)
                out = json.dumps(d).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_GET(self):
                self._do("GET")

            def do_POST(self):
                self._do("POST")

            def log_message(self, *a):
                pass

        srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f, AirflowRestClient(f"http://127.0.0.1:{srv.server_port}", "admin", "pw")

    servers: list = []
    yield serve
    for s in servers:
        s.shutdown()
        s.server_close()  # the listening socket


def test_partly_created_backfill_gets_its_missing_intervals_backfilled_after_it(fake):
    f, client = fake(3)
    said: list[str] = []
    b = create_backfill(client, DAG, _z(HOURS[0]), _z(HOURS[-1]), reprocess_behavior="completed", poll=0.01,
                        timeout=30, echo=said.append)
    # every interval has exactly one run; the missing one comes from a second backfill created after the first
    assert [d for _, d in f.created] == [_z(h) for h in HOURS]
    assert [i for i, _ in f.created] == [1, 1, 1, 2]
    assert b["id"] == 1 and b["continued_by"] == [2]
    assert f.backfills[1]["from_date"] == f.backfills[1]["to_date"] == _z(HOURS[3])
    assert any("only 3 of its 4 runs" in m and _z(HOURS[3]) in m for m in said), said


def test_backfill_created_whole_despite_503_is_used_as_it_is(fake):
    f, client = fake(4)
    b = create_backfill(client, DAG, _z(HOURS[0]), _z(HOURS[-1]), poll=0.01, timeout=30, echo=lambda m: None)
    assert b["id"] == 1 and "continued_by" not in b and f.posts == 1
    assert [d for _, d in f.created] == [_z(h) for h in HOURS]


def test_orphan_backfill_without_runs_is_retried_whole(fake):
    f, client = fake(0)
    b = create_backfill(client, DAG, _z(HOURS[0]), _z(HOURS[-1]), poll=0.01, timeout=30, echo=lambda m: None)
    assert b["id"] == 2 and f.posts == 2   # the orphan (no run) completed, then the whole backfill again
    assert [(i, d) for i, d in f.created] == [(2, _z(h)) for h in HOURS]


def test_orphan_is_named_as_ours_not_as_a_running_backfill_then_retried(fake):
    """Issue 34, item 9: after a 503 that left an orphan (a backfill row without runs), the wrapper used to say
    "creating the backfill failed transiently; retrying", then "backfill 1 ... is still running ...; waiting for it
    to complete before creating the next", then "created backfill 2": three messages that contradict each other.
    Now every message names backfill 1 as the one our failed request left, and says what happens next."""
    f, client = fake(0, orphan_polls=3)
    said: list[str] = []
    b = create_backfill(client, DAG, _z(HOURS[0]), _z(HOURS[-1]), poll=0.01, timeout=30, echo=said.append)
    assert b["id"] == 2 and f.posts == 2
    assert [(i, d) for i, d in f.created] == [(2, _z(h)) for h in HOURS]
    assert not any("still running" in m or "before creating the next" in m for m in said), said
    assert not any("failed transiently" in m for m in said), said
    assert "left backfill 1 without runs" in said[0], said
    assert any("backfill 1" in m and "left without runs by our request" in m for m in said), said
    assert any("backfill 1 completed without runs; creating the backfill again" in m for m in said), said
    assert said[-1].startswith("epochal: created backfill 2"), said


def test_runs_that_show_up_late_make_the_backfill_ours_not_a_second_one(fake):
    """The 503'd request did create all runs, but they were not in the run listing yet when the wrapper looked.
    Creating the backfill again would run every interval twice (and the wrapper said "created" after "waiting");
    the backfill is looked at again once it completes, and used."""
    f, client = fake(4, hidden_polls=3)
    said: list[str] = []
    b = create_backfill(client, DAG, _z(HOURS[0]), _z(HOURS[-1]), poll=0.01, timeout=30, echo=said.append)
    assert b["id"] == 1 and f.posts == 1 and "continued_by" not in b, said
    assert [(i, d) for i, d in f.created] == [(1, _z(h)) for h in HOURS]
    assert not any("created backfill" in m for m in said), said
    assert "all its 4 run(s) although Airflow answered 503" in said[-1], said
