"""The results service's connections: one asyncio event loop holds them all, bounded in count and time.

Why not a thread per connection (``http.server``, as before): a connection took one of 64 threads
before its first header line was read, so 70 idle sockets from anywhere in the cluster delayed
``/healthz`` and every worker's events by over a minute. Why not uvicorn (the dashboard's server):
its h11 protocol (0.54) sets no timer before a connection's first request and restarts its
keep-alive timer on every byte, so an idle or trickling connection is held for ever; its
``limit_concurrency`` counts those idle connections and answers even ``/healthz`` with 503; and the
worker image, which runs this service, installs the core and ``kubernetes`` only.

Here a connection costs a coroutine and a socket until its request head (request line and
headers, at most :data:`HEAD_BYTES`) has arrived, which must happen within ``head_timeout``
seconds of its opening however slowly it trickles; each later read may wait ``timeout`` seconds and
the whole connection lasts at most ``deadline``. At most ``max_connections`` are open (below the
process's file-descriptor limit): one more makes the oldest that has not sent its head yet close;
when every open one has, the newcomer gets 503 and is closed. One request per connection
(``Connection: close``), as the workers' sink and the CLI send.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import resource
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

HEAD_BYTES = 16 * 1024         # request line and headers, as h11's default
MAX_HEADERS = 100
LINGER_SECONDS = 2.0           # after the answer, unread input is drained this long (see _linger)
LINGER_BYTES = 1 << 20
MAX_REFUSING = 256             # connections being answered 503 at once (past max_connections)
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), *range(127, 160))}


def escaped(text: str) -> str:
    """``text`` with control characters written as \\xNN, so a request cannot write to the log
    what a terminal would obey (colours, a new title, a bell, fake lines)."""
    return text.translate(_CONTROL)


def log(line: str) -> None:
    print(escaped(line)[:1000], file=sys.stderr, flush=True)


def connection_bound(max_threads: int, wanted: int) -> int:
    """How many connections may be open at once: ``wanted``, less when this process's limit on
    open files (``ulimit -n``) leaves less room beside the files the request threads open
    (the results service's and the dashboard's)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(16, min(wanted, soft - _reserved_files(max_threads)))


def _reserved_files(max_threads: int) -> int:
    return 64 + 4 * max_threads  # the store's SQLite, an events file and a run folder per thread


def raise_file_limit(max_threads: int, wanted: int) -> None:
    """Raise the soft limit on open files towards what ``wanted`` connections need (never
    above the hard limit, never lower than it was)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + _reserved_files(max_threads)
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


class BadRequest(Exception):
    """A request head that is not HTTP/1.x: answered with ``status`` and closed."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Request:
    """One request's head, and its connection's reader for the body."""

    method: str
    target: str
    line: str                      # the request line, for the log
    headers: dict[str, str]        # names in lower case
    client: str
    reader: asyncio.StreamReader
    timeout: float

    async def read(self, length: int) -> bytes:
        """Exactly ``length`` bytes of body, each read waiting at most ``timeout`` seconds."""
        chunks, left = [], length
        while left:
            chunk = await asyncio.wait_for(self.reader.read(min(left, 1 << 16)), self.timeout)
            if not chunk:
                raise ConnectionResetError("the client closed the connection before the end of the body")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


@dataclass
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"


Handler = Callable[[Request], Awaitable[Reply]]
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            408: "Request Timeout", 411: "Length Required", 413: "Content Too Large",
            431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable"}


def encode(reply: Reply) -> bytes:
    head = (f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Unknown')}\r\n"
            f"Server: mlbench-results\r\nContent-Type: {reply.content_type}\r\n"
            f"Content-Length: {len(reply.body)}\r\nConnection: close\r\n\r\n")
    return head.encode("latin-1") + reply.body


def parse_head(data: bytes) -> tuple[str, str, str, dict[str, str]]:
    """(method, target, request line, headers) of a request head ending in CRLF CRLF."""
    lines = data.decode("latin-1").split("\r\n")[:-2]
    line = lines[0] if lines else ""
    parts = line.split(" ")
    if len(parts) != 3 or not _TOKEN.match(parts[0]) or not re.match(r"^HTTP/1\.[01]$", parts[2]):
        raise BadRequest(400, f"not an HTTP/1.x request line: {line[:200]!r}")
    if len(lines) - 1 > MAX_HEADERS:
        raise BadRequest(431, f"more than {MAX_HEADERS} header lines")
    headers: dict[str, str] = {}
    for text in lines[1:]:
        name, colon, value = text.partition(":")
        if not colon or not _TOKEN.match(name):
            raise BadRequest(400, f"malformed header line {text[:100]!r}")
        name, value = name.lower(), value.strip(" \t")
        if name in headers and name == "content-length" and headers[name] != value:
            raise BadRequest(400, "two different Content-Length headers")
        headers[name] = value if name not in headers or name == "content-length" else f"{headers[name]}, {value}"
    return parts[0], parts[1], line, headers


@dataclass(eq=False)
class _Connection:
    writer: asyncio.StreamWriter
    task: asyncio.Task | None = None
    head_done: bool = False
    opened: float = field(default_factory=time.monotonic)


