"""The dashboard's JSON API, which its pages use and scripts can use too (docs/dashboard.md).

Handlers are plain functions, which Starlette runs in its thread pool: they read the run store
(SQLite, files) and start processes, none of which may block the event loop that serves the
live streams. Errors the library raises on purpose become ``{"error": sentence}`` with 400 (404
for an unknown run; 503 when the run store cannot be used: deleted, read-only, full), as the CLI
turns them into one line; anything else is a 500 with one line, its traceback in the server's log.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import shutil
import tempfile
from functools import wraps
from pathlib import Path
from typing import Any
from collections.abc import Callable

from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from mlbench import api
from mlbench.dashboard import views
from mlbench.dashboard.live import Hub, dumps, read_log, run_document
from mlbench.dashboard.newrun import FormError, RunQueue, create_runs, form_choices
from mlbench.dashboard.sources import Sources
from mlbench.errors import MlbenchError, RunNotFound, UsageError
from mlbench.results.archive import write_archive
from mlbench.results.compare import comparison_of
from mlbench.results.events import read_events_from, read_run_events
from mlbench.results.mllog import write_mllog
from mlbench.results.offsets import parse_offset, whole_lines_within
from mlbench.results.rank_curves import rank_curves
from mlbench.results.store import StoreError
from mlbench.results.summary import summarize

KEEPALIVE_SECONDS = 15.0
log = logging.getLogger("mlbench.dashboard")


#: The new-run form as JSON is a few hundred bytes; far more is a mistake or an attack.
MAX_FORM_BYTES = 64 * 1024


class BodyTooLarge(Exception):
    pass


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (:class:`BodyTooLarge`) by its Content-Length before a byte
    is read, or as soon as more than ``limit`` bytes have come without one; never held whole
    when it is larger (``request.json()`` would read any size)."""
    given = request.headers.get("content-length")
    if given is not None and _NUMBER.fullmatch(given.strip()) and int(given.strip()[:20]) > limit:
        raise BodyTooLarge(f"the request body is over {limit} bytes (Content-Length: {given.strip()[:20]})")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"the request body is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class Json(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dumps(content).encode("utf-8")


def _errors_as_json(handler: Callable[..., Response]) -> Callable[..., Response]:
    @wraps(handler)
    def wrapped(self: Api, arg: Any) -> Response:
        try:
            return handler(self, arg)
        except FormError as err:
            return Json({"error": str(err), "errors": err.errors}, status_code=400)
        except RunNotFound as err:
            return Json({"error": str(err)}, status_code=404)
        except UsageError as err:
            return Json({"error": str(err)}, status_code=400)
        except StoreError as err:
            return Json({"error": str(err)}, status_code=503)
        except MlbenchError as err:
            return Json({"error": str(err)}, status_code=502)
        except Exception as err:  # a bug: one line for the page, the traceback for the log
            log.exception("dashboard request failed: %s", handler.__name__)
            return Json({"error": f"the dashboard failed on this request ({type(err).__name__}: "
                                  f"{str(err).splitlines()[0] if str(err) else 'no detail'}); its log "
                                  "has the details"}, status_code=500)
    return wrapped


_NUMBER = re.compile(r"[0-9]+")
_RANK = re.compile(r"[0-9]{1,9}")


def parse_cursor(text: str) -> dict[int, int]:
    """``0:1234,1:987`` (rank:byte offset) -> {0: 1234, 1: 987}."""
    cursor = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        rank, sep, offset = part.partition(":")
        if not (sep and _RANK.fullmatch(rank) and _NUMBER.fullmatch(offset)):
            raise UsageError(f"since={text!r}: expected RANK:OFFSET,... as the last answer's 'next' gave")
        cursor[int(rank)] = parse_offset(offset, f"since={text!r}")
    return cursor


#: The most metrics one request of /api/runs/RUN/ranks asks for.
MAX_RANK_METRICS = 8

#: The runs of one page of /api/runs unless ``limit`` says otherwise, and the most it may say.
PAGE_RUNS = 100
MAX_PAGE_RUNS = 1000


def _metric_names(query: Any, key: str, default: str) -> list[str]:
    """The metric names of the query's ``key`` (comma-separated), or a UsageError saying how many."""
    names = [n.strip() for n in query.get(key, default).split(",") if n.strip()]
    if not names or len(names) > MAX_RANK_METRICS or any(len(n) > 200 for n in names):
        raise UsageError(f"{key}={query.get(key, '')[:80]!r}: give 1 to {MAX_RANK_METRICS} metric names, "
                         "separated by commas (the answer's 'metrics' lists the run's)")
    return names


