"""The NetworkPolicies that keep mlbench's pods closed to the rest of the cluster.

A worker's rendezvous store (torch's TCPStore) and gloo's ports take any connection without
authentication, and the results service is reachable from any pod that knows its name. So every
namespace mlbench runs in gets (see https://kubernetes.io/docs/concepts/services-networking/network-policies/):

- ``mlbench-default-deny``: no ingress to any pod mlbench manages (selected by the
  ``app.kubernetes.io/managed-by: mlbench`` label, so other workloads of an adopted namespace are
  untouched);
- ``mlbench-results``: the results service's port admits the worker pods and the API server
  (the addresses of the ``kubernetes`` Service's endpoints, when the user may read them; the
  service proxy connects from there), nothing else;
- per run, ``mlbench-run-<id>``: the run's pods admit each other (rendezvous, gloo, nccl), and
  no other run's. It is owned by the run's ConfigMap, so it goes when the run's objects go.

Kubernetes always lets a node reach its own pods (the kubelet's probes), and on clusters whose API
server reaches pods through the nodes (GKE's tunnel, for example) its proxy comes from there.
Egress stays open: the data Job downloads from the internet and the supervisor talks to the API
server, whose address differs from provider to provider. Policies take effect only where the
cluster's network plugin enforces them (Calico, Cilium, GKE Dataplane V2, the VPC CNI's network
policy agent on EKS); elsewhere they are inert objects.
"""

from __future__ import annotations

from typing import Any

from mlbench.launch.k8s_objects import MANAGED, RUN_LABEL, SERVICE, SERVICE_PORT, owned_by, run_name

DENY = "mlbench-default-deny"
WORKERS = {"app.kubernetes.io/name": "mlbench-worker"}


def _policy(name: str, namespace: str, selector: dict[str, str], ingress: list[dict[str, Any]],
            owner: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(MANAGED)}
    if owner:
        metadata["ownerReferences"] = owner
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": metadata,
            "spec": {"podSelector": {"matchLabels": selector}, "policyTypes": ["Ingress"],
                     "ingress": ingress}}


def namespace_policies(namespace: str, api_server_ips: list[str]) -> list[dict[str, Any]]:
    """The policies created once per namespace, with the results service."""
    sources: list[dict[str, Any]] = [{"podSelector": {"matchLabels": WORKERS}}]
    sources += [{"ipBlock": {"cidr": f"{ip}/{128 if ':' in ip else 32}"}} for ip in sorted(set(api_server_ips))]
    return [
        _policy(DENY, namespace, dict(MANAGED), []),
        _policy(SERVICE, namespace, {"app.kubernetes.io/name": SERVICE},
                [{"from": sources, "ports": [{"protocol": "TCP", "port": SERVICE_PORT}]}]),
    ]


def run_policy(run_id: str, owner: dict[str, Any]) -> dict[str, Any]:
    """A run's pods may reach each other on any port; owned by the run's ConfigMap."""
    peers = {RUN_LABEL: run_id}
    return _policy(run_name(run_id), owner["metadata"]["namespace"], peers,
                   [{"from": [{"podSelector": {"matchLabels": peers}}]}], owned_by(owner))


def api_server_ips(core: Any) -> list[str]:
    """The API server's addresses (the ``kubernetes`` Service's endpoints), [] when not readable."""
    try:
        endpoints = core.read_namespaced_endpoints("kubernetes", "default")
    except Exception:
        return []
    return [a.ip for subset in endpoints.subsets or [] for a in subset.addresses or []]
