"""The one interface every cluster provider implements (after SkyPilot's `sky/provision`).

Each provider answers the same questions: are the credentials usable, create (idempotently),
wait until usable, how does a client reach it, what state is it in, delete (idempotently), and
what does it cost per hour. Creation and deletion ask the provider what exists before acting, so
rerunning a command that failed half way finishes the job instead of failing on what is already
there. :mod:`mlbench.cloud.manager` drives these steps and keeps the config file in step.
"""

from __future__ import annotations

import re
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol
from collections.abc import Callable

from mlbench.errors import ClusterError, UsageError


class Progress(Protocol):
    """Receives progress messages; ``transient`` ones are poll ticks a terminal may overwrite."""

    def __call__(self, message: str, transient: bool = False) -> None: ...


def no_progress(message: str, transient: bool = False) -> None:
    """A :class:`Progress` that drops everything (library use without a terminal)."""


_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")


def check_name(name: str) -> str:
    """Cluster names must suit every provider (GKE is the strictest: 1-40 of a-z, 0-9, '-')."""
    if not _NAME.match(name):
        raise UsageError(f"Invalid cluster name {name!r}: use 1-40 lowercase letters, digits "
                         "and '-', starting with a letter and not ending with '-'.")
    return name


@dataclass
class ClusterSpec:
    """What the user asked for; each provider reads the fields that apply to it."""

    name: str
    nodes: int
    machine_type: str | None = None
    disk_gb: int = 50
    kubernetes_version: str | None = None
    gpu_type: str | None = None
    gpus_per_node: int = 0
    spot: bool = False
    preemptible: bool = False
    image: str | None = None
    #: the ports whose variants of ``image`` go with it (KIND loads them into its nodes too)
    frameworks: tuple[str, ...] = ()
    api_cidrs: tuple[str, ...] = ()
    #: a ReadWriteMany storage class for the results service's volume (runs on several nodes
    #: checkpoint there); on GKE, asking for one turns on the Filestore CSI driver, whose classes
    #: (standard-rwx, ...) it needs
    shared_storage_class: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_name(self.name)
        if self.nodes < 1:
            raise UsageError(f"A cluster needs at least one node, not {self.nodes}.")


@dataclass
class ClusterStatus:
    """The provider's answer to "what state is this cluster in", for `list-clusters`.

    state is one of: ready, creating, deleting, incomplete (some resources exist, rerun create or
    delete), error, stopped, not found, unreachable, unknown.
    """

    state: str
    detail: str = ""
    nodes: int | None = None


@dataclass
class KubeAccess:
    """The kubeconfig ``cluster`` and ``user`` entries through which a cluster is reached."""

    cluster: dict[str, Any]
    user: dict[str, Any]


class Provisioner(ABC):
    """A provider of Kubernetes clusters: GKE, EKS or KIND (existing clusters are only adopted).

    ``poll_interval`` and ``timeout`` bound every wait; tests set the interval to 0.
    """

    provider: ClassVar[str]
    poll_interval: float = 10.0
    timeout: float = 45 * 60.0

    @abstractmethod
    def locator(self) -> dict[str, Any]:
        """What must be stored to find this provider's clusters again (project, region...)."""

    @classmethod
    def from_locator(cls, locator: dict[str, Any]) -> Provisioner:
        """The provisioner that finds the clusters a stored :meth:`locator` describes."""
        return cls()

    @abstractmethod
    def check_credentials(self) -> None:
        """Raise ClusterError (one sentence: what to do) unless the provider can be used."""

    def preflight(self, spec: ClusterSpec) -> None:  # noqa: B027 - optional hook, a no-op unless overridden
        """Reject a spec the provider cannot satisfy, before anything is recorded or created."""

    @abstractmethod
    def create(self, spec: ClusterSpec, progress: Progress) -> None:
        """Create what is missing of the cluster ``spec`` describes; reuse what exists."""

    @abstractmethod
    def wait(self, spec: ClusterSpec, progress: Progress) -> None:
        """Block until the cluster accepts workloads (or raise ClusterError)."""

    @abstractmethod
    def kube_access(self, name: str) -> KubeAccess:
        """How a Kubernetes client reaches the cluster ``name``."""

    def finish(self, spec: ClusterSpec, record: Any, progress: Progress) -> None:  # noqa: B027 - optional hook
        """Install what the cluster needs inside Kubernetes (e.g. a GPU device plugin).

        ``record`` is the cluster's :class:`~mlbench.cloud.config.ClusterRecord`, whose kube
        context now exists (see :func:`~mlbench.cloud.config.kube_api_client`).
        """

    @abstractmethod
    def query(self, name: str) -> ClusterStatus:
        """The true state of ``name``, read from the provider."""

    @abstractmethod
    def delete(self, name: str, progress: Progress) -> None:
        """Delete everything mlbench created for ``name``; succeed if it is already gone."""

    @abstractmethod
    def hourly_cost(self, spec: ClusterSpec) -> float | None:
        """Approximate on-demand price per hour in USD, or None when the type is not priced."""

    def poll(self, check: Callable[[], tuple[bool, str]], what: str, progress: Progress) -> None:
        """Call ``check`` until it reports done, reporting its status line as progress.

        ``check`` returns (done, status); it raises ClusterError for a terminal failure.
        """
        start = time.monotonic()
        while True:
            done, status = check()
            elapsed = int(time.monotonic() - start)
            progress(f"{what}: {status} ({elapsed // 60}m{elapsed % 60:02d}s)", transient=True)
            if done:
                return
            if elapsed > self.timeout:
                raise ClusterError(f"{what} did not finish within {int(self.timeout // 60)} "
                                   "minutes; rerun the same command to keep waiting.")
            time.sleep(self.poll_interval)
