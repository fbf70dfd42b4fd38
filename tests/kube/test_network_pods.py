"""The network dimension on a cluster: what the real API server stores for a shaped run's pods.

The harness kubelet runs only a pod's worker container (it has no network of its own to shape),
so these tests check the contract with Kubernetes: the init container that shapes each worker
pod (or the CNI bandwidth annotations), the worker container's unchanged securityContext, and
the network recorded in run.json and shown by `mlbench status`.
"""

from __future__ import annotations

import json

import pytest

from mlbench.launch import kubernetes
from mlbench.launch.k8s_objects import pod_name, run_name
from tests.kube.conftest import mlbench_cli

pytestmark = [pytest.mark.kube, pytest.mark.timeout(600),
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]

QUICK = ("run", "task0a", "2", "--max-size", "10")


def _run_and_pods(cluster, *options: str):
    result = mlbench_cli(*QUICK, *options)
    assert result.exit_code == 0, result.output
    run = kubernetes.open_store(cluster.record).list()[-1]
    seen = cluster.harness.seen
    run_json = json.loads(seen[f"ConfigMap/{run_name(run.id)}"]["data"]["run.json"])
    return run, run_json, [seen[f"Pod/{pod_name(run.id, rank)}"] for rank in (0, 1)], result.output


def test_each_worker_pod_is_shaped_by_an_init_container_with_net_admin_only(cluster):
    run, run_json, pods, output = _run_and_pods(cluster, "--bandwidth", "100mbit", "--latency", "1ms")
    assert "network 100 Mbit/s, 1 ms (emulated)" in output
    assert run_json["network"]["mechanism"] == "init-container+tc"
    assert (run_json["network"]["bandwidth_bps"], run_json["network"]["latency_s"]) == (1e8, 1e-3)
    for pod in pods:
        (init,) = pod["spec"]["initContainers"]
        assert init["image"] == "mlbench/worker:test"
        assert init["command"] == ["python", "-m", "mlbench.network.shape", "--device", "eth0",
                                   "--bandwidth", "100000000bit", "--latency", "1000us"]
        assert init["securityContext"] == {
            "runAsUser": 0, "runAsGroup": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}
        worker = pod["spec"]["containers"][0]
        assert worker["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert not {k for k in pod["metadata"].get("annotations") or {} if "bandwidth" in k}
    status = mlbench_cli("status", run.id).output
    assert "100 Mbit/s, 1 ms, emulated (init-container+tc: an init container with NET_ADMIN" in status


def test_cni_shaping_puts_the_rate_in_the_bandwidth_plugins_annotations(cluster):
    _, run_json, pods, _ = _run_and_pods(cluster, "--bandwidth", "1gbit", "--shaping", "cni")
    assert run_json["network"]["mechanism"] == "cni-bandwidth"
    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        assert annotations["kubernetes.io/ingress-bandwidth"] == annotations["kubernetes.io/egress-bandwidth"] == "1G"
        assert "initContainers" not in pod["spec"]
    refused = mlbench_cli(*QUICK, "--bandwidth", "1gbit", "--latency", "1ms", "--shaping", "cni")
    assert refused.exit_code == 2 and "rate only" in refused.output
