"""Fixtures for runs on Kubernetes.

On the real node (tests/kube/node.py, tests/kube/images.py):

- ``kube_node``: a control plane and one real node for the tests of this package, with the worker image built
  by docker/Dockerfile on the node's engine. The node's state folder, and so the engine's data
  root with the images, is kept between sessions under ~/.cache/mlbench-test-images/node; a lock
  keeps a second session from using it at the same time (it skips instead).
- ``node_namespace``: a namespace on it, one per test module, with hostPath volumes for the
  results service's claim and the data claims, and a mirror of the data set (a tiny epsilon-shaped
  LIBSVM pair the test writes) served over HTTP on the node's address for the data Job.

The stand-in kubelet's control plane, for what a real node cannot be made to do on demand, is
tests/kube_nodeless/conftest.py's: it runs beside this package, on another pytest-xdist worker.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

import numpy as np
import pytest
from click.testing import CliRunner
from kubernetes import client
from kubernetes import config as kube_config

from mlbench.cloud import config
from mlbench.cloud.config import ClusterRecord
from tests import helpers
from tests.kube import images
from tests.kube.node import KUBE_LOCAL, LocalNode, NodeUnavailable
from tests.kube_local import ControlPlaneDown

DATA_CLAIMS = ("mlbench-results", "mlbench-data-epsilon")


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """tests.helpers.wait_for, asking the API server at most 5 times a second."""
    return helpers.wait_for(check, timeout, what, interval)


#: the arguments of a run that trains until its test ends it: task 2a (logistic regression), so
#: that the node's two cores stay free enough for the kubelet and the API server to answer in time
ENDLESS = ("task2a", "2", "--data", "synthetic", "--set", "max_epochs=100000")
#: what keeps such a run from spinning while its test waits for something other than its steps
#: (a cancel, the engine's restart): rank 0 sleeps 49 times its compute after each step
#: (`--inject slow`, applied by the worker itself: the run's path is the same), so both ranks
#: make about twenty steps a second instead of hundreds. Under load the saving is larger than
#: idle: a spinning run takes its share of the two cores for as long as the starved steps
#: around it take. Not for a test that waits for steps: "compute" under load includes waiting
#: for a core, and a paced step is 50 times that
PACED = ("--inject", "slow:rank=0,factor=50")


def mlbench_cli(*args: str):
    from mlbench.cli import cli
    from mlbench.cli import commands  # noqa: F401  (registers the commands)

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


# --- the real node ---------------------------------------------------------------------------

def lift_the_tests_time_limit(request: pytest.FixtureRequest) -> None:
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
    lock = open(images.CACHE / "node.lock", "w")  # noqa: SIM115  (held while the node lives)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pytest.skip(f"another test session runs the local Kubernetes node ({images.CACHE / 'node'})")
    state = images.CACHE / "node"
    _clear_state(state)
    try:
        node = _start_node(state)
    except NodeUnavailable as err:
        lock.close()
        pytest.skip(f"no local Kubernetes node: {err}")
    except BaseException:
        lock.close()
        raise
    try:
        try:
            node.image = images.worker_image(node.docker_host, tmp_path_factory.mktemp("image") / "build.log",
                                             building=lambda: lift_the_tests_time_limit(request))
        except NodeUnavailable as err:
            pytest.skip(f"no worker image: {err}")
        yield node
    finally:
        node.stop()
        lock.close()


def _start_node(state: Path) -> LocalNode:
    """:meth:`LocalNode.start`, made once more in the cleared folder (new ports) when a part of
    the control plane or node exited (tests/kube_local.py says why one may)."""
    try:
        return LocalNode.start(state)
    except ControlPlaneDown as down:
        _clear_state(state)
        try:
            return LocalNode.start(state)
        except ControlPlaneDown as again:
            raise RuntimeError(f"the local Kubernetes node did not start, twice: {down}; then {again}") from None


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
