"""The dashboard as an ASGI application: its pages, its API, its static files, its guard.

Pages are static HTML files (``static/``) that fetch their data from the API and follow it live
over server-sent events; a run's page is only served for a run that exists, anything unknown gets
the not-found page with HTTP 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from mlbench.dashboard.api import Api, Json
from mlbench.dashboard.live import Hub
from mlbench.dashboard.newrun import RunQueue
from mlbench.dashboard.security import TokenGuard
from mlbench.dashboard.sources import Sources
from mlbench.errors import MlbenchError
from mlbench.results.charts import COLOURS

STATIC = Path(__file__).with_name("static")
_NO_STORE = {"Cache-Control": "no-store"}


def _page(name: str, status: int = 200) -> Response:
    return HTMLResponse((STATIC / name).read_text(encoding="utf-8"), status_code=status, headers=_NO_STORE)


def colours_script() -> str:
    """The pages' chart colours: the palette of the PNG charts (mlbench.results.charts.COLOURS),
    so that a family has one colour in the dashboard and in `mlbench charts`."""
    return f'"use strict";\nMB.COLOURS = Object.freeze({json.dumps(list(COLOURS))});\n'


def create_app(sources: Sources, token: str, cookie_name: str, allowed_hosts: set[str] | None,
               interval: float = 1.0) -> Starlette:
    """The dashboard over ``sources``; requests must carry ``token`` (see security.py)."""
    hub = Hub(sources, interval)
    queue = RunQueue()
    api = Api(sources, hub, queue)

    def page(name: str):
        return lambda request: _page(name)

    def run_page(request: Request) -> Response:
        try:
            sources.find(request.path_params["run_id"])
        except MlbenchError:  # unknown, or a cluster that cannot say: the page says so
            return _page("notfound.html", 404)
        return _page("run.html")

    async def not_found(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)  # the handler of HTTPException only
        if request.url.path.startswith("/api/"):
            return Json({"error": f"no such API endpoint: {request.method} {request.url.path}"},
                        status_code=exc.status_code)
        if exc.status_code == 404:
            return _page("notfound.html", 404)
        return Json({"error": exc.detail}, status_code=exc.status_code)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        watcher = asyncio.create_task(hub.run())
        try:
            yield
        finally:
            watcher.cancel()
            queue.close()

    routes = [
        Route("/", page("runs.html")),
        Route("/runs/{run_id}", run_page),
        Route("/compare", page("compare.html")),
        Route("/new", page("new.html")),
        Route("/colours.js", lambda request: Response(colours_script(), media_type="text/javascript",
                                                      headers=_NO_STORE)),
        *api.routes(),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: not_found},
                     middleware=[Middleware(TokenGuard, token=token, cookie_name=cookie_name,
                                            allowed_hosts=allowed_hosts)])
