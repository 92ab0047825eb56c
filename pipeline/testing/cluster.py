"""A real Spark standalone cluster on loopback, from the pyspark package (master + workers), for tests.

    with StandaloneCluster(workers=2, private_dirs=[tmp / "driver-only"]) as cluster:
        env = {"PIPELINE_SPARK_MASTER": cluster.master_url}
        ...

Every daemon runs in its own process group (its executors and Python workers inherit it), and ``stop()``
SIGTERMs then SIGKILLs exactly those groups. ``private_dirs``: directories the workers (and so the
executors) must not share with the driver. Each worker runs in its own mount namespace (``unshare -m``)
with a fresh tmpfs mounted over each of them: what an executor writes there stays in the worker's private
tmpfs, like a file written on another machine's disk. Needs ``unshare -m`` (root or user namespaces):
:func:`can_isolate_dirs`.
"""
from __future__ import annotations

import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

__all__ = ["StandaloneCluster", "spark_home", "free_port", "can_isolate_dirs", "stop_group"]


def spark_home() -> str:
    """``SPARK_HOME`` or the pyspark package directory (it ships ``bin/spark-class`` and the jars)."""
    if os.environ.get("SPARK_HOME"):
        return os.environ["SPARK_HOME"]
    import pyspark
    return str(Path(pyspark.__file__).parent)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def can_isolate_dirs() -> bool:
    """True when this process may run a command in a private mount namespace with a tmpfs mount."""
    try:
        return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               "mount -t tmpfs epochal-probe /mnt 2>/dev/null || mount -t tmpfs epochal-probe /tmp"],
                              capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def stop_group(proc: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """SIGTERM the process group of ``proc`` (started with ``start_new_session``), SIGKILL it if needed."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                proc.poll()
                return
            proc.poll()
            time.sleep(0.2)


class StandaloneCluster:
    """Master and ``workers`` workers on 127.0.0.1 (``spark://127.0.0.1:<port>``)."""

    def __init__(self, workers: int = 2, *, cores: int = 1, memory: str = "1200m", work_dir: str | Path | None = None,
                 private_dirs: Sequence[str | Path] = (), start_timeout_s: float = 240.0,
                 distinct_hosts: bool = False) -> None:
        """``distinct_hosts``: worker i binds 127.0.0.<2+i> instead of 127.0.0.1, so Spark sees one host per worker
        (it never launches a speculative copy of a task on a host where the task already runs)."""
        self.workers = workers
        self.distinct_hosts = distinct_hosts
        self.cores = cores
        self.memory = memory
        self.private_dirs = [str(Path(p).resolve()) for p in private_dirs]
        self.work_dir = Path(work_dir) if work_dir else Path(os.environ.get("TMPDIR", "/tmp")) / f"epochal-spark-{os.getpid()}"
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.ui_port = 0
        self._procs: list[subprocess.Popen] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self, host: str = "127.0.0.1") -> dict[str, str]:
        # a worker node knows nothing of the driver's AWS credentials or pipeline settings
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PIPELINE_", "EPOCHAL_"))}
        env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP=host,
                   SPARK_LOCAL_HOSTNAME="localhost" if host == "127.0.0.1" else host,
                   PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
                   SPARK_NO_DAEMONIZE="1")
        return env

    def worker_host(self, i: int) -> str:
        return f"127.0.0.{2 + i}" if self.distinct_hosts else "127.0.0.1"

    def _spawn(self, name: str, argv: list[str], host: str = "127.0.0.1") -> subprocess.Popen:
        log = open(self.work_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        try:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self._env(host),
                                 cwd=str(self.work_dir), start_new_session=True)
        finally:
            log.close()
        self._procs.append(p)
        return p

    def _status(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
            return json.loads(r.read())

    def log(self, name: str) -> str:
        p = self.work_dir / f"{name}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def start(self) -> StandaloneCluster:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        cls = str(Path(spark_home()) / "bin" / "spark-class")
        self.port, self.ui_port = free_port(), free_port()
        self._spawn("master", [cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(self.port), "--webui-port", str(self.ui_port)])
        for i in range(self.workers):
            wdir = self.work_dir / f"worker-{i}"
            wdir.mkdir(exist_ok=True)
            argv = [cls, "org.apache.spark.deploy.worker.Worker", "--host", self.worker_host(i), "--cores", str(self.cores),
                    "--memory", self.memory, "--work-dir", str(wdir), "--webui-port", str(free_port()),
                    self.master_url]
            if self.private_dirs:
                mounts = " && ".join(f"mkdir -p {shlex.quote(d)} && mount -t tmpfs epochal-worker-{i} {shlex.quote(d)}"
                                     for d in self.private_dirs)
                argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", f'{mounts} && exec "$@"', "sh", *argv]
            self._spawn(f"worker-{i}", argv, self.worker_host(i))
        deadline = time.monotonic() + self.start_timeout_s
        alive = 0
        while time.monotonic() < deadline:  # wait for the condition: every worker registered and ALIVE
            dead = [p for p in self._procs if p.poll() is not None]
            if dead:
                self.stop()
                raise RuntimeError(f"a Spark daemon exited ({dead[0].args!r}):\n{self.log('master')[-2000:]}"
                                   f"\n{self.log('worker-0')[-2000:]}")
            try:
                alive = sum(1 for w in self._status().get("workers", []) if w.get("state") == "ALIVE")
            except (OSError, ValueError, http.client.HTTPException):
                alive = 0  # not up yet: no answer, or (a master still starting) an empty or partial body
            if alive >= self.workers:
                return self
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"only {alive} of {self.workers} workers registered within {self.start_timeout_s:.0f}s")

    def alive_workers(self) -> int:
        return sum(1 for w in self._status().get("workers", []) if w.get("state") == "ALIVE")

    def stop(self) -> None:
        for p in reversed(self._procs):
            stop_group(p)
        self._procs.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
