"""Fixtures for runs on Kubernetes.

On the real node (tests/kube/node.py, tests/kube/images.py):

- ``kube_node``: a control plane and one real node for the tests of this package, with the worker image built
  by docker/Dockerfile on the node's engine. The node's state folder, and so the engine's data
  root with the images, is kept between sessions under ~/.cache/mlbench-test-images/node; a lock
  keeps a second session from using it at the same time (it skips instead).
- ``node_namespace``: a namespace on it, one per test module, with hostPath volumes for the
  results service's claim and the data claims, and a mirror of the data set (a tiny epsilon-shaped
  LIBSVM pair the test writes) served over HTTP on the node's address for the data Job.

With the stand-in kubelet (tests/kube/kubelet.py), kept for what a real node cannot be made to
do on demand (evict a pod with a message):

- ``kube_local``: a control plane without a node (tests/cloud/conftest.py's), for the one module
  that uses it (test_harness_cluster.py).
- ``cluster``: a fresh namespace on it recorded as mlbench's current cluster, its pods run by the
  harness kubelet, and MLBENCH_RESULTS_URL pointing at a port-forward to the results service.
"""

from __future__ import annotations

import bz2
import fcntl
import functools
import http.server
import secrets
import shutil
import subprocess
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from kubernetes import client
from kubernetes import config as kube_config

from mlbench.cloud import config
from mlbench.cloud.config import ClusterRecord
from tests.cloud.conftest import control_plane
from tests import helpers
from tests.kube import images
from tests.kube.kubelet import HarnessKubelet
from tests.kube.node import KUBE_LOCAL, LocalNode, NodeUnavailable

NODES = ("harness-node-1", "harness-node-2")
DATA_CLAIMS = ("mlbench-results", "mlbench-data-epsilon")


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """tests.helpers.wait_for, asking the API server at most 5 times a second."""
    return helpers.wait_for(check, timeout, what, interval)


#: the arguments of a run that trains until its test ends it: task 2a (logistic regression), so
#: that the node's two cores stay free enough for the kubelet and the API server to answer in time
ENDLESS = ("task2a", "2", "--data", "synthetic", "--set", "max_epochs=100000")


def mlbench_cli(*args: str):
    from mlbench.cli import cli
    from mlbench.cli import commands  # noqa: F401  (registers the commands)

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


# --- the real node ---------------------------------------------------------------------------

def _lift_the_tests_time_limit(request: pytest.FixtureRequest) -> None:
    """pytest-timeout's limit (pyproject.toml, 300 s) is for a test, not for the node's image,
    built once per machine (15-40 minutes on a loaded box) in the setup of the first test that
    needs it: that test runs without the limit, the build under its own steps' timeouts. Without
    this, a new machine's first session fails every test of the package on the limit."""
    request.config.pluginmanager.hook.pytest_timeout_cancel_timer(item=request._pyfuncitem)