_RUN_ID = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def parse_limit(text: str | None) -> int:
    if text is None or not text.strip():
        return PAGE_RUNS
    if not (_NUMBER.fullmatch(text.strip()) and 1 <= int(text.strip()[:8]) <= MAX_PAGE_RUNS):
        raise UsageError(f"limit={text[:40]!r}: give a number of runs from 1 to {MAX_PAGE_RUNS}")
    return int(text.strip())


def parse_before(text: str | None) -> tuple[float, str] | None:
    """``CREATED_AT:ID`` (the ``next`` of the previous page) -> (created_at, id)."""
    if text is None or not text.strip():
        return None
    created, sep, run_id = text.strip().rpartition(":")
    try:
        when = float(created)
    except ValueError:
        when = math.nan
    if not (sep and math.isfinite(when) and _RUN_ID.fullmatch(run_id)):
        raise UsageError(f"before={text[:80]!r}: expected CREATED_AT:ID as the last answer's 'next' gave")
    return when, run_id


class Api:
    """The endpoints, over the dashboard's sources, live hub and run queue."""

    def __init__(self, sources: Sources, hub: Hub, queue: RunQueue):
        self.sources = sources
        self.hub = hub
        self.queue = queue

    def routes(self) -> list[Route]:
        return [
            Route("/api/runs", self.list_runs, methods=["GET"]),
            Route("/api/runs", self.start, methods=["POST"]),
            Route("/api/runs/{run_id}", self.run, methods=["GET"]),
            Route("/api/runs/{run_id}", self.delete, methods=["DELETE"]),
            Route("/api/runs/{run_id}/cancel", self.cancel, methods=["POST"]),
            Route("/api/runs/{run_id}/events", self.events, methods=["GET"]),
            Route("/api/runs/{run_id}/ranks", self.ranks, methods=["GET"]),
            Route("/api/runs/{run_id}/logs", self.logs, methods=["GET"]),
            Route("/api/runs/{run_id}/logs/{name}", self.log, methods=["GET"]),
            Route("/api/runs/{run_id}/download", self.download, methods=["GET"]),
            Route("/api/runs/{run_id}/mllog", self.mllog, methods=["GET"]),
            Route("/api/compare", self.compare, methods=["GET"]),
            Route("/api/form", self.form, methods=["GET"]),
            Route("/api/stream", self.stream, methods=["GET"]),
        ]

    # -- reading --------------------------------------------------------------------------------
    @_errors_as_json
    def list_runs(self, request: Request) -> Response:
        q = request.query_params
        return Json(self.hub.page(parse_limit(q.get("limit")), parse_before(q.get("before")),
                                  tuple(q.get("q", "").lower().split())))

    @_errors_as_json
    def run(self, request: Request) -> Response:
        source, record = self.sources.find(request.path_params["run_id"])
        events = read_run_events(record.run_dir)
        return Json(run_document(source, record, events, summarize(events)))

    @_errors_as_json
    def events(self, request: Request) -> Response:
        _, record = self.sources.find(request.path_params["run_id"])
        cursor = parse_cursor(request.query_params.get("since", ""))
        events, after = [], {}
        for path in sorted((record.run_dir / "events").glob("rank-*.jsonl")):
            rank = int(path.stem.split("-")[1])  # a cursor past a file's end reads from its end
            new, after[rank] = read_events_from(path, whole_lines_within(path, cursor.get(rank, 0)))
            events += new
        events.sort(key=lambda e: (e.get("time", 0), e.get("rank", 0)))
        return Json({"events": events, "next": ",".join(f"{r}:{o}" for r, o in sorted(after.items()))})

    @_errors_as_json
    def ranks(self, request: Request) -> Response:
        """``metric=NAME[,NAME...]`` (at most :data:`MAX_RANK_METRICS`) against training time:
        ``lines=each`` one line per rank, else one over all ranks (their mean). ``each=NAME,...``:
        more metrics, one line per rank, answered under ``"each"`` from the same reading of the
        events (the run page asks for its System chart's so, in one request)."""
        _, record = self.sources.find(request.path_params["run_id"])
        q = request.query_params
        names = _metric_names(q, "metric", "train/loss")
        each_names = _metric_names(q, "each", "") if q.get("each") else []
        lines = q.get("lines", "all")
        if lines not in ("all", "each"):
            raise UsageError(f"lines={lines[:40]!r}: give all (one line over all ranks) or each (one per rank)")
        return Json(rank_curves(read_run_events(record.run_dir), names, lines == "each", each_names=each_names))

    @_errors_as_json
    def logs(self, request: Request) -> Response:
        _, record = self.sources.find(request.path_params["run_id"])
        folder = record.run_dir / "logs"
        return Json({"logs": [{"name": n, "size": (folder / n).stat().st_size} for n in views.log_names(record)]})

    @_errors_as_json
    def log(self, request: Request) -> Response:
        _, record = self.sources.find(request.path_params["run_id"])
        name = request.path_params["name"]
        if name not in views.log_names(record):
            return Json({"error": f"run {record.id} has no log {name!r}"}, status_code=404)
        offset = request.query_params.get("offset")
        start_at = parse_offset(offset, f"offset={offset!r}") if offset else None
        text, start, end = read_log(record.run_dir / "logs" / name, start_at)
        return Json({"name": name, "text": text, "start": start, "next": end})

    @_errors_as_json
    def download(self, request: Request) -> Response:
        _, record = self.sources.find(request.path_params["run_id"])
        folder = Path(tempfile.mkdtemp(prefix="mlbench-download-"))
        path = write_archive(record, folder / f"{record.id}.zip")
        return FileResponse(path, media_type="application/zip", filename=path.name,
                            background=BackgroundTask(shutil.rmtree, folder, True))

    @_errors_as_json
    def mllog(self, request: Request) -> Response:
        _, record = self.sources.find(request.path_params["run_id"])
        folder = Path(tempfile.mkdtemp(prefix="mlbench-download-"))
        path = write_mllog(record, folder / f"{record.id}.mllog.txt")
        return FileResponse(path, media_type="text/plain; charset=utf-8", filename=path.name,
                            background=BackgroundTask(shutil.rmtree, folder, True))

    @_errors_as_json
    def compare(self, request: Request) -> Response:
        q = request.query_params
        refs = tuple(r for r in q.get("runs", "").replace(" ", ",").split(",") if r)
        price = q.get("price_per_hour", "").strip()
        try:
            usd = float(price) if price else None
        except ValueError:
            usd = math.nan
        if usd is not None and not (math.isfinite(usd) and usd >= 0):
            raise UsageError(f"price per hour {price!r}: give a number of USD, 0 or more")
        stores = {self.sources.find(ref)[0].key for ref in refs} or {q.get("source", "local")}
        if len(stores) > 1:
            raise UsageError("compare runs of one place at a time: this machine's or the cluster's")
        source = self.sources.by_key(stores.pop())
        pool = tuple(k for k in q.get("pool", "").replace(" ", ",").split(",") if k)
        comparison = comparison_of(source.open_store(), refs, q.get("task") or None, q.get("group") or None,
                                   q.get("instance") or None, usd, pool=pool, score=q.get("score") or "median")
        return Json(views.comparison_document(comparison))

    @_errors_as_json
    def form(self, request: Request) -> Response:
        return Json(form_choices(self.sources))

    # -- changing -------------------------------------------------------------------------------
    async def start(self, request: Request) -> Response:
        try:
            raw = await read_body(request, MAX_FORM_BYTES)
        except BodyTooLarge as err:
            return Json({"error": str(err)}, status_code=413)
        except ClientDisconnect:  # nobody left to answer
            return Json({"error": "the client went away"}, status_code=400)
        try:
            form = json.loads(raw)
        except (ValueError, RecursionError):  # malformed, not UTF-8, or nested too deeply
            form = None
        if not isinstance(form, dict):
            return Json({"error": "the new-run form must be sent as a JSON object"}, status_code=400)
        return await run_in_threadpool(self._start, form)

    @_errors_as_json
    def _start(self, form: dict[str, Any]) -> Response:
        source, records = create_runs(self.sources, form)
        self.queue.submit(source, records)
        return Json({"runs": [r.id for r in records], "group": records[0].group_id,
                     "url": f"/runs/{records[0].id}"}, status_code=201)

    @_errors_as_json
    def cancel(self, request: Request) -> Response:
        source, record = self.sources.find(request.path_params["run_id"])
        run = api.cancel(record.id, home=source.open_store())
        return Json({"id": run.id, "state": run.state, "reason": run.reason})

    @_errors_as_json
    def delete(self, request: Request) -> Response:
        source, record = self.sources.find(request.path_params["run_id"])
        api.delete(record.id, home=source.open_store())
        return Json({"deleted": record.id})

    # -- live -----------------------------------------------------------------------------------
    async def stream(self, request: Request) -> Response:
        """Server-sent events: ``runs`` (rows that changed), ``run``, ``log``, ``gone``."""
        sub = self.hub.subscribe(runs=request.query_params.get("runs") == "1",
                                 run_id=request.query_params.get("run") or None)

        async def events():
            try:
                yield "retry: 2000\n\n"
                while True:
                    try:
                        text = await sub.next(KEEPALIVE_SECONDS)
                    except asyncio.TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    if text is None:  # it read too little: dropped (see Subscriber)
                        return
                    yield text
            finally:
                self.hub.unsubscribe(sub)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
