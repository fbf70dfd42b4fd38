"""The results service's HTTP API over a run store (stdlib ``http.server``, JSON in and out).

Two tokens, both random and kept in a Kubernetes Secret: workers hold the *worker* token, which
may only post events; the CLI reads the *admin* token from the Secret with the user's own
credentials and may do everything else. Requests without a valid token are refused (401), a
worker token on anything but events gets 403; only ``/healthz`` (for the kubelet's probes) is
open, and it says nothing but "ok". The token travels in ``X-Mlbench-Token`` rather than
``Authorization`` because the CLI reaches the service through the API server's service proxy,
where ``Authorization`` carries the user's own Kubernetes credentials.

    GET    /v1/runs                        the catalog           POST /v1/runs  create a run
    GET    /v1/runs/RUN                    one run (id, name or id prefix)
    GET    /v1/runs/RUN/files              {path: size} of run.json, events/*, logs/*
    GET    /v1/runs/RUN/file?path=P&offset=N   the bytes of a file from offset N
    POST   /v1/runs/RUN/events             worker token: {"rank": r, "events": [...]} -> {"next_seq": n}
    POST   /v1/runs/RUN/cancel | /fail     end an active run (and delete its pods)
    DELETE /v1/runs/RUN                    end it if active, delete its pods and its record
"""

from __future__ import annotations

import hmac
import json
import os
import re
import signal
import socket
import sys
import threading
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable
from urllib.parse import parse_qs, urlsplit

from mlbench.errors import MlbenchError, RunNotFound
from mlbench.results.http_sink import TOKEN_HEADER
from mlbench.results.store import CANCELLED, FAILED, RunRecord, RunStore
from mlbench.server.eventlog import EventLog

MAX_BODY = 16 * 1024 * 1024
MAX_CHUNK = 8 * 1024 * 1024
_FILE = re.compile(r"^(run\.json|events/rank-\d+\.jsonl|logs/[A-Za-z0-9_.-]+)$")
_CREATE_FIELDS = ("task", "workers", "division", "run_json", "name", "optimizer", "launcher",
                  "seed", "group_id")


class HttpError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def record_json(record: RunRecord) -> dict[str, Any]:
    data = asdict(record)
    data.pop("run_dir", None)
    return data


class ResultsService:
    """What the API does, independent of HTTP. ``supervisor`` ends runs on the cluster."""

    def __init__(self, home: str | Path, worker_token: str, admin_token: str, supervisor: Any = None):
        if not worker_token or not admin_token or worker_token == admin_token:
            raise MlbenchError("the results service needs two different, non-empty tokens; set "
                               "MLBENCH_WORKER_TOKEN and MLBENCH_ADMIN_TOKEN")
        self.store = RunStore(home)
        self.events = EventLog(self.store.runs_dir)
        self.tokens = {"worker": worker_token.encode(), "admin": admin_token.encode()}
        self.supervisor = supervisor

    def scope_of(self, token: str | None) -> str | None:
        """'admin', 'worker' or None for the token a request presented."""
        if not token:
            return None
        for scope in ("admin", "worker"):
            if hmac.compare_digest(token.encode(), self.tokens[scope]):
                return scope
        return None

    def run(self, ref: str) -> RunRecord:
        try:
            return self.store.get(ref)
        except RunNotFound as err:
            raise HttpError(404, str(err)) from None

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        missing = [k for k in ("task", "workers", "division", "run_json") if k not in body]
        if missing:
            raise HttpError(400, f"missing fields: {', '.join(missing)}")
        record = self.store.create(**{k: body[k] for k in _CREATE_FIELDS if k in body})
        return record_json(record)

    def files(self, record: RunRecord) -> dict[str, int]:
        found: dict[str, int] = {}
        for path in sorted(record.run_dir.rglob("*")):
            relative = path.relative_to(record.run_dir).as_posix()
            if path.is_file() and _FILE.match(relative):
                found[relative] = path.stat().st_size
        return found

    def read(self, record: RunRecord, relative: str, offset: int) -> bytes:
        if not _FILE.match(relative):
            raise HttpError(400, f"no such file {relative!r}")
        try:
            with open(record.run_dir / relative, "rb") as f:
                f.seek(max(0, offset))
                return f.read(MAX_CHUNK)
        except FileNotFoundError:
            raise HttpError(404, f"run {record.id} has no file {relative}") from None

    def post_events(self, run_id: str, body: dict[str, Any]) -> dict[str, Any]:
        record = self.run(run_id)
        if record.id != run_id:
            raise HttpError(404, f"no run {run_id!r}")
        rank, events = body.get("rank"), body.get("events")
        if not isinstance(rank, int) or not 0 <= rank < record.workers or not isinstance(events, list):
            raise HttpError(400, "expected {\"rank\": 0..workers-1, \"events\": [...]}")
        for event in events:
            if not (isinstance(event, dict) and isinstance(event.get("seq"), int)
                    and isinstance(event.get("name"), str) and event.get("rank") == rank):
                raise HttpError(400, "every event needs an integer seq, a name and the batch's rank")
        return {"next_seq": self.events.append(run_id, rank, events)}

    def end(self, record: RunRecord, state: str, reason: str) -> dict[str, Any]:
        if self.supervisor is not None:
            self.supervisor.end_run(record.id, state, reason)
        elif record.active:
            self.store.mark_ended(record.id, state, reason=reason)
        return record_json(self.store.get(record.id))

    def delete(self, record: RunRecord) -> None:
        self.end(record, CANCELLED, "deleted by the user")
        self.store.delete(record.id)
        self.events.forget(record.id)


