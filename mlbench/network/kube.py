"""A worker pod's network on Kubernetes: the init container that shapes it, or CNI annotations.

``tc`` (the default): every worker pod gets an init container that runs the same shaping code as a
local run, ``python -m mlbench.network.shape`` (:mod:`mlbench.network.shape`), in the pod's own
network namespace before the worker starts. It alone runs as root with NET_ADMIN (all other
capabilities dropped, no privilege escalation, read-only root filesystem); the worker container
keeps its restricted securityContext. Clusters whose Pod Security forbids NET_ADMIN can use
``cni``: the CNI bandwidth plugin's pod annotations ``kubernetes.io/ingress-bandwidth`` and
``kubernetes.io/egress-bandwidth`` (the plugin shapes the pod's host-side veth; rate only, and
only on clusters whose CNI chain includes the plugin, e.g. GKE Dataplane V2, Calico, Cilium).
"""

from __future__ import annotations

from typing import Any

from mlbench.network.settings import NetworkSettings
from mlbench.network.tc import describe

DEVICE = "eth0"
INIT_CONTAINER = "network"
INGRESS_ANNOTATION = "kubernetes.io/ingress-bandwidth"
EGRESS_ANNOTATION = "kubernetes.io/egress-bandwidth"


def cluster_record(settings: NetworkSettings) -> dict[str, Any]:
    """What run.json records as the network of a run on a cluster."""
    if settings.shaping == "cni":
        return {**settings.to_dict(), "mechanism": "cni-bandwidth",
                "detail": (f"pod annotations {INGRESS_ANNOTATION} and {EGRESS_ANNOTATION}, enforced by "
                           "the CNI bandwidth plugin (rate only)")}
    return {**settings.to_dict(), "mechanism": "init-container+tc",
            "detail": (f"an init container with NET_ADMIN shapes each worker pod's {DEVICE} "
                       f"(python -m mlbench.network.shape): {describe(settings)}; the ingress "
                       "through an ifb device")}


def init_container(settings: NetworkSettings, image: str) -> dict[str, Any]:
    """The init container that shapes the pod's interface, then exits."""
    return {
        "name": INIT_CONTAINER, "image": image,
        "command": ["python", "-m", "mlbench.network.shape", "--device", DEVICE, *settings.to_args()],
        "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {"runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}},
    }


def quantity(bps: float) -> str:
    """Bits per second as a Kubernetes quantity, the unit the bandwidth annotations take."""
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bps >= scale and float(bps / scale).is_integer():
            return f"{bps / scale:.0f}{suffix}"
    return f"{bps:.0f}"


def cni_annotations(settings: NetworkSettings) -> dict[str, str]:
    rate = quantity(settings.bandwidth_bps or 0)
    return {INGRESS_ANNOTATION: rate, EGRESS_ANNOTATION: rate}


def shape_pod(pod: dict[str, Any], network: dict[str, Any] | None, image: str) -> dict[str, Any]:
    """The pod with its network applied (an init container, or annotations); as is without one."""
    if not network:
        return pod
    settings = NetworkSettings.from_dict(network)
    if settings.shaping == "cni":
        pod["metadata"].setdefault("annotations", {}).update(cni_annotations(settings))
    else:
        pod["spec"]["initContainers"] = [init_container(settings, image)]
    return pod
