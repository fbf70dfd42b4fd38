"""Fixtures for cluster runs on the stand-in kubelet (tests/kube_nodeless/kubelet.py), kept for what
a real node cannot be made to do on demand (evict a pod with a message) or needs two nodes.

This package needs no real node, so it is not part of tests/kube's unit (tests/scheduling.py):
it runs on another pytest-xdist worker beside the real node's tests, which are the suite's
longest unit. Its control plane has ports of its own (tests/cloud/conftest.py's
``control_plane``), and its pods are processes on loopback addresses: it shares no host state
with the real node.

- ``kube_local``: a control plane without a node, for the module that uses it (test_cluster.py).
- ``cluster``: a fresh namespace on it recorded as mlbench's current cluster, its pods run by the
  harness kubelet, and MLBENCH_RESULTS_URL pointing at a port-forward to the results service.
"""

from __future__ import annotations

import secrets
import warnings
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes import config as kube_config

from mlbench.cloud import config
from mlbench.cloud.config import ClusterRecord
from tests.cloud.conftest import control_plane
from tests.kube_nodeless.kubelet import HarnessKubelet

NODES = ("harness-node-1", "harness-node-2")
#: a control-plane node as KIND's with workers has, tainted NoSchedule: worker pods cannot go
#: there, so the runs here see a cluster of two nodes (NODES), not three
CONTROL_PLANE = "harness-control-plane"


@dataclass
class Cluster:
    record: ClusterRecord
    namespace: str
    harness: HarnessKubelet
    api: Any

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def run_objects(self, run_id: str) -> list[str]:
        selector = f"mlbench/run={run_id}"
        found = [f"Pod/{p.metadata.name}" for p in
                 self.core.list_namespaced_pod(self.namespace, label_selector=selector).items]
        found += [f"Service/{s.metadata.name}" for s in
                  self.core.list_namespaced_service(self.namespace, label_selector=selector).items]
        found += [f"ConfigMap/{c.metadata.name}" for c in
                  self.core.list_namespaced_config_map(self.namespace, label_selector=selector).items]
        return found


@pytest.fixture(scope="module")
def kube_local(tmp_path_factory):
    """The stand-in kubelet's control plane (no node), for the one module of its tests
    (test_cluster.py) and stopped after it: idle, it took about 60 CPU-seconds of the loaded box
    when it lived as long as the kube tests (17 minutes there)."""
    yield from control_plane(tmp_path_factory)


@pytest.fixture(scope="module")
def admin_api(kube_local):
    return kube_config.new_client_from_config(config_file=str(kube_local))


@pytest.fixture(scope="module")
def nodes(admin_api):
    core = client.CoreV1Api(admin_api)
    amount = {"cpu": "2", "memory": "4Gi", "pods": "110"}
    taint = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
    for name in (*NODES, CONTROL_PLANE):
        try:
            core.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                              "spec": {"taints": [taint] if name == CONTROL_PLANE else []}})
        except client.ApiException as err:
            if err.status != 409:
                raise
        size = {"cpu": "1", "memory": "2Gi", "pods": "110"} if name == CONTROL_PLANE else amount   # not the pods'
        core.patch_node_status(name, {"status": {"capacity": size, "allocatable": size, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "harness"}]}})
        # a new node is tainted not-ready until the node lifecycle controller, which does not run
        # here, sees it Ready (kube-local.sh's real node is untainted the same way)
        core.patch_node(name, {"spec": {"taints": [taint] if name == CONTROL_PLANE else None}})
    yield NODES
    with warnings.catch_warnings():  # after the last test: its insecure-TLS filter is gone
        warnings.simplefilter("ignore")
        for name in (*NODES, CONTROL_PLANE):
            core.delete_node(name)


@pytest.fixture
def cluster(kube_local, admin_api, nodes, tmp_path, monkeypatch):
    namespace = f"mlb-{secrets.token_hex(3)}"
    kube = yaml.safe_load(kube_local.read_text())
    context = config.context_name("existing", "harness")
    config.write_kube_context(context, kube["clusters"][0]["cluster"], kube["users"][0]["user"], namespace)
    record = ClusterRecord(provider="existing", name="harness", context=context,
                           kubeconfig=config.kubeconfig_path(), nodes=len(nodes), image="mlbench/worker:test",
                           created_by_mlbench=False, extra={"namespace": namespace})
    config.save_cluster(record)
    config.set_current(record)
    harness = HarnessKubelet(kube_local, namespace, tmp_path / "kubelet").start()
    forwarded = harness.network.port_forward("mlbench-results", 8080)   # kubectl port-forward svc/...
    monkeypatch.setenv("MLBENCH_RESULTS_URL", f"http://127.0.0.1:{forwarded}")
    yield Cluster(record, namespace, harness, admin_api)
    harness.stop()
    try:
        client.CoreV1Api(admin_api).delete_namespace(namespace)
    except client.ApiException:
        pass
