"""A moto S3 server on loopback: the embedded default S3 for demos and tests.

Three ways to use it:

* in-process (pytest session fixtures)::

      with moto_s3(buckets=["epochal"]) as server:   # sets AWS_* env vars, restores them on exit
          ...  # s3://epochal/... works through S3FileIO

* as a separate process, so that a SIGKILLed job does not take S3 (and its state) with it::

      python -m pipeline.testing.moto_server --port 0 --bucket epochal --bucket other

  prints ``ENDPOINT=http://127.0.0.1:<port>`` on its first stdout line and runs until killed
  (SIGTERM/SIGINT stop it cleanly). :func:`spawn_moto_server` / :func:`moto_s3_process` do this
  from Python and parse the endpoint.

* programmatically: :class:`MotoS3Server` (``start()`` / ``stop()`` / ``create_bucket()``).

Credentials are dummies (``testing``/``testing``); moto accepts anything.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence

__all__ = [
    "MotoS3Server", "MotoProcess", "moto_s3", "moto_s3_process", "spawn_moto_server", "s3_env",
    "DUMMY_ACCESS_KEY", "DUMMY_SECRET_KEY", "DEFAULT_REGION", "main",
]

DUMMY_ACCESS_KEY = "testing"
DUMMY_SECRET_KEY = "testing"
DEFAULT_REGION = "us-east-1"
_ENV_KEYS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
             "AWS_DEFAULT_REGION", "AWS_SESSION_TOKEN")


def s3_env(endpoint_url: str, region: str = DEFAULT_REGION) -> dict[str, str]:
    """The ``AWS_*`` environment that points S3 clients (boto3, pyarrow, S3FileIO) at ``endpoint_url``."""
    return {
        "AWS_ENDPOINT_URL": endpoint_url,
        "AWS_ENDPOINT_URL_S3": endpoint_url,
        "AWS_ACCESS_KEY_ID": DUMMY_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET_KEY,
        "AWS_DEFAULT_REGION": region,
    }


_ADMIN_CLIENTS: dict[tuple[str, str], object] = {}


def _admin_client(endpoint_url: str, region: str):
    key = (endpoint_url, region)
    client = _ADMIN_CLIENTS.get(key)
    if client is None:
        import boto3

        client = boto3.session.Session(
            aws_access_key_id=DUMMY_ACCESS_KEY, aws_secret_access_key=DUMMY_SECRET_KEY, region_name=region,
        ).client("s3", endpoint_url=endpoint_url)
        _ADMIN_CLIENTS[key] = client
    return client


def _create_buckets(endpoint_url: str, buckets: Iterable[str], region: str) -> None:
    client = _admin_client(endpoint_url, region)
    for bucket in buckets:
        if len(bucket) < 3:
            raise ValueError(f"S3 bucket names need at least 3 characters: {bucket!r}")
        kwargs: dict = {"Bucket": bucket}
        if region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            client.create_bucket(**kwargs)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass


class MotoS3Server:
    """A moto ``ThreadedMotoServer`` bound to loopback (``port=0``: a free port)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, buckets: Sequence[str] = (),
                 region: str = DEFAULT_REGION, quiet: bool = True) -> None:
        self.host = host
        self.port = port
        self.region = region
        self._buckets = tuple(buckets)
        for b in self._buckets:
            if len(b) < 3:
                raise ValueError(f"S3 bucket names need at least 3 characters: {b!r}")
        self._quiet = quiet
        self._server = None

    @property
    def endpoint_url(self) -> str:
        if self._server is None:
            raise RuntimeError("moto server is not running")
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> str:
        """Start the server, create the buckets, return the endpoint URL."""
        if self._server is not None:
            return self.endpoint_url
        if self._quiet:
            logging.getLogger("werkzeug").setLevel(logging.ERROR)
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=not self._quiet)
        server.start()
        host, port = server.get_host_and_port()
        self.port = int(port)
        self._server = server
        try:
            self.create_bucket(*self._buckets)
        except Exception:
            self.stop()
            raise
        return self.endpoint_url

    def create_bucket(self, *buckets: str) -> None:
        """Create buckets (existing ones are fine)."""
        _create_buckets(self.endpoint_url, buckets, self.region)

    def env(self) -> dict[str, str]:
        return s3_env(self.endpoint_url, self.region)

    def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.stop()

    def __enter__(self) -> MotoS3Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def _patched_env(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in _ENV_KEYS}
    try:
        for k in _ENV_KEYS:
            os.environ.pop(k, None)
        os.environ.update(values)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def moto_s3(buckets: Sequence[str] = ("epochal",), *, set_env: bool = True,
            region: str = DEFAULT_REGION) -> Iterator[MotoS3Server]:
    """Pytest-friendly: an in-process moto S3 server with ``buckets``; ``AWS_*`` env set while open."""
    server = MotoS3Server(buckets=buckets, region=region)
    server.start()
    try:
        if set_env:
            with _patched_env(server.env()):
                yield server
        else:
            yield server
    finally:
        server.stop()


