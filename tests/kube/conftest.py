"""Fixtures for runs on Kubernetes, against the real control plane of kube-local.sh.

- ``kube_local``: the cluster tests' fixture (tests/cloud/conftest.py), built once by .ci/run.
- ``nodes``: two Node objects (2 CPUs, 4 GiB each) that the launcher sizes its pods from.
- ``cluster``: a fresh namespace recorded as mlbench's current cluster, with the harness kubelet
  (tests/kube/kubelet.py) running its pods, and MLBENCH_RESULTS_URL pointing at a port-forward
  to the results service (the API server's service proxy cannot reach loopback pod IPs).
"""

from __future__ import annotations

import secrets
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from click.testing import CliRunner
from kubernetes import client
from kubernetes import config as kube_config

from mlbench.cloud import config
from mlbench.cloud.config import ClusterRecord
from tests.cloud.conftest import kube_local  # noqa: F401 - the shared control plane fixture
from tests.kube.kubelet import HarnessKubelet

NODES = ("harness-node-1", "harness-node-2")


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
        """Every object of the run that still exists, as 'Kind/name'."""
        selector = f"mlbench/run={run_id}"
        found = [f"Pod/{p.metadata.name}" for p in
                 self.core.list_namespaced_pod(self.namespace, label_selector=selector).items]
        found += [f"Service/{s.metadata.name}" for s in
                  self.core.list_namespaced_service(self.namespace, label_selector=selector).items]
        found += [f"ConfigMap/{c.metadata.name}" for c in
                  self.core.list_namespaced_config_map(self.namespace, label_selector=selector).items]
        found += [f"Secret/{s.metadata.name}" for s in
                  self.core.list_namespaced_secret(self.namespace, label_selector=selector).items]
        return found

    def service_folder(self) -> Path:
        """The results service's persistent volume, as the harness provides it."""
        return self.harness.root / "pvc" / "mlbench-results"


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def mlbench_cli(*args: str):
    from mlbench.cli import cli
    from mlbench.cli import commands  # noqa: F401  (registers the commands)

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture(scope="session")
def admin_api(kube_local):  # noqa: F811
    return kube_config.new_client_from_config(config_file=str(kube_local))


@pytest.fixture(scope="session")
def nodes(admin_api):
    core = client.CoreV1Api(admin_api)
    amount = {"cpu": "2", "memory": "4Gi", "pods": "110"}
    for name in NODES:
        try:
            core.create_node({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
        except client.ApiException as err:
            if err.status != 409:
                raise
        core.patch_node_status(name, {"status": {"capacity": amount, "allocatable": amount, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "harness"}]}})
    yield NODES
    with warnings.catch_warnings():  # after the last test: its insecure-TLS filter is gone
        warnings.simplefilter("ignore")
        for name in NODES:
            core.delete_node(name)


@pytest.fixture
def cluster(kube_local, admin_api, nodes, tmp_path, monkeypatch):  # noqa: F811
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
