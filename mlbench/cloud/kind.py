"""KIND clusters (Kubernetes in Docker) through the `kind` command and the docker SDK.

There is no Python SDK for kind, so mlbench runs the `kind` command (as the original did) and
uses the docker SDK for what Docker itself knows: whether the engine runs, whether the worker
image exists locally, and which node containers of a cluster are running. The worker image is
loaded into the nodes with `kind load docker-image`, so no registry is needed. `kind` writes its
kubeconfig into a temporary file, never into the user's ~/.kube/config. Costs nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

from mlbench.cloud.providers import register
from mlbench.cloud.provisioner import (
    ClusterSpec,
    ClusterStatus,
    KubeAccess,
    Progress,
    Provisioner,
)
from mlbench.errors import ClusterError, MlbenchError
from mlbench.extras import needs

CLUSTER_LABEL = "io.x-k8s.kind.cluster"
CREATE_WAIT = "5m"


def kind_config(spec: ClusterSpec) -> dict[str, Any]:
    """One control-plane node and ``nodes - 1`` workers, API server on 127.0.0.1 only."""
    node: dict[str, Any] = {"role": "control-plane"}
    if spec.kubernetes_version:
        node["image"] = f"kindest/node:v{spec.kubernetes_version.lstrip('v')}"
    workers = [{**node, "role": "worker"} for _ in range(spec.nodes - 1)]
    return {"kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4",
            "networking": {"apiServerAddress": "127.0.0.1"}, "nodes": [node, *workers]}


@register
class KindProvisioner(Provisioner):
    """Clusters of Docker containers on this machine. ``docker_client`` may be given (tests)."""

    provider = "kind"
    poll_interval = 1.0

    def __init__(self, kind_command: str = "kind", docker_client: Any = None) -> None:
        self.kind_command = kind_command
        self._docker = docker_client

    def locator(self) -> dict[str, Any]:
        return {}

    @property
    def docker(self) -> Any:
        if self._docker is None:
            with needs("kind"):
                import docker

            try:
                self._docker = docker.from_env()
            except docker.errors.DockerException as err:
                raise _docker_down(err) from None
        return self._docker

    def check_credentials(self) -> None:
        """KIND needs a running Docker engine and the `kind` command."""
        try:
            self.docker.ping()
        except MlbenchError:  # Docker down (ClusterError), or its SDK missing (MissingExtra)
            raise
        except Exception as err:
            raise _docker_down(err) from None
        if shutil.which(self.kind_command) is None:
            raise ClusterError("The `kind` command was not found; install it "
                               "(https://kind.sigs.k8s.io/docs/user/quick-start/#installation) "
                               "and rerun.")

    def _kind(self, *args: str, progress: Progress | None = None) -> str:
        """Run kind; its stderr lines are progress, a failure is its last ERROR line."""
        with tempfile.TemporaryFile(mode="w+") as stdout:
            process = subprocess.Popen([self.kind_command, *args], stdout=stdout,
                                       stderr=subprocess.PIPE, text=True, env=os.environ.copy())
            lines = []
            assert process.stderr is not None
            for raw in process.stderr:
                line = raw.rstrip()
                if line:
                    lines.append(line)
                    if progress is not None:
                        progress(f"kind: {line.strip()}")
            code = process.wait()
            stdout.seek(0)
            out = stdout.read()
        if code != 0:
            errors = [ln for ln in lines if ln.startswith("ERROR")] or lines or ["no output"]
            raise ClusterError(f"`kind {' '.join(args[:2])}` failed ({errors[-1]}); fix the "
                               "cause and rerun the same mlbench command.")
        return out

    def _clusters(self) -> list[str]:
        return [c for c in self._kind("get", "clusters").split() if c]

    def _check_image(self, image: str, build: str) -> None:
        with needs("kind"):
            import docker

        try:
            self.docker.images.get(image)
        except docker.errors.ImageNotFound:
            raise ClusterError(f"The Docker image {image} is not on this machine; build it with "
                               f"`{build}` (or pass --image), then rerun.") from None

    @staticmethod
    def images(spec: ClusterSpec) -> dict[str, str]:
        """What the nodes get, each with the command that builds it: the worker image and its
        variants for ``spec.frameworks``, which runs of those ports use."""
        from mlbench.cloud.image import framework_image

        if not spec.image:
            return {}
        return {spec.image: "mlbench image build",
                **{framework_image(spec.image, name): f"mlbench image build --framework {name}"
                   for name in spec.frameworks}}

    def preflight(self, spec: ClusterSpec) -> None:
        for image, build in self.images(spec).items():
            self._check_image(image, build)  # before minutes of cluster creation, not after

    def create(self, spec: ClusterSpec, progress: Progress) -> None:
        if spec.name in self._clusters():
            progress(f"KIND cluster {spec.name} exists; resuming.")
        else:
            with tempfile.TemporaryDirectory(prefix="mlbench-kind-") as tmp:
                config = Path(tmp) / "kind.yaml"
                config.write_text(yaml.safe_dump(kind_config(spec), sort_keys=False))
                progress(f"Creating KIND cluster {spec.name} (1 control plane, "
                         f"{spec.nodes - 1} workers).")
                self._kind("create", "cluster", "--name", spec.name, "--config", str(config),
                           "--kubeconfig", str(Path(tmp) / "kubeconfig"), "--wait", CREATE_WAIT,
                           progress=progress)
        for image in self.images(spec):
            progress(f"Loading {image} into the nodes of {spec.name}.")
            self._kind("load", "docker-image", image, "--name", spec.name, progress=progress)

    def wait(self, spec: ClusterSpec, progress: Progress) -> None:
        def check() -> tuple[bool, str]:
            running, total = self._node_containers(spec.name)
            return total > 0 and running == total, f"{running}/{total} node containers running"

        self.poll(check, f"KIND cluster {spec.name}", progress)

    def _node_containers(self, name: str) -> tuple[int, int]:
        containers = self.docker.containers.list(
            all=True, filters={"label": f"{CLUSTER_LABEL}={name}"})
        return sum(1 for c in containers if c.status == "running"), len(containers)

    def kube_access(self, name: str) -> KubeAccess:
        kube = yaml.safe_load(self._kind("get", "kubeconfig", "--name", name)) or {}
        try:
            cluster = kube["clusters"][0]["cluster"]
            user = kube["users"][0]["user"]
        except (KeyError, IndexError, TypeError):
            raise ClusterError(f"`kind get kubeconfig --name {name}` returned no cluster; "
                               f"delete it with `mlbench delete-cluster kind {name}` and "
                               "create it again.") from None
        return KubeAccess(cluster=cluster, user=user)

    def query(self, name: str) -> ClusterStatus:
        try:
            self.docker.ping()
        except MlbenchError as err:  # the Docker SDK is not installed
            return ClusterStatus("unknown", str(err))
        except Exception as err:
            return ClusterStatus("unknown", f"Docker is not reachable ({err.__class__.__name__})")
        running, total = self._node_containers(name)
        if total == 0:
            return ClusterStatus("not found", "no node containers")
        if running < total:
            return ClusterStatus("stopped", f"{running}/{total} node containers running; "
                                 "start Docker's containers again or recreate", total)
        return ClusterStatus("ready", f"{total} node containers running", total)

    def delete(self, name: str, progress: Progress) -> None:
        if name not in self._clusters():
            progress(f"KIND cluster {name} does not exist (already deleted).")
            return
        with tempfile.TemporaryDirectory(prefix="mlbench-kind-") as tmp:
            progress(f"Deleting KIND cluster {name}.")
            self._kind("delete", "cluster", "--name", name,
                       "--kubeconfig", str(Path(tmp) / "kubeconfig"), progress=progress)

    def hourly_cost(self, spec: ClusterSpec) -> float | None:
        return 0.0


def _docker_down(err: Exception) -> ClusterError:
    return ClusterError(f"Docker is not running or not reachable ({err.__class__.__name__}); "
                        "start Docker (or set DOCKER_HOST) and rerun.")

