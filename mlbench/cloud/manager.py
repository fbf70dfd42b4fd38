"""Cluster life cycles: the steps behind create-cluster, add-cluster, list, set and delete.

A record is saved *before* a provider is asked to create anything, so an interrupted create is
still listed (with the state the provider reports) and can be finished by running the same
command again or undone with delete-cluster. The kube context is written once the cluster is
reachable; the cluster becomes current only when it is ready.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from mlbench.cloud import config, existing
from mlbench.cloud.providers import PROVIDER_MODULES, provisioner_for
from mlbench.cloud.provisioner import (
    ClusterSpec,
    ClusterStatus,
    Progress,
    Provisioner,
    check_name,
    no_progress,
)
from mlbench.errors import ClusterError, MlbenchError, UsageError

CREATED = tuple(PROVIDER_MODULES)


def create_cluster(provisioner: Provisioner, spec: ClusterSpec,
                   progress: Progress = no_progress) -> config.ClusterRecord:
    """Create (or finish creating) a cluster, record it, and make it the current one."""
    provider = provisioner.provider
    known = config.find_cluster(provider, spec.name)
    if known is not None and not known.created_by_mlbench:
        raise UsageError(f"{spec.name!r} is an adopted {provider} cluster; choose another name.")
    provisioner.check_credentials()
    provisioner.preflight(spec)
    cost = provisioner.hourly_cost(spec)
    progress("Estimated cost: " + (f"${cost:.2f}/hour (on-demand list price)" if cost is not None
                                   else "unknown for this machine type; see the provider's "
                                        "price list"))
    record = config.ClusterRecord(
        provider=provider, name=spec.name, context=config.context_name(provider, spec.name),
        kubeconfig=config.kubeconfig_path(), nodes=spec.nodes, image=spec.image,
        created_by_mlbench=True,
        extra={**(known.extra if known else {}), **provisioner.locator(),
               "spec": {k: v for k, v in asdict(spec).items() if k not in ("name", "options")},
               # a create finished by running it again keeps the class asked the first time
               config.SHARED_STORAGE_KEY: spec.shared_storage_class or (known.shared_storage_class if known else None)})
    config.save_cluster(record)
    provisioner.create(spec, progress)
    provisioner.wait(spec, progress)
    access = provisioner.kube_access(spec.name)
    config.write_kube_context(record.context, access.cluster, access.user, "default")
    provisioner.finish(spec, record, progress)
    status = provisioner.query(spec.name)
    if status.nodes:
        record.nodes = status.nodes
    config.save_cluster(record)
    config.set_current(record)
    return record


def add_cluster(name: str, context: str, kubeconfig: str | None = None,
                namespace: str | None = None, image: str | None = None,
                shared_storage_class: str | None = None) -> config.ClusterRecord:
    """Adopt a cluster reachable through ``context`` after proving mlbench can run pods there
    (and, with ``shared_storage_class``, that the class exists)."""
    check_name(name)
    if config.find_cluster("existing", name) is not None:
        raise UsageError(f"A cluster named {name!r} was already added; forget it first with "
                         f"`mlbench delete-cluster existing {name}` or choose another name.")
    access, context_namespace = existing.read_context(context, kubeconfig)
    namespace = namespace or context_namespace or "default"
    record = config.ClusterRecord(
        provider="existing", name=name, context=config.context_name("existing", name),
        kubeconfig=config.kubeconfig_path(), nodes=0, image=image, created_by_mlbench=False,
        extra={"source_context": context, "namespace": namespace,
               "source_kubeconfig": kubeconfig,
               **({config.SHARED_STORAGE_KEY: shared_storage_class} if shared_storage_class else {})})
    config.write_kube_context(record.context, access.cluster, access.user, namespace)
    try:
        api = config.kube_api_client(record)
        record.nodes = existing.check_access(api, context, namespace)
        if shared_storage_class:
            existing.check_storage_class(api, context, shared_storage_class)
    except MlbenchError:
        config.remove_kube_context(record.context)
        raise
    config.save_cluster(record)
    return record


@dataclass
class ClusterRow:
    """One line of `list-clusters`."""

    record: config.ClusterRecord
    status: ClusterStatus
    current: bool

    @property
    def where(self) -> str:
        """'project/zone', 'region', the adopted context, or 'this machine' (KIND)."""
        parts = [self.record.extra.get(k) for k in ("project", "zone", "region", "source_context")]
        return "/".join(str(p) for p in parts if p) or "this machine"

    def to_dict(self) -> dict[str, Any]:
        """`mlbench list-clusters -o json|yaml` (docs/scripting.md, "Machine-readable output")."""
        r = self.record
        return {"provider": r.provider, "name": r.name, "current": self.current,
                "state": self.status.state, "detail": self.status.detail,
                "nodes": self.status.nodes if self.status.nodes is not None else r.nodes,
                "where": self.where, "namespace": r.extra.get("namespace"), "image": r.image,
                "created_by_mlbench": r.created_by_mlbench, "context": r.context,
                "kubeconfig": str(r.kubeconfig), "shared_storage_class": r.shared_storage_class}


def query_cluster(record: config.ClusterRecord) -> ClusterStatus:
    """The true state of a cluster, asked of its provider; failures become state 'unknown'."""
    try:
        if record.provider == "existing":
            return existing.query(config.kube_api_client(record))
        provisioner = provisioner_for(record.provider, **record.extra)
        provisioner.check_credentials()
        status = provisioner.query(record.name)
        if status.state == "ready" and not config.has_kube_context(record):
            return ClusterStatus("incomplete", "no kube context yet; rerun create-cluster",
                                 status.nodes)
        return status
    except MlbenchError as err:
        return ClusterStatus("unknown", str(err).split(";")[0])
    except Exception as err:  # one provider failing must not hide the other clusters' state
        return ClusterStatus("unknown", f"{err.__class__.__name__}: {str(err)[:120]}")


def list_clusters(refresh: bool = True) -> list[ClusterRow]:
    """Every known cluster with its state (asked of the providers in parallel if refresh)."""
    records = config.load_clusters()
    current = config.current_cluster()
    if refresh and records:
        with ThreadPoolExecutor(max_workers=min(8, len(records))) as pool:
            statuses = list(pool.map(query_cluster, records))
    else:
        statuses = [ClusterStatus("not checked") for _ in records]
    return [ClusterRow(r, s, current is not None and current.key == r.key)
            for r, s in zip(records, statuses)]


def set_cluster(name: str | None, provider: str | None = None) -> config.ClusterRecord | None:
    """Make a known, reachable cluster current; ``name`` None means this machine."""
    if name is None:
        config.set_current(None)
        return None
    record = config.resolve_cluster(name, provider)
    if not config.has_kube_context(record):
        raise ClusterError(f"The {record.provider} cluster {name!r} was never finished; rerun "
                           f"`mlbench create-cluster {record.provider} ...` first.")
    config.set_current(record)
    return record


def delete_cluster(provider: str, name: str, progress: Progress = no_progress,
                   **locator: Any) -> str:
    """Delete a cluster mlbench created (or forget an adopted one); returns what was done.

    Without a record, a GKE or EKS cluster is found with ``locator`` and deleted only if it
    carries mlbench's label or tag, so a lost config file never leaves resources behind.
    """
    record = config.find_cluster(provider, name)
    if record is not None and not record.created_by_mlbench:
        config.remove_cluster(provider, name)
        return (f"Forgot the {provider} cluster {name!r}; the cluster itself was not touched "
                "because mlbench did not create it.")
    if record is None and provider in ("existing", "kind"):
        raise UsageError(f"No {provider} cluster named {name!r} is known to mlbench; see "
                         "`mlbench list-clusters`" + (f" (a KIND cluster mlbench did not create "
                         f"is deleted with `kind delete cluster --name {name}`)."
                                                      if provider == "kind" else "."))
    merged = {k: v for k, v in {**(record.extra if record else {}), **locator}.items()
              if v is not None}
    provisioner = provisioner_for(provider, **merged)
    provisioner.check_credentials()
    provisioner.delete(name, progress)
    config.remove_cluster(provider, name)
    return f"Deleted the {provider} cluster {name!r} and everything mlbench created for it."
