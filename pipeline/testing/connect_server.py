"""A Spark Connect server on loopback, from the pyspark package (``sbin/start-connect-server.sh --wait``).

Used by the tests and by ``scripts/connect_server.sh`` (the embedded long-lived Spark that Airflow tasks and CLI
runs connect to with ``PIPELINE_SPARK_MASTER=sc://127.0.0.1:<port>``). The server's Python workers run the venv's
interpreter with the repository on ``PYTHONPATH`` (they import ``pipeline``); S3 credentials and endpoint come from
the server's own environment (``env``), as for any shared Connect server - with a local master. With a cluster
master (``spark://...``) the executors run on the workers, with the workers' environment: they need their own
``AWS_*`` settings (or an instance profile / IRSA); :func:`pipeline.master.probe_executor_storage` refuses a run
whose executors cannot reach S3 before anything is written.

    with SparkConnectServer(master="local[2,4]", env=moto.env()) as server:
        os.environ["PIPELINE_SPARK_MASTER"] = server.url
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from pipeline.testing.cluster import free_port, spark_home, stop_group

__all__ = ["SparkConnectServer"]

REPO = str(Path(__file__).resolve().parents[2])


class SparkConnectServer:
    """``start()`` returns once the server accepts connections on ``127.0.0.1:<port>``; ``stop()`` ends its
    whole process group (JVM and Python workers)."""

    def __init__(self, *, master: str = "local[2]", port: int = 0, env: Mapping[str, str] | None = None,
                 work_dir: str | Path | None = None, driver_memory: str = "2g", start_timeout_s: float = 180.0) -> None:
        self.master = master
        self.port = port or free_port()
        self.extra_env = dict(env or {})
        self.work_dir = Path(work_dir) if work_dir else Path(os.environ.get("TMPDIR", "/tmp")) / f"epochal-connect-{self.port}"
        self.driver_memory = driver_memory
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "connect-server.log"

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_REMOTE"))}
        env.update({"SPARK_HOME": spark_home(), "PYSPARK_PYTHON": sys.executable,
                    "PYTHONPATH": os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH", "")) if p),
                    "SPARK_LOG_DIR": str(self.work_dir), "SPARK_PID_DIR": str(self.work_dir),
                    "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"})
        env.update(self.extra_env)
        return env

    def start(self) -> SparkConnectServer:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        script = os.path.join(spark_home(), "sbin", "start-connect-server.sh")
        cmd = ["bash", script, "--wait", "--master", self.master,
               "--conf", f"spark.connect.grpc.binding.port={self.port}",
               "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
               "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.ui.enabled=false",
               "--conf", f"spark.driver.memory={self.driver_memory}",
               "--conf", "spark.python.worker.reuse=true"]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self._env(), start_new_session=True)
        log.close()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Spark Connect server exited with {self.proc.returncode}; log tail:\n"
                                   + self.log_tail())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"Spark Connect server did not listen on {self.port} within {self.start_timeout_s}s; "
                           f"log tail:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def python_workers(self) -> list[int]:
        """PIDs of the server's Python worker processes (``pyspark.daemon`` and its forked workers)."""
        if self.proc is None:
            return []
        out = subprocess.run(["ps", "-o", "pid=,args=", "-g", str(self.proc.pid)], capture_output=True, text=True)
        return [int(line.split(None, 1)[0]) for line in out.stdout.splitlines()
                if "pyspark.daemon" in line or "pyspark/daemon" in line]

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)
            self.proc = None

    def __enter__(self) -> SparkConnectServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.testing.connect_server [--port 15002] [--master local[*]]``: run until killed."""
    import argparse
    import signal
    ap = argparse.ArgumentParser(prog="python -m pipeline.testing.connect_server")
    ap.add_argument("--port", type=int, default=15002)
    ap.add_argument("--master", default="local[*]")
    a = ap.parse_args(argv)
    server = SparkConnectServer(master=a.master, port=a.port).start()
    print(f"SPARK_CONNECT={server.url}  (export PIPELINE_SPARK_MASTER={server.url}); log: {server.log_path}",
          flush=True)
    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    signal.signal(signal.SIGINT, lambda *_: stop.update(flag=True))
    try:
        while not stop["flag"] and server.proc is not None and server.proc.poll() is None:
            time.sleep(0.5)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
