"""NVIDIA's Kubernetes device plugin, so that pods can request ``nvidia.com/gpu`` on EKS.

EKS's NVIDIA AMI has the driver and container toolkit but, unlike GKE, no device plugin; without
it a GPU node advertises no GPUs. The DaemonSet mirrors NVIDIA's static manifest
(``nvidia-device-plugin.yml`` of k8s-device-plugin), limited to the nodes mlbench labels as GPU
nodes, with no privilege escalation and every capability dropped.
"""

from __future__ import annotations

from typing import Any

from mlbench.extras import needs

DEVICE_PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"
DEVICE_PLUGIN_NAME = "nvidia-device-plugin-daemonset"
GPU_NODE_LABEL = "mlbench/gpu"
NAMESPACE = "kube-system"


def device_plugin_daemonset() -> dict[str, Any]:
    """The DaemonSet manifest (a plain dict, as the API server receives it)."""
    labels = {"name": "nvidia-device-plugin-ds", "app.kubernetes.io/managed-by": "mlbench"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": DEVICE_PLUGIN_NAME, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"name": labels["name"]}},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {GPU_NODE_LABEL: "true"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                     "effect": "NoSchedule"}],
                    "priorityClassName": "system-node-critical",
                    "containers": [{
                        "name": "nvidia-device-plugin-ctr",
                        "image": DEVICE_PLUGIN_IMAGE,
                        "env": [{"name": "FAIL_ON_INIT_ERROR", "value": "false"}],
                        "securityContext": {"allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]}},
                        "volumeMounts": [{"name": "device-plugin",
                                          "mountPath": "/var/lib/kubelet/device-plugins"}],
                    }],
                    "volumes": [{"name": "device-plugin",
                                 "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}],
                },
            },
        },
    }


def ensure_nvidia_device_plugin(api_client: Any, context: str) -> bool:
    """Create the DaemonSet unless it exists; True when it was created now."""
    with needs("kubernetes"):
        from kubernetes import client

    from mlbench.cloud.existing import REQUEST_TIMEOUT, kube_error

    apps = client.AppsV1Api(api_client)
    try:
        # dict bodies: the client takes them, its annotations (kubernetes >= 37) name only its models
        daemonset = device_plugin_daemonset()
        apps.create_namespaced_daemon_set(NAMESPACE, daemonset,  # type: ignore[arg-type, unused-ignore]
                                          _request_timeout=REQUEST_TIMEOUT)
        return True
    except Exception as err:
        if getattr(err, "status", None) == 409:
            return False
        raise kube_error(err, context,
                         f"install the NVIDIA device plugin in {NAMESPACE}") from None
