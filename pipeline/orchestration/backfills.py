"""Backfills of an epoch DAG, created one at a time (Airflow allows one running backfill per DAG).

Airflow marks a backfill *completed* in a scheduler housekeeping pass (every 30 s) some time after its last
run finished; until then ``airflow backfill create`` for the same DAG fails with ``AlreadyRunningBackfill``.
Creating a backfill can also fail half-way on SQLite ("database is locked"): the backfill row is committed
before its runs, so a naive retry meets the orphan (the scheduler completes an orphan without runs after
about two minutes). :func:`create_backfill` handles both:

1. wait (a condition, polled) until no backfill of the DAG is running, saying which one and how many of
   its runs are unfinished;
2. ``POST /api/v2/backfills``; a 409 (another backfill started meanwhile) goes back to step 1;
3. a 503 / lock error: if the request did create the backfill (a backfill with our dates, newer than the newest
   one before the request, exists - completed or not), that backfill is ours - but Airflow may have committed only some of its runs before the error (seen under load:
   3 of 4 runs, then 503). The runs it should have created are known from a dry run before the request
   (``POST /api/v2/backfills/dry_run``); the runs it did create are the backfill runs of those dates queued since
   the backfill's ``created_at``. Every missing interval gets a backfill of its own, created (step 1) after the
   partial one completes, so the epochs still run in order and no interval is silently skipped. A backfill with no
   run at all is an orphan: wait until Airflow completes it (it is named as ours, not as "still running" someone
   else's), look at its runs again (runs that became visible meanwhile make it ours, as above), and only if it still
   has none retry from step 1.

:func:`wait_backfills_complete` waits until every backfill of a DAG is complete. Both talk to Airflow's REST
API with a user name and password (``POST /auth/token``); no Airflow import. CLI::

    python -m pipeline.orchestration.backfills create --url URL --dag-id D --from-date ISO --to-date ISO \\
        [--reprocess-behavior none|failed|completed] [--max-active-runs N]
    python -m pipeline.orchestration.backfills wait --url URL --dag-id D
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pipeline import settings
from pipeline.exceptions import ConfigError, EpochalError

__all__ = ["AirflowRestClient", "BackfillError", "create_backfill", "wait_backfills_complete", "active_backfills"]

UNFINISHED_RUN_STATES = ("queued", "running")


class BackfillError(EpochalError):
    """A backfill could not be created, or a running one did not complete in time."""


@dataclass
class AirflowRestClient:
    """A minimal Airflow 3 REST client (``/api/v2``) authenticated with a JWT from ``/auth/token``."""

    url: str
    username: str
    password: str
    timeout: float = 60.0
    _token: str | None = field(default=None, repr=False)

    def token(self) -> str:
        if self._token is None:
            status, d = self.request("POST", "/auth/token", {"username": self.username, "password": self.password},
                                     auth=False)
            if status >= 300:
                raise BackfillError(f"Airflow at {self.url}: login as {self.username!r} failed ({status}: {d})")
            self._token = d["access_token"]
        return self._token

    def request(self, method: str, path: str, body: Any = None, *, auth: bool = True) -> tuple[int, Any]:
        req = urllib.request.Request(self.url.rstrip("/") + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self.token()}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                text = r.read().decode()
                return r.status, (json.loads(text) if text else None)
        except urllib.error.HTTPError as e:
            text = e.read().decode()
            try:
                return e.code, json.loads(text)
            except ValueError:
                return e.code, text
        except urllib.error.URLError as e:
            raise BackfillError(f"cannot reach Airflow at {self.url}: {e.reason}") from None

    def get(self, path: str) -> Any:
        status, d = self.request("GET", path)
        if status >= 300:
            raise BackfillError(f"GET {path}: {status} {d}")
        return d


def active_backfills(client: AirflowRestClient, dag_id: str) -> list[dict]:
    """Backfills of ``dag_id`` that Airflow has not marked completed (they block a new backfill)."""
    d = client.get(f"/api/v2/backfills?dag_id={urllib.parse.quote(dag_id)}&limit=100")
    return [b for b in d["backfills"] if not b.get("completed_at")]


def _newest_backfill_id(client: AirflowRestClient, dag_id: str) -> int:
    """The id of the DAG's newest backfill, completed or not (0: none yet)."""
    d = client.get(f"/api/v2/backfills?dag_id={urllib.parse.quote(dag_id)}&order_by=-id&limit=1")
    return max([int(b["id"]) for b in d.get("backfills", [])], default=0)