_Route = tuple[str, re.Pattern, str | None, Callable[..., Any]]


def _routes(service: ResultsService) -> list[_Route]:
    run = r"/v1/runs/(?P<ref>[A-Za-z0-9_.-]+)"

    def fail(ref, body, query):
        return service.end(service.run(ref), FAILED, str(body.get("reason") or "failed to start"))

    def read_file(ref, body, query):
        offset = query.get("offset", ["0"])[0]
        return service.read(service.run(ref), query.get("path", [""])[0],
                            int(offset) if offset.isdigit() else 0)

    table = [
        ("GET", "/healthz", None, lambda body, query: b"ok"),
        ("GET", "/v1/runs", "admin",
         lambda body, query: {"runs": [record_json(r) for r in service.store.list()]}),
        ("POST", "/v1/runs", "admin", lambda body, query: service.create(body)),
        ("GET", run, "admin", lambda ref, body, query: record_json(service.run(ref))),
        ("DELETE", run, "admin", lambda ref, body, query: service.delete(service.run(ref)) or {}),
        ("GET", run + "/files", "admin",
         lambda ref, body, query: {"files": service.files(service.run(ref))}),
        ("GET", run + "/file", "admin", read_file),
        ("POST", run + "/events", "worker", lambda ref, body, query: service.post_events(ref, body)),
        ("POST", run + "/cancel", "admin",
         lambda ref, body, query: service.end(service.run(ref), CANCELLED, "cancelled by the user")),
        ("POST", run + "/fail", "admin", fail),
    ]
    return [(method, re.compile(f"^{pattern}$"), scope, fn) for method, pattern, scope, fn in table]


class _Handler(BaseHTTPRequestHandler):
    server_version = "mlbench-results"
    service: ResultsService
    routes: list[_Route]

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        try:
            body = self._body() if method == "POST" else {}
            for route_method, pattern, scope, fn in self.routes:
                match = pattern.match(url.path)
                if route_method == method and match:
                    self._authorize(scope)
                    result = fn(*match.groups(), body, parse_qs(url.query))
                    return self._reply(200, result)
            raise HttpError(404, f"no such endpoint: {method} {url.path}")
        except HttpError as err:
            self._reply(err.status, {"error": str(err)})
        except MlbenchError as err:
            self._reply(400, {"error": str(err)})
        except Exception as err:  # noqa: BLE001 - a bug must not kill the service; the log keeps it
            print(f"error handling {method} {url.path}: {err!r}", file=sys.stderr)
            self._reply(500, {"error": f"internal error: {type(err).__name__}"})

    def _authorize(self, scope: str | None) -> None:
        if scope is None:
            return
        granted = self.service.scope_of(self.headers.get(TOKEN_HEADER))
        if granted is None:
            raise HttpError(401, f"missing or wrong {TOKEN_HEADER}")
        if scope == "admin" and granted != "admin":
            raise HttpError(403, "the worker token may only post events")

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise HttpError(413, f"request body over {MAX_BODY} bytes")
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw)
        except json.JSONDecodeError:
            raise HttpError(400, "the body is not valid JSON") from None
        if not isinstance(body, dict):
            raise HttpError(400, "the body must be a JSON object")
        return body

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

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        """Log refused and failed requests only: events arrive every second from every worker."""
        if args and str(args[1])[:1] in "45":
            print(f"{self.address_string()} {format % args}", file=sys.stderr)


class _Server(ThreadingHTTPServer):
    daemon_threads = True


def make_server(service: ResultsService, host: str, port: int) -> ThreadingHTTPServer:
    """An HTTP server for ``service`` on host:port (IPv4 or IPv6, as the host says)."""
    handler = type("Handler", (_Handler,), {"service": service, "routes": _routes(service)})
    server_class = type("Server", (_Server,), {
        "address_family": socket.AF_INET6 if ":" in host else socket.AF_INET})
    return server_class((host, port), handler)


def serve(home: str | Path | None, host: str, port: int, namespace: str | None = None) -> None:
    """Run the service until SIGTERM or Ctrl-C; with ``namespace``, supervise that namespace's runs.

    The tokens come from $MLBENCH_WORKER_TOKEN and $MLBENCH_ADMIN_TOKEN (in a pod: the Secret).
    """
    from mlbench.results.store import default_home

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
