"""A real HTTP fault-injecting proxy in front of an S3 endpoint (moto), shipped with the package.

Point S3 clients at :attr:`S3FaultProxy.endpoint_url` instead of the real endpoint; every request is
forwarded unless the fault plan picks it. Faults (each a real effect on the wire):

* ``slowdown``: ``503 SlowDown`` (not forwarded);
* ``error500``: ``500 InternalError`` (not forwarded);
* ``drop``: the connection is closed without an answer (not forwarded);
* ``cut_body``: forwarded; the answer's headers announce the full body, then half of it is sent and the
  connection closed (a response cut mid-body; GETs only);
* ``lost_put``: forwarded and executed upstream, then the connection is closed without an answer (the
  PUT landed, its answer was lost);
* an **outage** (:meth:`S3FaultProxy.outage`): for the given seconds every request gets ``503`` or a
  dropped connection.

``rate`` (0..1) is the share of requests that get a random fault from ``kinds``; ``seed`` makes the choice
reproducible. :attr:`S3FaultProxy.injected` counts what was injected; :attr:`S3FaultProxy.by_kind` counts every
request that reached the proxy by S3 request kind (``list``, ``get``, ``head``, ``put``, ``delete``, ``other``;
what every process, driver and Spark executors alike, sent: see :func:`request_kind`); with ``log=True``,
:attr:`S3FaultProxy.log` keeps ``(kind, method, path)`` of every request, in arrival order (which objects were
read or written). Usable from the command line::

    python -m pipeline.testing.s3_faults --upstream http://127.0.0.1:5000 --rate 0.1 --port 5100
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

__all__ = ["S3FaultProxy", "ProxyProcess", "FAULT_KINDS", "request_kind"]

FAULT_KINDS = ("slowdown", "error500", "drop", "cut_body", "lost_put")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade", "trailer"}


def _error_xml(code: str, message: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code><Message>{message}</Message>'
            f"<RequestId>epochal-fault</RequestId></Error>").encode()


def request_kind(method: str, path: str) -> str:
    """The S3 request kind of an HTTP request (path-style addressing): ``list`` (GET on a bucket with
    ``list-type``/``prefix``), ``get``, ``head``, ``put`` (PUT, multipart POSTs), ``delete`` (DELETE, POST
    ``?delete``), ``other``. The kinds of :mod:`pipeline.fileio.request_counter`."""
    target, _, query = path.partition("?")
    params = {q.split("=", 1)[0] for q in query.split("&") if q}
    object_key = "/" in target.strip("/")
    if method == "GET":
        return "get" if object_key else ("list" if params & {"list-type", "prefix", "delimiter"} or not params
                                         else "other")
    if method == "HEAD":
        return "head" if object_key else "other"
    if method == "PUT":
        return "put" if object_key else "other"
    if method == "DELETE":
        return "delete" if object_key or "uploadId" in params else "other"
    if method == "POST":
        return "delete" if "delete" in params else ("put" if params & {"uploads", "uploadId"} else "other")
    return "other"


class S3FaultProxy:
    def __init__(self, upstream: str, *, rate: float = 0.0, kinds: tuple[str, ...] = FAULT_KINDS, seed: int = 0,
                 host: str = "127.0.0.1", port: int = 0, log: bool = False) -> None:
        """Over 80 lines: the fault proxy's HTTP handler class is declared inside it so it closes over the proxy's
        settings and counters."""
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {FAULT_KINDS}")
        u = urlsplit(upstream)
        self.upstream_host, self.upstream_port = u.hostname or "127.0.0.1", u.port or 80
        self.rate, self.kinds = float(rate), tuple(kinds)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._outage_until = 0.0
        self._forced: list[tuple[str, str | None, str | None]] = []  # (fault, request kind, path substring)
        self.injected: Counter[str] = Counter()
        self.by_kind: Counter[str] = Counter()
        self.requests = 0
        self.log: list[tuple[str, str, str]] | None = [] if log else None  # (kind, method, path) per request
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    out = b""
                    while True:
                        n = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if n == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return out
                        out += self.rfile.read(n)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _send(self, status: int, headers: list[tuple[str, str]], body: bytes, *, cut: bool = False) -> None:
                self.send_response_only(status)
                length = str(len(body))
                for k, v in headers:
                    if k.lower() == "content-length" and self.command == "HEAD":
                        length = v  # a HEAD answer announces the object's size, it has no body
                    elif k.lower() not in _HOP and k.lower() != "content-length":
                        self.send_header(k, v)
                self.send_header("Content-Length", length)
                if cut:
                    self.send_header("Connection", "close")
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body[: len(body) // 2] if cut else body)
                self.wfile.flush()
                if cut:
                    self._drop()

            def _drop(self) -> None:
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            def _control(self) -> None:
                """``/__faults__/...``: the proxy's own control API (a proxy in another process, see
                :class:`ProxyProcess`); never forwarded."""
                u = urlsplit(self.path)
                q = {k: v[-1] for k, v in parse_qs(u.query).items()}
                if u.path == "/__faults__/fail_next":
                    proxy.fail_next(q["kind"], int(q.get("n", "1")), request=q.get("request"),
                                    path_contains=q.get("path_contains"))
                elif u.path == "/__faults__/outage":
                    proxy.outage(float(q["seconds"]))
                elif u.path == "/__faults__/clear":
                    proxy.clear()
                elif u.path == "/__faults__/rate":
                    proxy.set_rate(float(q["rate"]))
                elif u.path != "/__faults__/stats":
                    return self._send(404, [], b"unknown control path")
                with proxy._lock:
                    stats = {"injected": dict(proxy.injected), "by_kind": dict(proxy.by_kind),
                             "requests": proxy.requests, "pending": len(proxy._forced)}
                self._send(200, [("Content-Type", "application/json")], json.dumps(stats).encode())

            def _proxy(self) -> None:
                body = self._body()
                if self.path.startswith("/__faults__/"):
                    return self._control()
                with proxy._lock:
                    kind = request_kind(self.command, self.path)
                    proxy.by_kind[kind] += 1
                    if proxy.log is not None:
                        proxy.log.append((kind, self.command, self.path))
                fault = proxy._choose(self.command, self.path)
                if fault in ("slowdown", "outage503"):
                    return self._send(503, [("Content-Type", "application/xml")],
                                      _error_xml("SlowDown", "Please reduce your request rate."))
                if fault == "error500":
                    return self._send(500, [("Content-Type", "application/xml")],
                                      _error_xml("InternalError", "We encountered an internal error."))
                if fault in ("drop", "outage_drop"):
                    return self._drop()
                conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    if body or self.command in ("PUT", "POST"):
                        headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    status, rheaders = resp.status, resp.getheaders()
                finally:
                    conn.close()
                if fault == "lost_put":
                    return self._drop()
                self._send(status, rheaders, data, cut=(fault == "cut_body" and len(data) > 1))

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _proxy

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def _choose(self, method: str, path: str = "") -> str | None:
        with self._lock:
            self.requests += 1
            if time.monotonic() < self._outage_until:
                kind = "outage503" if self._rng.random() < 0.5 else "outage_drop"
                self.injected[kind] += 1
                return kind
            for i, (kind, rkind, part) in enumerate(self._forced):
                if ((kind != "cut_body" or method == "GET") and (kind != "lost_put" or method == "PUT")
                        and (rkind is None or request_kind(method, path) == rkind)
                        and (part is None or part in unquote(path))):
                    del self._forced[i]
                    self.injected[kind] += 1
                    return kind
            if self.rate <= 0 or self._rng.random() >= self.rate:
                return None
            eligible = [k for k in self.kinds if (k != "cut_body" or method == "GET")
                        and (k != "lost_put" or method == "PUT")]
            if not eligible:
                return None
            kind = self._rng.choice(eligible)
            self.injected[kind] += 1
            return kind

    def fail_next(self, kind: str, n: int = 1, *, request: str | None = None, path_contains: str | None = None) -> None:
        """Inject ``kind`` into the next ``n`` eligible requests (GETs for cut_body, PUTs for lost_put); ``request``:
        only requests of that kind (``list``, ``get``, ``put`` ...: :func:`request_kind`); ``path_contains``: only
        requests whose (URL-decoded) path and query contain it, e.g. ``"_delta_log"``."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {FAULT_KINDS}")
        with self._lock:
            self._forced.extend([(kind, request, path_contains)] * n)

    def clear(self) -> None:
        """Forget the faults ``fail_next`` asked for that have not been injected yet, and end an outage."""
        with self._lock:
            self._forced.clear()
            self._outage_until = 0.0

    def outage(self, seconds: float) -> None:
        """From now on, for ``seconds``, every request fails (503 or a dropped connection)."""
        with self._lock:
            self._outage_until = time.monotonic() + float(seconds)

    def set_rate(self, rate: float) -> None:
        with self._lock:
            self.rate = float(rate)

    def start(self) -> "S3FaultProxy":
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "S3FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ProxyProcess:
    """An :class:`S3FaultProxy` in a child process, controlled over its ``/__faults__/`` HTTP API.

    For clients that block the GIL while they wait for S3 (delta-rs calls do): an in-process proxy thread could
    never answer them. ``fail_next``/``outage``/``set_rate`` and ``injected``/``by_kind`` as on the proxy itself."""

    def __init__(self, upstream: str, *, seed: int = 0, startup_timeout: float = 60.0) -> None:
        """Over 80 lines: the fault proxy's HTTP handler class is declared inside it so it closes over the proxy's
        settings and counters."""
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline.testing.s3_faults", "--upstream", upstream,
                                      "--rate", "0", "--seed", str(seed), "--port", "0"],
                                     stdout=subprocess.PIPE, text=True, env=dict(os.environ))
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()  # the child prints its endpoint once it listens
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the fault proxy did not start (exit code {self.proc.poll()}, first line {line!r})")
        self.endpoint_url = line

    def _call(self, path: str) -> dict:
        u = urlsplit(self.endpoint_url)
        conn = http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=30)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            raise RuntimeError(f"fault proxy control {path}: {resp.status} {data[:200]!r}")
        return json.loads(data)

    def fail_next(self, kind: str, n: int = 1, *, request: str | None = None, path_contains: str | None = None) -> None:
        q = f"kind={quote(kind)}&n={n}"
        if request is not None:
            q += f"&request={quote(request)}"
        if path_contains is not None:
            q += f"&path_contains={quote(path_contains)}"
        self._call(f"/__faults__/fail_next?{q}")

    def outage(self, seconds: float) -> None:
        self._call(f"/__faults__/outage?seconds={float(seconds)}")

    def set_rate(self, rate: float) -> None:
        self._call(f"/__faults__/rate?rate={float(rate)}")

    def clear(self) -> None:
        self._call("/__faults__/clear")

    def stats(self) -> dict:
        return self._call("/__faults__/stats")

    @property
    def injected(self) -> Counter[str]:
        return Counter(self.stats()["injected"])

    @property
    def by_kind(self) -> Counter[str]:
        return Counter(self.stats()["by_kind"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> "ProxyProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:  # pragma: no cover - manual use
    ap = argparse.ArgumentParser(description="fault-injecting HTTP proxy in front of an S3 endpoint")
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--rate", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    p = S3FaultProxy(a.upstream, rate=a.rate, seed=a.seed, port=a.port).start()
    print(p.endpoint_url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        p.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