@pytest.fixture(scope="package")
def kube_node(tmp_path_factory, request):
    """The node, its image built (first session: debootstrap, wheels and build take minutes);
    stopped after the last test of tests/kube, so that it loads no later test."""
    images.CACHE.mkdir(parents=True, exist_ok=True)
    lock = open(images.CACHE / "node.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pytest.skip(f"another test session runs the local Kubernetes node ({images.CACHE / 'node'})")
    state = images.CACHE / "node"
    _clear_state(state)
    try:
        node = LocalNode.start(state)
    except NodeUnavailable as err:
        lock.close()
        pytest.skip(f"no local Kubernetes node: {err}")
    try:
        try:
            node.image = images.worker_image(node.docker_host, tmp_path_factory.mktemp("image") / "build.log",
                                             building=lambda: _lift_the_tests_time_limit(request))
        except NodeUnavailable as err:
            pytest.skip(f"no worker image: {err}")
        yield node
    finally:
        node.stop()
        lock.close()


def _clear_state(state: Path) -> None:
    """What an earlier session left in the node's folder, but the engine's data root (images)."""
    if state.exists():
        subprocess.run(["bash", str(KUBE_LOCAL), "stop", str(state)], capture_output=True, timeout=300)
    for path in state.glob("*") if state.exists() else ():
        if path.name == "node":
            for part in path.glob("*"):
                if part.name != "docker":
                    _remove(part)
            _remove(path / "docker" / "exec")
        else:
            _remove(path)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@dataclass
class NodeNamespace:
    node: LocalNode
    name: str
    mirror: str          # MLBENCH_DATA_MIRROR for the data Job
    volumes: Path        # the hostPath folders of the claims
    api: Any

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def add_cluster(self, name: str = "local") -> ClusterRecord:
        """`mlbench add-cluster` of the node's cluster in this namespace, made current."""
        added = mlbench_cli("add-cluster", name, "--context", "kube-local", "--kubeconfig",
                            str(self.node.kubeconfig), "--namespace", self.name, "--image", self.node.image)
        assert added.exit_code == 0, added.output
        assert mlbench_cli("set-cluster", "existing", name).exit_code == 0
        return config.current_cluster()

    def run_objects(self, run_id: str) -> list[str]:
        """Every object of the run that still exists, as 'Kind/name'."""
        selector = f"mlbench/run={run_id}"
        found = [f"Pod/{p.metadata.name}" for p in
                 self.core.list_namespaced_pod(self.name, label_selector=selector).items]
        found += [f"Service/{s.metadata.name}" for s in
                  self.core.list_namespaced_service(self.name, label_selector=selector).items]
        found += [f"ConfigMap/{c.metadata.name}" for c in
                  self.core.list_namespaced_config_map(self.name, label_selector=selector).items]
        found += [f"NetworkPolicy/{p.metadata.name}" for p in client.NetworkingV1Api(
            self.api).list_namespaced_network_policy(self.name, label_selector=selector).items]
        return found

    def containers_of(self, run_id: str) -> list[str]:
        """The engine's containers (running or exited) of the run's pods."""
        return [name for name in self.node.containers() if f"mlbench-run-{run_id}" in name]


def write_epsilon_like(folder: Path, n_train: int = 4000, n_test: int = 1000, features: int = 20) -> None:
    """An epsilon-shaped LIBSVM pair under epsilon's file names (bz2): dense unit-norm rows, labels
    of a noisy linear model, so that logistic regression reaches the light goal (80%) in an epoch."""
    rng = np.random.default_rng(7)
    w = rng.normal(size=features)
    for name, n in (("epsilon_normalized.bz2", n_train), ("epsilon_normalized.t.bz2", n_test)):
        x = rng.normal(size=(n, features))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        y = np.where(x @ w + 0.05 * rng.normal(size=n) >= 0, 1, -1)
        lines = (f"{label:+d} " + " ".join(f"{j + 1}:{v:.6f}" for j, v in enumerate(row)) for row, label in zip(x, y))
        (folder / name).write_bytes(bz2.compress(("\n".join(lines) + "\n").encode()))


@pytest.fixture(scope="module")
def node_namespace(kube_node, tmp_path_factory):
    name = f"mlb-{secrets.token_hex(3)}"
    api = kube_config.new_client_from_config(config_file=str(kube_node.kubeconfig))
    client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})   # as an admin gives one
    root = tmp_path_factory.mktemp("node-volumes")
    kube_node.add_volumes(name, list(DATA_CLAIMS), root)
    source = tmp_path_factory.mktemp("epsilon-mirror")
    write_epsilon_like(source)
    handler = functools.partial(images.QuietHandler, directory=str(source))
    mirror = http.server.ThreadingHTTPServer((kube_node.ip, 0), handler)
    threading.Thread(target=mirror.serve_forever, daemon=True).start()
    yield NodeNamespace(kube_node, name, f"http://{kube_node.ip}:{mirror.server_address[1]}/", root, api)
    mirror.shutdown()
    mirror.server_close()
    # deleted, not waited for (over a minute here, pod terminations included): the node, and with it
    # every container, stops after this package, and a next session starts from a clear state;
    # that a run's own objects and containers go is what the tests assert
    client.CoreV1Api(api).delete_namespace(name, _preload_content=False)
    kube_node.delete_volumes(name)


# --- the stand-in kubelet --------------------------------------------------------------------

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
    (test_harness_cluster.py) and stopped after it: the real node that the later modules use has
    a control plane of its own, and this one, idle, took about 60 CPU-seconds of the loaded box
    when it lived as long as the package (17 minutes there)."""
    yield from control_plane(tmp_path_factory)


@pytest.fixture(scope="module")
def admin_api(kube_local):
    return kube_config.new_client_from_config(config_file=str(kube_local))


@pytest.fixture(scope="module")
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
