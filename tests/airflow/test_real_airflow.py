"""The real thing: ``scripts/airflow_standalone.sh`` (moto S3 + demo data + ``airflow standalone``), driven
through the REST API and ``airflow_standalone.sh backfill`` (Airflow's REST API), then the checkpoint view in headless Chromium.

Timeline (epoch = 1 h; demo data e0..e3 for the 4 hours before the last full hour H; the epoch DAG's start
date is e0's start and its end date e1's start, so the scheduler itself runs e0 and e1 and nothing after):

1. normal runs: the DAG is turned on (REST) and the scheduler runs the intervals of e0 and e1, one
   checkpointed epoch each, in order;
2. a backfill over e2..e3 (not processed yet; Airflow runs backfill runs in parallel):
   processed in order, one checkpoint per interval;
3. a backfill with ``--reprocess-behavior completed`` over e2, created as soon as the first one's runs are
   done (Epochal waits until Airflow marks that backfill complete): rewinds to the checkpoint of e1,
   re-processes e2, and processes forward to e3 again;
4. the savepoint DAG (REST trigger with params); 5. the restore DAG from that savepoint, parallelism 2.

The exported committed output must equal the independent oracle over all input, exactly once. Stopping
the script must leave no process behind.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from af_helpers import REPO, committed_vs_oracle, copy_db, free_port

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.e2e, pytest.mark.spark, pytest.mark.s3]

SCRIPT = REPO / "scripts" / "airflow_standalone.sh"
E = 3600
DAG = "epochal_orders_payments"
ARTIFACTS = REPO / "tests" / "artifacts"


@dataclass
class Instance:
    url: str
    home: Path
    env: dict
    endpoint: str
    password: str
    hour: datetime          # H: the demo data covers [H - 4h, H)
    pgids: list[int]
    _token: str | None = None

    @property
    def e0(self) -> int:
        return int((self.hour - timedelta(hours=4)).timestamp()) // E

    def iso(self, dt: datetime) -> str:
        return dt.strftime("%Y-%m-%dT%H:%M:%SZ")

    def token(self) -> str:
        if self._token is None:
            _, d = self.request("POST", "/auth/token", {"username": "admin", "password": self.password}, auth=False)
            self._token = d["access_token"]
        return self._token

    def request(self, method: str, path: str, body=None, *, auth: bool = True, raw: bool = False):
        req = urllib.request.Request(self.url + path, method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
        req.add_header("Content-Type", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self.token()}")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                text = r.read().decode()
                return r.status, (text if raw else json.loads(text) if text else None)
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def ok(self, method: str, path: str, body=None):
        status, d = self.request(method, path, body)
        assert status < 300, f"{method} {path}: {status} {d}"
        return d

    def airflow_cli(self, *args: str, timeout: float = 180, attempts: int = 4) -> subprocess.CompletedProcess:
        """Run an ``airflow`` CLI command against this instance. SQLite allows one writer: while the
        scheduler writes, a CLI transaction can fail with "database is locked" (rolled back, nothing
        written), so that one error is retried; any other failure fails the test at once."""
        for attempt in range(1, attempts + 1):
            p = subprocess.run(["bash", str(SCRIPT), "airflow", *args], env=self.env, capture_output=True,
                               text=True, timeout=timeout)
            if p.returncode == 0 or "database is locked" not in p.stdout + p.stderr or attempt == attempts:
                break
            print(f"[airflow] `airflow {' '.join(args)}`: database is locked (attempt {attempt}); retrying")
            time.sleep(5 * attempt)
        assert p.returncode == 0, f"airflow {' '.join(args)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        return p

    def runs(self, dag_id: str = DAG) -> list[dict]:
        return self.ok("GET", f"/api/v2/dags/{dag_id}/dagRuns?order_by=logical_date&limit=100")["dag_runs"]

    def wait_runs(self, dag_id: str, pred, timeout: float, what: str) -> list[dict]:
        deadline = time.monotonic() + timeout
        while True:
            runs = self.runs(dag_id)
            failed = [r for r in runs if r["state"] == "failed"]
            assert not failed, f"{what}: failed runs {[(r['dag_run_id'], r['state']) for r in failed]}\n" + \
                self.diagnose(dag_id, failed[0]["dag_run_id"])
            if pred(runs):
                return runs
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: timed out; runs {[(r['logical_date'], r['state']) for r in runs]}")
            time.sleep(3)

    def backfill(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
        """``airflow_standalone.sh backfill``: Epochal's backfill creation, which waits until the DAG's previous
        backfill is complete (Airflow allows one running backfill per DAG) and survives SQLite lock errors."""
        p = subprocess.run(["bash", str(SCRIPT), "backfill", *args], env=self.env, capture_output=True,
                           text=True, timeout=timeout)
        assert p.returncode == 0, f"backfill {' '.join(args)} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        print(f"[airflow] backfill {' '.join(args)}:\n{p.stderr.strip()}")
        return p

    def tis(self, dag_id: str, run_id: str) -> dict[str, dict]:
        d = self.ok("GET", f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id, safe='')}/taskInstances")
        return {t["task_id"]: t for t in d["task_instances"]}

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value"):
        d = self.ok("GET", f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id, safe='')}/taskInstances/"
                           f"{task_id}/xcomEntries/{key}?deserialize=true")
        v = d["value"]
        return json.loads(v) if isinstance(v, str) and v[:1] in "{[" else v

    def diagnose(self, dag_id: str, run_id: str) -> str:
        out = []
        for tid, ti in self.tis(dag_id, run_id).items():
            out.append(f"{tid}: {ti['state']} try {ti['try_number']}")
            if ti["state"] in ("failed", "up_for_retry"):
                logs = sorted((self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={tid}").glob("*.log"))
                if logs:
                    out.append(logs[-1].read_text()[-4000:])
        return "\n".join(out)


def _stop(env: dict) -> None:
    subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True, text=True, timeout=120)


def _instance(airflow_db_template, tmp_path_factory, extra_env: dict | None = None, logs: str = "real_airflow_logs"):
    home = tmp_path_factory.mktemp("standalone")
    copy_db(airflow_db_template, home)
    port = free_port()
    now = datetime.now(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "PIPELINE_", "AWS_", "EPOCHAL_"))}
    env.update({
        "EPOCHAL_AIRFLOW_HOME": str(home), "AIRFLOW_PORT": str(port), "PIPELINE_EPOCH_SECONDS": str(E),
        "EPOCHAL_DEMO_EPOCHS": "4", "EPOCHAL_DEMO_ORDERS_PER_EPOCH": "250", "EPOCHAL_DEMO_PARTITIONS": "2",
        "PIPELINE_PARALLELISM": "1", "EPOCHAL_START_DATE": (hour - timedelta(hours=4)).isoformat(),
        "EPOCHAL_END_DATE": (hour - timedelta(hours=3)).isoformat(), "EPOCHAL_CATCHUP": "true", "EPOCHAL_POKE_SECONDS": "3", "EPOCHAL_DAG_RETRY_DELAY_SECONDS": "5",
        "EPOCHAL_READY_TIMEOUT": "300",
        # the default DAG (trigger >> epoch, fused) on the script's Spark Connect server, on a port of its own
        "EPOCHAL_CONNECT_PORT": str(free_port()), "EPOCHAL_CONNECT_MASTER": "local[2]",
        **(extra_env or {}),
    })
    t0 = time.monotonic()
    p = subprocess.run(["bash", str(SCRIPT), "start", "-d"], env=env, capture_output=True, text=True, timeout=420)
    state = home / "epochal-standalone"
    pgids = [int((state / f).read_text()) for f in ("airflow.pgid", "moto.pgid", "connect.pgid") if (state / f).exists()]
    if p.returncode != 0:
        _stop(env)
        log = (state / "standalone.log").read_text()[-4000:] if (state / "standalone.log").exists() else ""
        raise AssertionError(f"airflow_standalone.sh start failed:\n{p.stderr[-4000:]}\n{log}")
    print(f"[airflow] standalone ready in {time.monotonic() - t0:.0f}s on port {port}")
    assert "Airflow UI" in p.stderr and "admin" in p.stderr, p.stderr
    password = json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"]
    inst = Instance(url=f"http://127.0.0.1:{port}", home=home, env=env, endpoint=(state / "endpoint").read_text().strip(),
                    password=password, hour=hour, pgids=pgids)
    try:
        yield inst
    finally:
        t1 = time.monotonic()
        _stop(env)
        _keep_logs(home, logs)
        print(f"[airflow] stopped in {time.monotonic() - t1:.0f}s")
        left = []
        for g in pgids:
            try:
                os.killpg(g, 0)
                left.append(g)
            except ProcessLookupError:
                pass
        for g in left:
            os.killpg(g, signal.SIGKILL)
        assert not left, f"processes left in process groups {left} after 'airflow_standalone.sh stop'"


@pytest.fixture(scope="module")
def airflow(airflow_db_template, tmp_path_factory):
    yield from _instance(airflow_db_template, tmp_path_factory)


def _keep_logs(home: Path, name: str = "real_airflow_logs") -> None:
    """Copy the instance's logs to tests/artifacts/<name> (for post-mortems; git-ignored)."""
    import shutil
    dest = ARTIFACTS / name
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    state = home / "epochal-standalone"
    for f in ("standalone.log", "moto.err", "generate.json"):
        if (state / f).exists():
            shutil.copy2(state / f, dest / f)
    if (home / "logs").exists():
        shutil.copytree(home / "logs", dest / "logs", dirs_exist_ok=True)


