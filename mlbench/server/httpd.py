"""The results service over HTTP (stdlib ``http.server``); what each endpoint does is
:class:`mlbench.server.service.ResultsService`; :func:`serve` runs both until SIGTERM.

Against careless and hostile clients, the token is checked before a byte of the body is read;
a body needs a ``Content-Length`` (411 without, 400 when it is not a number, 413 over
:data:`MAX_BODY`) and is read up to that length only; JSON that is malformed or nested too deeply
is a 400; every event is checked field by field (400 with the reason). A connection may be idle
for ``timeout`` seconds between reads and lasts at most four times that; at most ``max_threads``
connections are served at once, the rest wait in a listen backlog of :data:`BACKLOG`. Request
lines are logged with control characters escaped, and a client that goes away is not an error.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from collections.abc import Callable
from urllib.parse import parse_qs, urlsplit

from mlbench.errors import MlbenchError
from mlbench.results.http_sink import TOKEN_HEADER
from mlbench.results.store import CANCELLED, FAILED, default_home
from mlbench.server.service import HttpError, ResultsService, record_json

MAX_BODY = 16 * 1024 * 1024
TIMEOUT_SECONDS = 30.0     # a connection idle this long between reads is closed
MAX_THREADS = 64           # connections served at once
BACKLOG = 128              # connections waiting to be accepted
_LENGTH = re.compile(r"^[0-9]{1,12}$")
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), *range(127, 160))}


@dataclass(frozen=True)
class _Route:
    """One endpoint: who may call it (None: anyone, 'admin', 'run': the run's own token) and
    whether it takes a body ('none', 'optional', 'required')."""

    method: str
    pattern: re.Pattern
    scope: str | None
    body: str
    fn: Callable[..., Any]


def _routes(service: ResultsService) -> list[_Route]:
    run = r"/v1/runs/(?P<ref>[A-Za-z0-9_.-]+)"

    def fail(ref, body, query):
        return service.end(service.run(ref), FAILED, str(body.get("reason") or "failed to start"))

    def delete(ref, body, query):
        service.delete(service.run(ref))
        return {}

    def read_file(ref, body, query):
        offset = query.get("offset", ["0"])[0]
        return service.read(service.run(ref), query.get("path", [""])[0],
                            int(offset) if offset.isdigit() else 0)

    table: list[tuple[str, str, str | None, str, Callable[..., Any]]] = [
        ("GET", "/healthz", None, "none", lambda body, query: b"ok"),
        ("GET", "/v1/runs", "admin", "none",
         lambda body, query: {"runs": [record_json(r) for r in service.store.list()]}),
        ("POST", "/v1/runs", "admin", "required", lambda body, query: service.create(body)),
        ("GET", run, "admin", "none", lambda ref, body, query: record_json(service.run(ref))),
        ("DELETE", run, "admin", "none", delete),
        ("GET", run + "/files", "admin", "none",
         lambda ref, body, query: {"files": service.files(service.run(ref))}),
        ("GET", run + "/file", "admin", "none", read_file),
        ("POST", run + "/events", "run", "required",
         lambda ref, body, query: service.post_events(ref, body)),
        ("POST", run + "/heartbeat", "run", "required",
         lambda ref, body, query: service.post_heartbeat(ref, body)),
        ("POST", run + "/cancel", "admin", "none",
         lambda ref, body, query: service.end(service.run(ref), CANCELLED, "cancelled by the user")),
        ("POST", run + "/fail", "admin", "optional", fail),
    ]
    return [_Route(method, re.compile(f"^{pattern}$"), scope, body, fn)
            for method, pattern, scope, body, fn in table]


def _escaped(text: str) -> str:
    """``text`` with control characters written as \\xNN, so a request cannot write to the log
    what a terminal would obey (colours, a new title, a bell, fake lines)."""
    return text.translate(_CONTROL)


class _Handler(BaseHTTPRequestHandler):
    server_version = "mlbench-results"
    service: ResultsService
    routes: list[_Route]

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        try:
            for route in self.routes:
                match = route.pattern.match(url.path)
                if route.method == method and match:
                    break
            else:
                raise HttpError(404, f"no such endpoint: {method} {url.path}")
            self._authorize(route.scope, match.groupdict().get("ref"))  # before the body is read
            body = self._body(route.body) if method == "POST" else {}
            result = route.fn(*match.groups(), body, parse_qs(url.query))
            return self._reply(200, result)
        except HttpError as err:
            self._reply(err.status, {"error": str(err)})
        except MlbenchError as err:
            self._reply(400, {"error": str(err)})
        except (ConnectionError, TimeoutError):  # the client went away or stalled: nothing to answer
            self.close_connection = True
        except Exception as err:
            self.log_error("error handling %s %s: %r", method, url.path, err)
            self._reply(500, {"error": f"internal error: {type(err).__name__}"})

    def _authorize(self, scope: str | None, ref: str | None) -> None:
        if scope is None:
            return
        token = self.headers.get(TOKEN_HEADER)
        if scope == "run":
            if ref is None or not self.service.is_run_token(token, ref):
                raise HttpError(401, f"missing or wrong {TOKEN_HEADER}: events and heartbeats need the "
                                     "run's own token")
            return
        granted = self.service.scope_of(token)
        if granted is None:
            raise HttpError(401, f"missing or wrong {TOKEN_HEADER}")
        if scope == "admin" and granted != "admin":
            raise HttpError(403, "the worker token may only post events")

    def _body(self, kind: str) -> dict[str, Any]:
        if kind == "none":
            return {}
        given = self.headers.get("Content-Length")
        if given is None:
            if kind == "required":
                raise HttpError(411, "a request body needs a Content-Length header")
            return {}
        if not _LENGTH.match(given.strip()):
            raise HttpError(400, "Content-Length must be a number of bytes")
        length = int(given)
        if length > MAX_BODY:
            raise HttpError(413, f"request body over {MAX_BODY} bytes")
        raw = self._read(length) if length else b"{}"
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):  # malformed, not UTF-8, or nested too deeply
            raise HttpError(400, "the body is not valid JSON (or is nested too deeply)") from None
        if not isinstance(body, dict):
            raise HttpError(400, "the body must be a JSON object")
        return body

    def _read(self, length: int) -> bytes:
        """Exactly ``length`` bytes of body (each read waits at most the connection timeout)."""
        chunks, left = [], length
        while left:
            chunk = self.rfile.read(min(left, 1 << 16))
            if not chunk:
                raise ConnectionResetError("the client closed the connection before the end of the body")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def _reply(self, status: int, result: Any) -> None:
        if isinstance(result, bytes):
            data, kind = result, "application/octet-stream"
        else:
            data, kind = json.dumps(result, default=str).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Log refused and failed requests only: events arrive every second from every worker."""
        if str(code)[:1] in "45":
            super().log_request(code, size)

    def log_message(self, format: str, *args: Any) -> None:
        print(_escaped(f"{self.address_string()} {format % args}"), file=sys.stderr, flush=True)


class _Server(ThreadingHTTPServer):
    """Threads for at most ``max_threads`` connections at once (the rest wait in the backlog),
    each connection closed after ``deadline`` seconds whatever it does; a client going away is
    not an error."""

    daemon_threads = True
    request_queue_size = BACKLOG

    def __init__(self, address: tuple[str, int], handler: type, max_threads: int, deadline: float):
        self._slots = threading.BoundedSemaphore(max_threads)
        self._deadline = deadline
        self._open: dict[socket.socket, float] = {}
        self._guard = threading.Lock()
        super().__init__(address, handler)
        threading.Thread(target=self._reap, name="connection-deadlines", daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        self._slots.acquire()
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._guard:
            self._open[request] = time.monotonic() + self._deadline
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._guard:
                self._open.pop(request, None)
            self._slots.release()

    def _reap(self) -> None:
        while True:
            time.sleep(min(1.0, self._deadline / 4))
            now = time.monotonic()
            with self._guard:
                late = [sock for sock, deadline in self._open.items() if deadline < now]
            for sock in late:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # the handler's next read or write fails
                except OSError:
                    pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        err = sys.exc_info()[1]
        if isinstance(err, (ConnectionError, TimeoutError)):
            return
        print(_escaped(f"{client_address[0]}: {type(err).__name__}: {err}")[:500], file=sys.stderr, flush=True)


def make_server(service: ResultsService, host: str, port: int, timeout: float = TIMEOUT_SECONDS,
                max_threads: int = MAX_THREADS) -> ThreadingHTTPServer:
    """An HTTP server for ``service`` on host:port (IPv4 or IPv6, as the host says); a connection
    may be idle ``timeout`` seconds between reads and lasts at most four times that."""
    handler = type("Handler", (_Handler,), {"service": service, "routes": _routes(service),
                                            "timeout": timeout})
    server_class = type("Server", (_Server,), {
        "address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
    return server_class((host, port), handler, max_threads, 4 * timeout)


def serve(home: str | Path | None, host: str, port: int, namespace: str | None = None) -> None:
    """Run the service until SIGTERM or Ctrl-C; with ``namespace``, supervise that namespace's runs.

    The tokens come from $MLBENCH_WORKER_TOKEN and $MLBENCH_ADMIN_TOKEN (in a pod: the Secret).
    """
    service = ResultsService(home or default_home(), os.environ.get("MLBENCH_WORKER_TOKEN", ""),
                             os.environ.get("MLBENCH_ADMIN_TOKEN", ""))
    if namespace:
        from mlbench.launch.k8s_supervisor import PodSupervisor

        service.supervisor = PodSupervisor.in_cluster(service.store, namespace)
        service.supervisor.start()
    server = make_server(service, host, port)
    signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(target=server.shutdown).start())
    print(f"mlbench results service on {host}:{server.server_address[1]}, run store "
          f"{service.store.home}" + (f", supervising runs in namespace {namespace}" if namespace else ""),
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        if service.supervisor is not None:
            service.supervisor.stop()
