"""The harness's pod network: what the cluster network and DNS would give the harness's pods.

Every pod gets its own loopback address (127.0.x.y) as its pod IP, so pods can all listen on the
same port, as in a cluster. Cluster DNS names in environment values (``svc.ns.svc``,
``hostname.subdomain``) are replaced by the IP of a pod behind them, the way kube-proxy and the
cluster DNS would route them; :meth:`PodNetwork.port_forward` does what
``kubectl port-forward svc/NAME`` does for the tests' CLI.
"""

from __future__ import annotations

import re
import socket
import socketserver
import threading
from typing import Any
from collections.abc import Callable

from tests.helpers import pump

Backends = Callable[[], list[tuple[dict[str, Any], str]]]


class PodNetwork:
    """Pod IPs, DNS names and Services of one namespace; ``backends`` lists the running pods."""

    def __init__(self, core: Any, namespace: str, backends: Backends):
        self.core = core
        self.namespace = namespace
        self.backends = backends
        self._ips: dict[str, str] = {}
        self._forwarders: list[socketserver.TCPServer] = []

    def ip(self, uid: str) -> str:
        """The pod's IP, given when the pod is first seen (so DNS works before it starts)."""
        if uid not in self._ips:
            count = len(self._ips)
            self._ips[uid] = f"127.0.{count // 200}.{count % 200 + 10}"
        return self._ips[uid]

    def resolve(self, value: str) -> str:
        """Cluster DNS names in a value -> the pod IPs behind them."""
        for name, ip in sorted(self._names().items(), key=lambda item: -len(item[0])):
            value = re.sub(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)", ip, value)
        return value

    def _names(self) -> dict[str, str]:
        ns = self.namespace
        names: dict[str, str] = {}
        for pod in self.core.list_namespaced_pod(ns).items:
            ip = self._ips.get(pod.metadata.uid)
            host, sub = pod.spec.hostname, pod.spec.subdomain
            if ip and host and sub:
                for suffix in ("", f".{ns}.svc", f".{ns}.svc.cluster.local"):
                    names[f"{host}.{sub}{suffix}"] = ip
        for service in self.core.list_namespaced_service(ns).items:
            if service.spec.cluster_ip == "None" or not service.spec.selector:
                continue
            target = self.endpoint(service.metadata.name, service.spec.ports[0].port)
            if target:
                for suffix in ("", f".{ns}", f".{ns}.svc", f".{ns}.svc.cluster.local"):
                    names[f"{service.metadata.name}{suffix}"] = target[0]
        return names

    def endpoint(self, service: str, port: int) -> tuple[str, int] | None:
        """A running pod behind the Service, and the container port that ``port`` targets."""
        svc = self.core.read_namespaced_service(service, self.namespace)
        entry = next(p for p in svc.spec.ports if p.port == port)
        for pod, ip in self.backends():
            labels = pod["metadata"].get("labels") or {}
            if all(labels.get(k) == v for k, v in svc.spec.selector.items()):
                return ip, container_port(pod, entry.target_port)
        return None

    def port_forward(self, service: str, port: int) -> int:
        """Like ``kubectl port-forward svc/SERVICE LOCAL:PORT``; returns the local port."""
        network = self

        class Forward(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                target = network.endpoint(service, port)
                if target is None:
                    return
                with socket.create_connection(target, timeout=10) as upstream:
                    back = threading.Thread(target=pump, args=(upstream, self.request), daemon=True)
                    back.start()
                    pump(self.request, upstream)
                    back.join(timeout=60)

        server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Forward)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self._forwarders.append(server)
        return server.server_address[1]

    def close(self) -> None:
        for server in self._forwarders:
            server.shutdown()
            server.server_close()


def container_port(pod: dict[str, Any], port: Any) -> int:
    """A port number, or the number of the container port with that name."""
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for container in pod["spec"]["containers"]:
        for entry in container.get("ports") or []:
            if entry.get("name") == port:
                return int(entry["containerPort"])
    raise ValueError(f"no container port named {port!r}")