class MotoProcess:
    """A moto S3 server running in a child process (see :func:`spawn_moto_server`)."""

    def __init__(self, proc: subprocess.Popen, endpoint_url: str, region: str) -> None:
        self.proc = proc
        self.endpoint_url = endpoint_url
        self.region = region

    @property
    def pid(self) -> int:
        return self.proc.pid

    def env(self) -> dict[str, str]:
        return s3_env(self.endpoint_url, self.region)

    def create_bucket(self, *buckets: str) -> None:
        _create_buckets(self.endpoint_url, buckets, self.region)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def spawn_moto_server(buckets: Sequence[str] = ("epochal",), *, port: int = 0, host: str = "127.0.0.1",
                      region: str = DEFAULT_REGION, python: str | None = None,
                      timeout: float = 60.0) -> MotoProcess:
    """Start ``python -m pipeline.testing.moto_server`` in a child process; wait for its endpoint."""
    cmd = [python or sys.executable, "-m", "pipeline.testing.moto_server", "--host", host, "--port", str(port),
           "--region", region]
    for b in buckets:
        cmd += ["--bucket", b]
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    line_holder: list[str] = []

    def read_first_line() -> None:
        assert proc.stdout is not None
        line_holder.append(proc.stdout.readline())

    reader = threading.Thread(target=read_first_line, daemon=True)
    reader.start()
    reader.join(timeout)
    line = line_holder[0].strip() if line_holder else ""
    if not line.startswith("ENDPOINT="):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"moto server did not start within {timeout}s (exit code {proc.poll()}, "
                           f"first line {line!r}): {' '.join(cmd)}")
    return MotoProcess(proc, line.split("=", 1)[1], region)


@contextlib.contextmanager
def moto_s3_process(buckets: Sequence[str] = ("epochal",), *, set_env: bool = True,
                    region: str = DEFAULT_REGION) -> Iterator[MotoProcess]:
    """Like :func:`moto_s3` but the server lives in a child process (survives SIGKILLed jobs)."""
    mp = spawn_moto_server(buckets, region=region)
    try:
        if set_env:
            with _patched_env(mp.env()):
                yield mp
        else:
            yield mp
    finally:
        mp.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.testing.moto_server",
                                     description="Run a moto S3 server on loopback until killed.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    parser.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
    parser.add_argument("--region", default=DEFAULT_REGION)
    args = parser.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = MotoS3Server(host=args.host, port=args.port, buckets=args.bucket, region=args.region)
    try:
        endpoint = server.start()
    except Exception as e:  # noqa: BLE001 - report and exit non-zero
        print(f"ERROR={e}", flush=True)
        return 1
    print(f"ENDPOINT={endpoint}", flush=True)
    print(f"# export AWS_ENDPOINT_URL={endpoint} AWS_ACCESS_KEY_ID={DUMMY_ACCESS_KEY} "
          f"AWS_SECRET_ACCESS_KEY={DUMMY_SECRET_KEY} AWS_DEFAULT_REGION={args.region}", flush=True)
    try:
        while not stop.is_set():
            stop.wait(0.1)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
