"""Issue 34, item 11: ``scripts/airflow_standalone.sh stop`` ends within 20 s.

It used to stop its three process groups one after the other, each with its own 20 s grace before SIGKILL: a
group that ignored SIGTERM held the others up (up to a minute and more). Now every group gets SIGTERM at once,
then one shared grace, then SIGKILL for what is left. Real process groups (one ignores SIGTERM, as a JVM busy in a
shutdown hook can) stand in for Airflow, the Spark Connect server and moto; the script is run as a user would.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]


def _group(cmd: str) -> int:
    """A process group of its own, not a child of this process (the init process reaps it, as for the script's
    own groups); returns its pgid."""
    out = subprocess.run(["bash", "-c", f"setsid bash -c {shlex.quote(cmd)} >/dev/null 2>&1 < /dev/null & echo $!"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_stop_terms_every_group_at_once_then_kills_the_stubborn_one(tmp_path):
    home = tmp_path / "airflow"
    state = home / "epochal-standalone"
    state.mkdir(parents=True)
    ready = {name: tmp_path / f"{name}.ready" for name in ("airflow", "connect", "moto")}
    procs = {"airflow": _group(f"trap '' TERM; touch {ready['airflow']}; while true; do sleep 0.2; done"),
             "connect": _group(f"touch {ready['connect']}; exec sleep 1000"),
             "moto": _group(f"touch {ready['moto']}; exec sleep 1000")}
    try:
        while not all(p.exists() for p in ready.values()):  # the TERM trap is in place before stop
            pass
        for name, pgid in procs.items():
            (state / f"{name}.pgid").write_text(str(pgid))
        r = subprocess.run(["bash", str(REPO / "scripts" / "airflow_standalone.sh"), "stop"], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "EPOCHAL_AIRFLOW_HOME": str(home)})
        lines = [x for x in r.stderr.splitlines() if x.startswith("[airflow-standalone]")]
        assert r.returncode == 0, r.stderr
        stopping = [i for i, x in enumerate(lines) if "stopping " in x]
        killing = [i for i, x in enumerate(lines) if "did not stop" in x]
        assert len(stopping) == 3 and len(killing) == 1, lines
        assert max(stopping) < killing[0], f"every group gets SIGTERM before any wait: {lines}"
        assert "airflow standalone did not stop within 15 s" in lines[killing[0]], lines
        assert "no processes left" in lines[-1], lines
        for pgid in procs.values():
            assert not _alive(pgid)
        assert not list(state.glob("*.pgid"))
    finally:
        for pgid in procs.values():
            if _alive(pgid):
                os.killpg(pgid, signal.SIGKILL)
