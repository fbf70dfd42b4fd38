"""The results service over HTTP: its endpoints, who may call them, and the rules for bodies;
what each endpoint does is :class:`mlbench.server.service.ResultsService`, the connections (their
bounds in count and time) are :mod:`mlbench.server.connections`; :func:`serve` runs them until SIGTERM.

Against careless and hostile clients, the token is checked before a byte of the body is read;
a body needs a ``Content-Length`` (411 without, 400 when it is not a number, 413 over
:data:`MAX_BODY`) and is read up to that length only; JSON that is malformed or nested too deeply
is a 400; every event is checked field by field (400 with the reason). ``/healthz`` and refusals
are answered on the event loop at once; at most ``max_threads`` requests read their bodies and
work (SQLite, fsync) at once, in a thread pool. Request lines of refused or failed requests are
logged with control characters escaped, and a client that goes away is not an error.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from mlbench.errors import MlbenchError
from mlbench.results.http_sink import TOKEN_HEADER
from mlbench.results.offsets import parse_offset
from mlbench.results.store import CANCELLED, FAILED, default_home
from mlbench.server.connections import HttpServer, Reply, Request, connection_bound, log, raise_file_limit
from mlbench.server.service import HttpError, ResultsService, record_json

MAX_BODY = 16 * 1024 * 1024
TIMEOUT_SECONDS = 30.0     # a connection idle this long between reads is closed (open: 4x as long)
HEAD_SECONDS = 10.0        # a request's line and headers must have arrived this long after it opened
MAX_THREADS = 64           # requests at work (body read, store, fsync) at once
MAX_CONNECTIONS = 4096     # connections open at once, if the limit on open files allows
BACKLOG = 1024             # connections waiting to be accepted
_LENGTH = re.compile(r"^[0-9]{1,12}$")


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
                            parse_offset(offset, f"offset={offset!r}"))

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
        ("POST", run + "/resume", "admin", "optional",
         lambda ref, body, query: service.resume(service.run(ref), body or {})),
    ]
    return [_Route(method, re.compile(f"^{pattern}$"), scope, body, fn)
            for method, pattern, scope, body, fn in table]


class _Handler:
    """Answers one request: route, token, then (in one of ``max_threads`` slots) body and work.

    ``/healthz``, refusals and unknown endpoints are answered on the event loop at once; what
    reads the store or writes events runs in a thread pool, as SQLite and fsync block.
    """

    def __init__(self, service: ResultsService, max_threads: int):
        self.service = service
        self.routes = _routes(service)
        self.pool = ThreadPoolExecutor(max_threads, thread_name_prefix="results-request")
        self.slots: asyncio.Semaphore | None = None  # made on the loop that serves
        self.max_threads = max_threads

    def close(self) -> None:
        self.pool.shutdown(wait=False)

    async def __call__(self, request: Request) -> Reply:
        url = urlsplit(request.target)
        try:
            for route in self.routes:
                match = route.pattern.match(url.path)
                if route.method == request.method and match:
                    break
            else:
                raise HttpError(404, f"no such endpoint: {request.method} {url.path}")
            if route.scope is None and route.body == "none":
                return _reply(200, route.fn(*match.groups(), {}, {}))
            self._authorize(request, route.scope, match.groupdict().get("ref"))  # before the body is read
            if self.slots is None:
                self.slots = asyncio.Semaphore(self.max_threads)
            async with self.slots:  # bodies in memory and requests at work: at most max_threads
                raw = await self._body(request, route.body) if request.method == "POST" else None
                loop = asyncio.get_running_loop()
                return await loop.run_in_executor(self.pool, self._run, request, route, match, raw,
                                                  parse_qs(url.query))
        except HttpError as err:
            return _reply(err.status, {"error": str(err)})

    def _run(self, request: Request, route: _Route, match: re.Match, raw: bytes | None,
             query: dict[str, list[str]]) -> Reply:
        try:
            body = _parse(raw) if raw is not None else {}
            return _reply(200, route.fn(*match.groups(), body, query))
        except HttpError as err:
            return _reply(err.status, {"error": str(err)})
        except MlbenchError as err:
            return _reply(400, {"error": str(err)})
        except Exception as err:
            log(f"{request.client} error handling {request.method} {urlsplit(request.target).path}: {err!r}")
            return _reply(500, {"error": f"internal error: {type(err).__name__}"})

    def _authorize(self, request: Request, scope: str | None, ref: str | None) -> None:
        if scope is None:
            return
        token = request.headers.get(TOKEN_HEADER.lower())
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

    async def _body(self, request: Request, kind: str) -> bytes | None:
        """The body's bytes (None: no body), after its length was checked."""
        if kind == "none":
            return None
        given = request.headers.get("content-length")
        if given is None:
            if kind == "required":
                raise HttpError(411, "a request body needs a Content-Length header")
            return None
        if not _LENGTH.match(given.strip()):
            raise HttpError(400, "Content-Length must be a number of bytes")
        length = int(given)
        if length > MAX_BODY:
            raise HttpError(413, f"request body over {MAX_BODY} bytes")
        return await request.read(length) if length else b"{}"


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # malformed, not UTF-8, or nested too deeply
        raise HttpError(400, "the body is not valid JSON (or is nested too deeply)") from None
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    return body


def _reply(status: int, result: Any) -> Reply:
    if isinstance(result, bytes):
        return Reply(status, result, "application/octet-stream")
    return Reply(status, json.dumps(result, default=str).encode())


def make_server(service: ResultsService, host: str, port: int, timeout: float = TIMEOUT_SECONDS,
                max_threads: int = MAX_THREADS, max_connections: int | None = None,
                head_timeout: float = HEAD_SECONDS) -> HttpServer:
    """An HTTP server for ``service`` on host:port (IPv4 or IPv6, as the host says): a request's
    head must arrive within ``head_timeout`` seconds (or ``timeout`` if less), a later read may
    wait ``timeout`` seconds, a connection lasts at most four times that; at most
    ``max_connections`` are open (default: :func:`connection_bound`)."""
    return HttpServer((host, port), _Handler(service, max_threads), timeout=timeout,
                      head_timeout=min(head_timeout, timeout), deadline=4 * timeout,
                      max_connections=max_connections or connection_bound(max_threads, MAX_CONNECTIONS),
                      backlog=BACKLOG)


def serve(home: str | Path | None, host: str, port: int, namespace: str | None = None) -> None:
    """Run the service until SIGTERM or Ctrl-C; with ``namespace``, supervise that namespace's runs.

    The tokens come from $MLBENCH_WORKER_TOKEN and $MLBENCH_ADMIN_TOKEN (in a pod: the Secret).
    """
    service = ResultsService(home or default_home(), os.environ.get("MLBENCH_WORKER_TOKEN", ""),
                             os.environ.get("MLBENCH_ADMIN_TOKEN", ""))
    raise_file_limit(MAX_THREADS, MAX_CONNECTIONS)
    try:
        server = make_server(service, host, port)
    except OSError as err:
        raise MlbenchError(f"cannot listen on {host}:{port} ({err.strerror})") from None
    if namespace:
        from mlbench.launch.k8s_supervisor import PodSupervisor

        service.supervisor = PodSupervisor.in_cluster(service.store, namespace)
        service.supervisor.start()
    service.watch.start()
    signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(target=server.shutdown).start())
    print(f"mlbench results service on {host}:{server.server_address[1]}, run store "
          f"{service.store.home}" + (f", supervising runs in namespace {namespace}" if namespace else ""),
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        service.watch.stop()
        if service.supervisor is not None:
            service.supervisor.stop()