def _s3(inst: Instance):
    from pipeline.fileio import S3FileIO
    return S3FileIO(endpoint_url=inst.endpoint, access_key_id="testing", secret_access_key="testing",
                    region="us-east-1")


def _processed(inst: Instance, run_id: str) -> dict:
    """What the epoch run's process step returned (the default fused DAG: the ``epoch`` task's ``process``)."""
    return inst.xcom(DAG, run_id, "epoch")["process"]


def _store(inst: Instance):
    from pipeline.checkpoint.store import CompletedCheckpointStore
    return CompletedCheckpointStore(_s3(inst), "s3://epochal/demo/checkpoints/orders_payments", job="orders_payments")


def _exactly_once(inst: Instance, *, all_input: bool = False):
    from pipeline.testing.moto_server import _patched_env, s3_env
    with _patched_env(s3_env(inst.endpoint)):  # the oracle reads S3 with pyarrow from the AWS_* env
        report, md = committed_vs_oracle("s3://epochal/demo/sources", "s3://epochal/demo/sinks",
                                         "s3://epochal/demo/checkpoints", fileio=_s3(inst))
        assert report.ok, json.dumps(report.to_dict(), default=str)[:3000]
        if all_input:
            from pipeline.demo import oracle
            from pipeline.sink.table import CommittedTable
            full = oracle.compare(oracle.expected("s3://epochal/demo/sources"), {
                t: CommittedTable(_s3(inst), "s3://epochal/demo/sinks", "orders_payments", t).read()
                for t in ("paid_orders", "merchant_revenue")})
            assert full.ok, json.dumps(full.to_dict(), default=str)[:3000]
    return md