class HttpServer:
    """Serves ``handler`` on ``address`` from :meth:`serve_forever` until :meth:`shutdown`
    (``socketserver``'s interface, which the service and its tests use)."""

    def __init__(self, address: tuple[str, int], handler: Handler, *, timeout: float, head_timeout: float,
                 deadline: float, max_connections: int, backlog: int):
        self.handler = handler
        self.timeout, self.head_timeout, self.deadline = timeout, head_timeout, deadline
        self.max_connections = max_connections
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind(address)
            self.socket.listen(backlog)
        except OSError:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()
        self._open: dict[_Connection, None] = {}   # in opening order
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._last_refusal_log = 0.0
        self._refusing = 0

    # -- socketserver's interface -------------------------------------------------------------
    def serve_forever(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(self._loop_error)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()
            self._done.set()

    def shutdown(self) -> None:
        """Stop serving and wait until :meth:`serve_forever` has returned (from another thread)."""
        self._stopping.set()
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already finished
                loop.call_soon_threadsafe(stop.set)
        if loop is not None:
            self._done.wait()

    def server_close(self) -> None:
        self.socket.close()
        close = getattr(self.handler, "close", None)
        if close is not None:
            close()

    @property
    def open_connections(self) -> int:
        return len(self._open)

    # -- the loop -----------------------------------------------------------------------------
    async def _main(self) -> None:
        self._stop = asyncio.Event()
        if self._stopping.is_set():
            return
        server = await asyncio.start_server(self._accepted, sock=self.socket, limit=HEAD_BYTES)
        await self._stop.wait()
        server.close()
        tasks = [c.task for c in self._open if c.task is not None]
        for conn in list(self._open):
            conn.writer.transport.abort()  # each coroutine sees its connection end
        await asyncio.gather(*tasks, return_exceptions=True)

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """One line, no traceback: e.g. accept() out of file descriptors (asyncio retries it)."""
        err = context.get("exception")
        log(f"results service: {context.get('message', '')}" + (f" ({type(err).__name__}: {err})" if err else ""))

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(writer, asyncio.current_task())
        if len(self._open) >= self.max_connections and not self._evict():
            await self._refuse(reader, writer)
            return
        self._open[conn] = None
        try:
            await asyncio.wait_for(self._serve(conn, reader, writer), self.deadline)
        except (asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass  # a client that stalls or goes away: nothing to answer, nothing to log
        finally:
            self._open.pop(conn, None)
            if writer.transport.get_write_buffer_size():
                writer.transport.abort()  # a client that does not read its answer
            else:
                writer.transport.close()

    def _evict(self) -> bool:
        """Close the oldest connection that has not sent its request head yet (if any); its
        coroutine sees the connection end and finishes (a cancelled one would be logged)."""
        for conn in self._open:
            if not conn.head_done:
                del self._open[conn]
                conn.writer.transport.abort()
                return True
        return False

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """503, then close; at most :data:`MAX_REFUSING` connections are being refused at once,
        the rest are closed without a word."""
        now = time.monotonic()
        if now - self._last_refusal_log > 10:
            self._last_refusal_log = now
            log(f"results service: {len(self._open)} connections, each busy with a request: "
                "refusing new ones with 503 (logged at most every 10 s)")
        if self._refusing >= MAX_REFUSING:
            writer.transport.abort()
            return
        self._refusing += 1
        try:
            writer.write(encode(Reply(503, b'{"error": "the results service is busy: try again"}')))
            await asyncio.wait_for(self._linger(reader, writer), 2 * LINGER_SECONDS)
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            self._refusing -= 1
            writer.transport.abort()

    async def _serve(self, conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else "-"
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.head_timeout)
        except asyncio.LimitOverrunError:
            body = json.dumps({"error": f"request head over {HEAD_BYTES} bytes"}).encode()
            return await self._answer(conn, reader, writer, client, "-", Reply(431, body))
        conn.head_done = True
        try:
            method, target, line, headers = parse_head(head)
        except BadRequest as err:
            body = json.dumps({"error": str(err)}).encode()
            first = head.split(b"\r\n", 1)[0].decode("latin-1")
            return await self._answer(conn, reader, writer, client, first, Reply(err.status, body))
        reply = await self.handler(Request(method, target, line, headers, client, reader, self.timeout))
        await self._answer(conn, reader, writer, client, line, reply)

    async def _answer(self, conn: _Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      client: str, line: str, reply: Reply) -> None:
        if reply.status >= 400:  # events arrive every second from every worker: log refusals only
            log(f'{client} "{line}" {reply.status} {len(reply.body)}')
        writer.write(encode(reply))
        await asyncio.wait_for(writer.drain(), self.timeout)
        conn.head_done = False  # answered: a newcomer may close it
        await self._linger(reader, writer)

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Half-close, then read and drop what the client still sends (a body that was refused
        before it was read) for a moment: closing a socket with unread input resets the
        connection, and the client could lose the answer (Apache's "lingering close")."""
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
        end, dropped = time.monotonic() + LINGER_SECONDS, 0
        while dropped < LINGER_BYTES and (left := end - time.monotonic()) > 0:
            try:
                chunk = await asyncio.wait_for(reader.read(1 << 16), left)
            except asyncio.TimeoutError:
                break
            if not chunk:
                break
            dropped += len(chunk)