def _backfills_since(client: AirflowRestClient, dag_id: str, newest: int) -> list[dict]:
    """The DAG's backfills created after the one with id ``newest``, completed or not (the runs of a partly created
    backfill may all have finished, and Airflow completed it, by the time its creator looks)."""
    d = client.get(f"/api/v2/backfills?dag_id={urllib.parse.quote(dag_id)}&order_by=-id&limit=100")
    return [b for b in d.get("backfills", []) if int(b["id"]) > newest]


def _unfinished_backfill_runs(client: AirflowRestClient, dag_id: str) -> int:
    q = "&".join(f"state={s}" for s in UNFINISHED_RUN_STATES)
    d = client.get(f"/api/v2/dags/{urllib.parse.quote(dag_id)}/dagRuns?run_type=backfill&{q}&limit=1")
    return int(d.get("total_entries", 0))


def _describe(b: dict, unfinished: int) -> str:
    what = (f"{unfinished} backfill run(s) of the DAG not finished yet" if unfinished else
            "all its runs are finished; Airflow marks it completed within about 30 s (a backfill whose "
            "creation failed half-way, with no runs, within about 2.5 min)")
    return (f"backfill {b['id']} of DAG {b['dag_id']} ({b['from_date']} .. {b['to_date']}) is still running: {what}")