def test_real_scheduler_rest_api_and_backfills(airflow):
    inst = airflow
    H = inst.hour
    e0 = inst.e0
    t0 = time.monotonic()
    assert inst.ok("GET", "/api/v2/importErrors")["total_entries"] == 0
    for dag_id in (DAG, f"{DAG}_savepoint", f"{DAG}_restore"):
        inst.ok("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})

    # 1. normal runs: the scheduler runs the intervals of e0 and e1 once the DAG is on
    inst.wait_runs(DAG, lambda rs: len(rs) == 2 and all(r["state"] == "success" for r in rs), 600, "normal runs")
    runs = inst.runs()
    assert [r["run_type"] for r in runs] == ["scheduled", "scheduled"]
    procs = [_processed(inst, r["dag_run_id"]) for r in runs]
    assert [(q["action"], q["epochs"]) for q in procs] == [("start", [e0]), ("continue", [e0 + 1])], procs
    assert [c.epoch for c in _store(inst).list()] == [e0, e0 + 1]
    _exactly_once(inst)
    print(f"[airflow] normal runs done at {time.monotonic() - t0:.0f}s")

    # 2. backfill over intervals not processed yet (e2, e3): in order, one checkpoint each
    inst.backfill("--dag-id", DAG, "--from-date", inst.iso(H - timedelta(hours=2)),
                  "--to-date", inst.iso(H - timedelta(hours=1)))
    runs = inst.wait_runs(DAG, lambda rs: len(rs) == 4 and all(r["state"] == "success" for r in rs), 900, "backfill")
    bf = [r for r in runs if r["run_type"] == "backfill"]
    assert len(bf) == 2
    procs = [_processed(inst, r["dag_run_id"]) for r in sorted(bf, key=lambda r: r["logical_date"])]
    assert [q["epochs"] for q in procs] == [[e0 + 2], [e0 + 3]], procs
    assert procs[0]["checkpoint_id"] < procs[1]["checkpoint_id"]
    cps = _store(inst).list()
    assert [c.epoch for c in cps] == [e0, e0 + 1, e0 + 2, e0 + 3]
    assert [c.parent_id for c in cps[1:]] == [c.checkpoint_id for c in cps[:-1]]
    _exactly_once(inst)
    print(f"[airflow] backfill done at {time.monotonic() - t0:.0f}s")

    # 3. re-run of a completed interval (e2): rewind to e1's checkpoint, re-process e2, forward to e3
    head = _store(inst).latest()
    e1_id = next(c.checkpoint_id for c in cps if c.epoch == e0 + 1)
    target = next(r for r in bf if r["logical_date"].startswith(inst.iso(H - timedelta(hours=2))[:19]))
    # created right after the first backfill's runs finished: Airflow has usually not marked that backfill
    # completed yet; Epochal waits for it (a condition) and says so, instead of meeting AlreadyRunningBackfill
    p = inst.backfill("--dag-id", DAG, "--from-date", inst.iso(H - timedelta(hours=2)),
                      "--to-date", inst.iso(H - timedelta(hours=2)), "--reprocess-behavior", "completed")
    assert "epochal: created backfill" in p.stderr, p.stderr
    assert "AlreadyRunningBackfill" not in p.stderr

    def rerun_done(rs):
        r = next(x for x in rs if x["dag_run_id"] == target["dag_run_id"])
        return r["state"] == "success" and r["end_date"] != target["end_date"]
    inst.wait_runs(DAG, rerun_done, 900, "re-run")
    p = _processed(inst, target["dag_run_id"])
    assert p["action"] == "rewind" and p["rewound_to"] == e1_id, p
    assert p["epochs"] == [e0 + 2, e0 + 3] and p["forwarded_to"] == e0 + 3, p
    new_head = _store(inst).latest()
    assert new_head.epoch == head.epoch and new_head.checkpoint_id > head.checkpoint_id
    _exactly_once(inst, all_input=True)
    print(f"[airflow] re-run done at {time.monotonic() - t0:.0f}s")

    # 4. savepoint through the params form (REST: conf)
    sp_run = inst.ok("POST", f"/api/v2/dags/{DAG}_savepoint/dagRuns",
                     {"logical_date": None, "conf": {"target": None, "stop_after_savepoint": False}})
    inst.wait_runs(f"{DAG}_savepoint", lambda rs: rs and all(r["state"] == "success" for r in rs), 600, "savepoint")
    loc = inst.xcom(f"{DAG}_savepoint", sp_run["dag_run_id"], "savepoint", "savepoint_location")
    assert loc.startswith("s3://epochal/demo/checkpoints/orders_payments/savepoints/sp-"), loc
    sp_logs = (inst.home / "logs" / f"dag_id={DAG}_savepoint" / f"run_id={sp_run['dag_run_id']}"
               / "task_id=savepoint").glob("*.log")
    assert any(loc in p.read_text() for p in sp_logs), "the savepoint location must be in the task log"
    print(f"[airflow] savepoint done at {time.monotonic() - t0:.0f}s: {loc}")

    # 5. restore from it with another parallelism; validation runs after the restore
    rs_run = inst.ok("POST", f"/api/v2/dags/{DAG}_restore/dagRuns",
                     {"logical_date": None, "conf": {"from": loc, "parallelism": 2, "allow_non_restored_state": False}})
    inst.wait_runs(f"{DAG}_restore", lambda rs: rs and all(r["state"] == "success" for r in rs), 600, "restore")
    tis = inst.tis(f"{DAG}_restore", rs_run["dag_run_id"])
    assert tis["validate"]["state"] == "success"
    restored = inst.xcom(f"{DAG}_restore", rs_run["dag_run_id"], "restore")
    assert restored["parallelism"] == 2 and restored["epoch"] == e0 + 3
    md = _exactly_once(inst, all_input=True)
    assert md.checkpoint_id == restored["checkpoint_id"] and md.parallelism == 2
    print(f"[airflow] restore done at {time.monotonic() - t0:.0f}s")

    # the plugin's JSON API behind Airflow auth
    assert inst.request("GET", "/epochal/api/jobs/orders_payments/checkpoints", auth=False)[0] == 401
    hist = inst.ok("GET", "/epochal/api/jobs/orders_payments/checkpoints")
    assert hist["head"] == restored["checkpoint_id"]
    assert any(s["location"] == loc for s in hist["savepoints"])


@pytest.mark.skipif(not os.environ.get("EPOCHAL_AIRFLOW_FULL"),
                    reason="opt-in (~3 min): EPOCHAL_AIRFLOW_FULL=1; by default the ordering of operations and "
                           "epoch runs is tested in tests/airflow/test_orchestration_units.py")
def test_real_scheduler_restore_while_epochs_run(airflow):
    """A restore triggered while a backfill's epoch runs are processing waits for the started epoch, goes
    before the epochs not yet started, and nothing fails, retries or is fenced; output stays exactly-once."""
    inst = airflow
    H = inst.hour
    for dag_id in (DAG, f"{DAG}_savepoint", f"{DAG}_restore"):
        inst.ok("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    inst.wait_runs(DAG, lambda rs: len(rs) >= 2 and all(r["state"] == "success" for r in rs), 600, "normal runs")
    first = _store(inst).list()[0]
    before = {r["dag_run_id"] for r in inst.runs(f"{DAG}_restore")}
    # re-process every interval (rewind, then forward): epoch runs for a while
    inst.backfill("--dag-id", DAG, "--from-date", inst.iso(H - timedelta(hours=4)),
                  "--to-date", inst.iso(H - timedelta(hours=1)), "--reprocess-behavior", "completed",
                  "--max-active-runs", "2")
    deadline = time.monotonic() + 600
    while True:  # wait until an epoch run is processing
        running = [r for r in inst.runs() if r["state"] == "running"]
        if any(inst.tis(DAG, r["dag_run_id"]).get("epoch", {}).get("state") == "running" for r in running):
            break
        assert time.monotonic() < deadline, "no epoch run started processing"
        time.sleep(1)
    rs_run = inst.ok("POST", f"/api/v2/dags/{DAG}_restore/dagRuns",
                     {"logical_date": None, "conf": {"from": str(first.checkpoint_id), "parallelism": 1,
                                                     "allow_non_restored_state": False}})
    inst.wait_runs(f"{DAG}_restore", lambda rs: all(r["state"] == "success" for r in rs
                                                    if r["dag_run_id"] not in before), 900, "restore")
    inst.wait_runs(DAG, lambda rs: all(r["state"] == "success" for r in rs), 900, "epochs after the restore")
    tis = inst.tis(f"{DAG}_restore", rs_run["dag_run_id"])
    assert tis["validate"]["state"] == "success", tis

    def failed_tries(dag_id: str, run_id: str, task_id: str) -> list:
        d = inst.ok("GET", f"/api/v2/dags/{dag_id}/dagRuns/{urllib.request.quote(run_id, safe='')}/taskInstances/"
                           f"{task_id}/tries")
        return [t["try_number"] for t in d["task_instances"] if t["state"] in ("failed", "up_for_retry")]
    assert not failed_tries(f"{DAG}_restore", rs_run["dag_run_id"], "restore")
    for r in inst.runs():
        for tid in ("trigger", "epoch"):
            assert not failed_tries(DAG, r["dag_run_id"], tid), (r["dag_run_id"], tid)
    logs = "\n".join(p.read_text() for p in (inst.home / "logs").rglob("*.log"))
    assert "CheckpointFencedError" not in logs
    _exactly_once(inst, all_input=True)


@pytest.mark.browser
def test_checkpoint_view_in_headless_chromium(airflow):
    """The plugin's view in the real Airflow UI (nav entry, iframe), logged in with an Airflow token."""
    import shutil
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    if not chromium or not driver_bin:
        pytest.skip("Debian chromium + chromium-driver are not installed")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait
    inst = airflow
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", "--window-size=1600,1000",
              f"--user-data-dir={inst.home / 'chromium-profile'}"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(executable_path=driver_bin), options=opts)
    try:
        wait = WebDriverWait(drv, 90)
        # anonymous: the checkpoint page redirects to Airflow's login
        drv.get(f"{inst.url}/epochal/jobs/orders_payments/")
        wait.until(lambda d: "/auth/login" in d.current_url or "login" in d.current_url.lower())
        # log in through Airflow's login form
        wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "input[type=password]")))
        user = drv.find_element(By.CSS_SELECTOR, "input[name=username], input[type=text]")
        user.send_keys("admin")
        drv.find_element(By.CSS_SELECTOR, "input[type=password]").send_keys(inst.password)
        drv.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait.until(lambda d: any(c["name"] == "_token" for c in d.get_cookies()))
        # the nav view inside the Airflow UI
        drv.get(f"{inst.url}/plugin/epochal-checkpoints")
        frame = wait.until(EC.presence_of_element_located((By.CSS_SELECTOR, "iframe[title='Epochal checkpoints']")))
        drv.switch_to.frame(frame)
        wait.until(EC.presence_of_element_located((By.LINK_TEXT, "orders_payments"))).click()
        wait.until(EC.text_to_be_present_in_element((By.TAG_NAME, "h1"), "Checkpoint history: orders_payments"))
        body = drv.find_element(By.TAG_NAME, "body").text
        for text in ("COMPLETED", "latest", "Savepoints", "Trigger time", "Duration", "Checkpointed / full size",
                     "Alignment",
                     "paid_orders_join", "merchant_revenue_agg", "Summary (completed checkpoints)", "Minimum",
                     "Maximum", "Latest restore", "Abandoned branch", "Configuration",
                     "Checkpointing mode", "Airflow runs of", "auto-refresh every"):
            assert text in body, f"{text!r} not on the checkpoint page:\n{body[:2000]}"
        head = _store(inst).latest()
        drv.switch_to.default_content()
        drv.save_screenshot(str(ARTIFACTS / "airflow_checkpoint_history.png"))
        # the view is registered in the UI nav: under "Browse", as "Epochal checkpoints"
        assert "/plugin/epochal-checkpoints" in drv.current_url
        assert "Browse" in drv.find_element(By.TAG_NAME, "body").text
        plugins = inst.ok("GET", "/api/v2/plugins")["plugins"]
        views = [v for p in plugins for v in p["external_views"] if v["url_route"] == "epochal-checkpoints"]
        assert views and views[0]["destination"] == "nav" and views[0]["category"] == "browse"
        # a detail page
        drv.get(f"{inst.url}/epochal/jobs/orders_payments/checkpoints/{head.checkpoint_id}")
        wait.until(EC.text_to_be_present_in_element((By.TAG_NAME, "h1"), f"Checkpoint {head.checkpoint_id}"))
        body = drv.find_element(By.TAG_NAME, "body").text
        for text in ("Acknowledgements per operator", "paid_orders_join", "Key groups", "orders", "payments",
                     f"{head.metadata.parallelism} / {head.metadata.max_parallelism}", "Acknowledgements per subtask",
                     "Acknowledged (after trigger)", "Checkpointed data size", "Full state size"):
            assert text in body, f"{text!r} not on the detail page:\n{body[:2000]}"
        assert "not recorded by this checkpoint" not in body
        drv.save_screenshot(str(ARTIFACTS / "airflow_checkpoint_detail.png"))
        sub = drv.find_element(By.XPATH, "//h2[text()='Acknowledgements per subtask']")
        drv.execute_script("arguments[0].scrollIntoView(true);", sub)
        drv.save_screenshot(str(ARTIFACTS / "airflow_checkpoint_subtasks.png"))
        # the job's Data Docs, served from the checkpoint store behind the same login (a restore validated)
        drv.get(f"{inst.url}/epochal/jobs/orders_payments/data-docs/")
        body = drv.find_element(By.TAG_NAME, "body").text
        assert "Not found" not in body and ("Epochal data quality" in body or "No data-quality results" in body), body[:800]
        drv.save_screenshot(str(ARTIFACTS / "airflow_data_docs.png"))
        assert (ARTIFACTS / "airflow_checkpoint_history.png").stat().st_size > 10_000
    finally:
        drv.quit()

