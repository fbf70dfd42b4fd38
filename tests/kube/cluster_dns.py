"""A stand-in for the cluster DNS on the local node (CoreDNS is not packaged in Debian).

It answers what Kubernetes' DNS specification (github.com/kubernetes/dns, docs/specification.md)
asks of a cluster DNS, for A queries, from the API server's Services and Endpoints:

- ``<service>.<ns>.svc.<zone>``: the Service's ClusterIP, or for a headless Service the
  addresses of its Endpoints (ready ones, and not-ready ones the Service publishes);
- ``<hostname>.<service>.<ns>.svc.<zone>``: the address of the endpoint with that hostname
  (a pod whose ``hostname``/``subdomain`` name it, behind a headless Service).

Any other name in the zone does not exist (NXDOMAIN), other names are refused, and existing names
have no AAAA records. The pods use it because kube-local.sh writes its address into the kubelet's
``clusterDNS`` (KUBE_LOCAL_CLUSTER_DNS=node). dnspython parses and builds the messages.
"""

from __future__ import annotations

import socketserver
import threading
import time
from typing import Any

import dns.flags
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset

TTL = 5


class ClusterDNS:
    """A UDP DNS server on ``address:port`` for the zone ``zone``, fed by ``core`` (CoreV1Api)."""

    def __init__(self, core: Any, address: str, port: int = 53, zone: str = "cluster.local"):
        self.core = core
        self.zone = zone.strip(".").lower()
        self.queries: list[str] = []
        self._records: dict[str, list[str]] = {}
        self._read_at = 0.0
        self._lock = threading.Lock()
        resolver = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                data, sock = self.request
                try:
                    reply = resolver.reply(dns.message.from_wire(data))
                except Exception:
                    return
                sock.sendto(reply.to_wire(), self.client_address)

        self.server = socketserver.ThreadingUDPServer((address, port), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> ClusterDNS:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reply(self, query: dns.message.Message) -> dns.message.Message:
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        question = query.question[0]
        name = question.name.to_text().rstrip(".").lower()
        self.queries.append(name)
        if name != self.zone and not name.endswith("." + self.zone):
            response.set_rcode(dns.rcode.REFUSED)
            return response
        addresses = self.records().get(name)
        if addresses is None:
            response.set_rcode(dns.rcode.NXDOMAIN)
        elif question.rdtype == dns.rdatatype.A and addresses:
            response.answer.append(dns.rrset.from_text(question.name, TTL, "IN", "A", *addresses))
        return response

    def records(self) -> dict[str, list[str]]:
        """name -> addresses, read from the API server at most every half second."""
        with self._lock:
            if time.monotonic() - self._read_at > 0.5:
                self._records = self._read()
                self._read_at = time.monotonic()
            return self._records

    def _read(self) -> dict[str, list[str]]:
        records: dict[str, list[str]] = {}
        endpoints = {(e.metadata.namespace, e.metadata.name): e
                     for e in self.core.list_endpoints_for_all_namespaces().items}
        for service in self.core.list_service_for_all_namespaces().items:
            ns, svc = service.metadata.namespace, service.metadata.name
            base = f"{svc}.{ns}.svc.{self.zone}"
            if service.spec.cluster_ip and service.spec.cluster_ip != "None":
                records[base] = [service.spec.cluster_ip]
                continue
            records[base] = []
            subsets = getattr(endpoints.get((ns, svc)), "subsets", None) or []
            for subset in subsets:
                published = list(subset.addresses or [])
                if service.spec.publish_not_ready_addresses:
                    published += subset.not_ready_addresses or []
                for address in published:
                    records[base].append(address.ip)
                    if address.hostname:
                        records.setdefault(f"{address.hostname}.{base}", []).append(address.ip)
        return records