def wait_backfills_complete(client: AirflowRestClient, dag_id: str, *, timeout: float = 1800.0, poll: float = 3.0,
                            echo: Callable[[str], None] = print, orphan: int | None = None) -> None:
    """Wait until no backfill of ``dag_id`` is running (Airflow allows one at a time). ``orphan``: the id of the
    backfill our own failed request left without runs; it is named as such, not as someone else's running backfill
    that the next one queues behind."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        active = active_backfills(client, dag_id)
        if not active:
            return
        if orphan is not None and int(active[0]["id"]) == orphan:
            b = active[0]
            msg = (f"backfill {b['id']} of DAG {b['dag_id']} ({b['from_date']} .. {b['to_date']}), left without runs "
                   "by our request that Airflow failed, is not completed yet (Airflow completes such a backfill "
                   "within about 2.5 min)")
            tail = "waiting for that, then checking it again before retrying the request"
        else:
            msg = _describe(active[0], _unfinished_backfill_runs(client, dag_id))
            tail = "waiting for it to complete before creating the next"
        if msg != last:
            echo(f"epochal: {msg}; {tail}")
            last = msg
        if time.monotonic() > deadline:
            raise BackfillError(f"{msg}; still not complete after {timeout:.0f} s (Airflow allows one running "
                                f"backfill per DAG: let it finish, or pause/cancel it in the UI)")
        time.sleep(poll)


def _iso(value: str | datetime) -> str:
    if isinstance(value, datetime):
        dt = value
    else:
        try:
            dt = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(f"backfill date {value!r}: expected an ISO-8601 timestamp") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _same_instant(a: str, b: str) -> bool:
    return _iso(a) == _iso(b)


def _planned_dates(client: AirflowRestClient, body: dict, deadline: float, poll: float) -> list[str]:
    """The logical dates the backfill ``body`` would create runs for (Airflow's dry run), as ISO instants."""
    while True:
        status, d = client.request("POST", "/api/v2/backfills/dry_run", body)
        if status < 300:
            return sorted(_iso(b["logical_date"]) for b in d.get("backfills", []) if b.get("logical_date"))
        if status not in (500, 503) and "locked" not in str(d):
            raise BackfillError(f"Airflow refused the dry run of the backfill of DAG {body['dag_id']} "
                                f"({body['from_date']} .. {body['to_date']}): {status} {d}")
        if time.monotonic() > deadline:
            raise BackfillError(f"could not dry-run the backfill of DAG {body['dag_id']}: {status} {d}")
        time.sleep(poll)


def _created_dates(client: AirflowRestClient, backfill: dict, planned: list[str]) -> set[str]:
    """The planned logical dates that have a backfill run queued since ``backfill`` was created (its runs: new or
    cleared runs get ``queued_at`` = now, on the same server clock as the backfill's ``created_at``)."""
    if not planned:
        return set()
    since = datetime.fromisoformat(str(backfill["created_at"]).replace("Z", "+00:00"))
    got: set[str] = set()
    offset = 0
    while True:   # pages of 100 (Airflow's default maximum page size)
        q = urllib.parse.urlencode({"run_type": "backfill", "logical_date_gte": planned[0],
                                    "logical_date_lte": planned[-1], "limit": 100, "offset": offset,
                                    "order_by": "logical_date"})
        d = client.get(f"/api/v2/dags/{urllib.parse.quote(backfill['dag_id'])}/dagRuns?{q}")
        runs = d.get("dag_runs", [])
        for r in runs:
            queued = r.get("queued_at")
            if r.get("logical_date") and queued and \
                    datetime.fromisoformat(str(queued).replace("Z", "+00:00")) >= since:
                got.add(_iso(r["logical_date"]))
        offset += len(runs)
        if not runs or offset >= int(d.get("total_entries", 0)):
            return got & set(planned)


def _contiguous(planned: list[str], missing: set[str]) -> list[tuple[str, str]]:
    """The missing dates as ``(first, last)`` ranges of consecutive planned dates, in order."""
    out: list[tuple[str, str]] = []
    last_i = -2
    for i, d in enumerate(planned):
        if d in missing:
            out[-1:] = [(out[-1][0], d)] if out and last_i == i - 1 else [*out[-1:], (d, d)]
            last_i = i
    return out


def create_backfill(client: AirflowRestClient, dag_id: str, from_date: str | datetime, to_date: str | datetime, *,
                    reprocess_behavior: str = "none", max_active_runs: int | None = None,
                    timeout: float = 1800.0, poll: float = 3.0, echo: Callable[[str], None] = print) -> dict:
    """Create a backfill once every earlier backfill of the DAG is complete; returns Airflow's backfill (with
    ``"continued_by"``: the ids of the backfills created for intervals a partly created one missed, in order).

    Over 8 parameters: Airflow's backfill fields plus the wait's timeout, poll and echo; all keywords."""
    if reprocess_behavior not in ("none", "failed", "completed"):
        raise ConfigError(f"--reprocess-behavior {reprocess_behavior!r}: expected none, failed or completed")
    body: dict[str, Any] = {"dag_id": dag_id, "from_date": _iso(from_date), "to_date": _iso(to_date),
                            "reprocess_behavior": reprocess_behavior}
    if max_active_runs is not None:
        if max_active_runs < 1:
            raise ConfigError(f"--max-active-runs {max_active_runs}: expected at least 1")
        body["max_active_runs"] = int(max_active_runs)
    deadline = time.monotonic() + timeout

    def ours(b: dict, got: set[str], planned: list[str], status: int | str) -> dict:
        """Backfill ``b``, created by our request although Airflow answered ``status``, with the runs ``got``."""
        missing = set(planned) - got
        if not missing:
            echo(f"epochal: backfill {b['id']} was created with all its {len(planned)} run(s) although "
                 f"Airflow answered {status}; using it")
            return b
        ranges = _contiguous(planned, missing)
        echo(f"epochal: backfill {b['id']} was created with only {len(got)} of its {len(planned)} runs before "
             f"Airflow answered {status}; missing logical dates {sorted(missing)[:5]}"
             f"{' ...' if len(missing) > 5 else ''}: each missing range gets a backfill of its own once "
             f"backfill {b['id']} completes")
        cont = []
        for first, last in ranges:
            c = create_backfill(client, dag_id, first, last, reprocess_behavior=reprocess_behavior,
                                max_active_runs=max_active_runs,
                                timeout=max(1.0, deadline - time.monotonic()), poll=poll, echo=echo)
            cont += [c["id"], *c.get("continued_by", [])]
        return {**b, "continued_by": cont}

    # a backfill our failed request left without (visible) runs: (backfill, planned dates, status of the answer)
    orphan: tuple[dict, list[str], int] | None = None
    while True:
        wait_backfills_complete(client, dag_id, timeout=max(1.0, deadline - time.monotonic()), poll=poll, echo=echo,
                                orphan=None if orphan is None else int(orphan[0]["id"]))
        if orphan is not None:
            # issue 34, item 9: the runs of the backfill our failed request created may have become visible while
            # it completed; then it is ours (its epochs ran), and creating the backfill again would run them twice
            b, planned, status = orphan
            got = _created_dates(client, b, planned)
            if got:
                return ours(b, got, planned, status)
            echo(f"epochal: backfill {b['id']} completed without runs; creating the backfill again")
            orphan = None
        planned = _planned_dates(client, body, deadline, poll)
        newest = _newest_backfill_id(client, dag_id)
        status, d = client.request("POST", "/api/v2/backfills", body)
        if status < 300:
            echo(f"epochal: created backfill {d['id']} of DAG {dag_id} ({body['from_date']} .. {body['to_date']}, "
                 f"reprocess {reprocess_behavior})")
            return d
        if status == 409:
            echo(f"epochal: another backfill of DAG {dag_id} started meanwhile; waiting for it")
        elif status in (500, 503) or "locked" in str(d):
            mine = [b for b in _backfills_since(client, dag_id, newest)
                    if _same_instant(b["from_date"], body["from_date"]) and _same_instant(b["to_date"], body["to_date"])]
            got = _created_dates(client, mine[0], planned) if mine else set()
            if got:
                return ours(mine[0], got, planned, status)
            if mine:
                orphan = (mine[0], planned, status)
                echo(f"epochal: Airflow answered {status} ({d}) and left backfill {mine[0]['id']} without runs; "
                     f"once Airflow completes it, it is checked again, and the backfill is created again only if "
                     "it still has no run")
            else:
                echo(f"epochal: creating the backfill failed transiently ({status}: {d}); no backfill was created; "
                     "retrying")
        else:
            raise BackfillError(f"Airflow refused the backfill of DAG {dag_id} ({body['from_date']} .. "
                                f"{body['to_date']}): {status} {d}")
        if time.monotonic() > deadline:
            raise BackfillError(f"could not create the backfill of DAG {dag_id} within {timeout:.0f} s")
        time.sleep(poll)


def _client(args) -> AirflowRestClient:
    password = args.password or settings.raw("EPOCHAL_AIRFLOW_PASSWORD")
    if not password and args.password_file:
        try:
            password = json.loads(Path(args.password_file).read_text())[args.username]
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"cannot read the password of {args.username!r} from {args.password_file}: {e}") from None
    if not password:
        raise ConfigError("no Airflow password: pass --password, --password-file or EPOCHAL_AIRFLOW_PASSWORD")
    return AirflowRestClient(args.url, args.username, password)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.orchestration.backfills", description=__doc__.split("\n")[0])
    p.add_argument("--url", default=settings.raw("AIRFLOW__API__BASE_URL") or "http://127.0.0.1:8080")
    p.add_argument("--username", default="admin")
    p.add_argument("--password")
    p.add_argument("--password-file")
    p.add_argument("--timeout", type=float, default=1800.0)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("create", help="wait for running backfills of the DAG, then create one")
    c.add_argument("--dag-id", required=True)
    c.add_argument("--from-date", required=True)
    c.add_argument("--to-date", required=True)
    c.add_argument("--reprocess-behavior", default="none")
    c.add_argument("--max-active-runs", type=int)
    c.add_argument("--wait", action="store_true", help="also wait until the new backfill is complete")
    w = sub.add_parser("wait", help="wait until no backfill of the DAG is running")
    w.add_argument("--dag-id", required=True)
    args = p.parse_args(argv)
    echo = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        client = _client(args)
        if args.cmd == "create":
            b = create_backfill(client, args.dag_id, args.from_date, args.to_date,
                                reprocess_behavior=args.reprocess_behavior, max_active_runs=args.max_active_runs,
                                timeout=args.timeout, echo=echo)
            if args.wait:
                wait_backfills_complete(client, args.dag_id, timeout=args.timeout, echo=echo)
            print(json.dumps(b, default=str))
        else:
            wait_backfills_complete(client, args.dag_id, timeout=args.timeout, echo=echo)
    except ConfigError as e:
        print(f"epochal: {e}", file=sys.stderr)
        return 2
    except (BackfillError, OSError) as e:
        print(f"epochal: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
