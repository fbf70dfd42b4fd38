"""Serving the dashboard: bind, make the token, print the address, run uvicorn until Ctrl-C
(its connections bounded in count and time: :mod:`mlbench.dashboard.connections`).

The socket is bound here, before uvicorn starts, so that port 0 (any free port) gives the
address to print and a port in use is one readable line rather than a server log.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import threading
import webbrowser
from dataclasses import dataclass
from collections.abc import Callable

from mlbench.cloud.config import current_cluster
from mlbench.dashboard.security import loopback_hosts
from mlbench.dashboard.sources import Sources
from mlbench.errors import MlbenchError, UsageError
from mlbench.results.store import RunStore


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: one the OS picks)."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: choose a port from 1 to 65535, or 0 for any free port")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise UsageError(f"--host {host}: not an address of this machine ({err.strerror})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as err:
        sock.close()
        raise MlbenchError(f"cannot listen on {host}:{port} ({err.strerror}); pick another "
                           "--port, or 0 for any free one") from None
    sock.listen(128)
    return sock


@dataclass
class Address:
    url: str          # with the token: what the user opens once
    port: int
    warning: str | None


def address_of(host: str, sock: socket.socket, token: str) -> Address:
    port = sock.getsockname()[1]
    shown = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    warning = None
    if not is_loopback(host):
        warning = (f"Warning: --host {host} makes the dashboard reachable from other machines; "
                   "anyone who learns the token can start and delete runs, and the traffic is "
                   "not encrypted. Keep it on 127.0.0.1 (the default) unless you need otherwise.")
    return Address(f"http://{shown}:{port}/?token={token}", port, warning)


def serve(host: str, port: int, open_browser: bool, echo: Callable[[str], None],
          interval: float = 1.0) -> None:
    """Run the dashboard in this process until it is interrupted."""
    try:
        import uvicorn

        from mlbench.dashboard.app import create_app
        from mlbench.dashboard.connections import ACCEPT_BATCH, bounded_protocol
    except ImportError as err:
        raise MlbenchError(f"the dashboard needs packages that are not installed ({err.name}); "
                           "install them with: pip install 'mlbench-suite[dashboard]'") from None
    sock = bind(host, port)
    token = secrets.token_urlsafe(32)
    address = address_of(host, sock, token)
    sources = Sources(RunStore(), current_cluster())
    app = create_app(sources, token, cookie_name=f"mlbench_dashboard_{address.port}",
                     allowed_hosts=loopback_hosts(address.port) if is_loopback(host) else None,
                     interval=interval)
    if address.warning:
        echo(address.warning)
    echo(f"mlbench dashboard: {address.url}")
    echo("Open that address (it holds the access token; keep it to yourself). Ctrl-C stops the dashboard.")
    if open_browser:
        threading.Timer(0.5, webbrowser.open, args=(address.url,)).start()
    config = uvicorn.Config(app, http=bounded_protocol(), backlog=ACCEPT_BATCH, log_level="warning",
                            timeout_graceful_shutdown=2, access_log=False, lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])
