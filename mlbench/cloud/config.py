"""Where mlbench remembers its clusters: a YAML file and a kubeconfig of its own.

Both files live in :func:`config_dir` and are written with mode 600 (they name clusters and hold
credentials or the commands that produce them), atomically (write a temporary file, then
rename), under a lock so that two `mlbench` commands running at once cannot lose each other's
changes. mlbench never edits the user's own kubeconfig: each cluster gets one context
(``mlbench-<provider>-<name>``) in mlbench's file, which `kubectl --kubeconfig` can also use.

The records only say how to *find* a cluster; whether it exists and is healthy is always asked of
the provider (see :mod:`mlbench.cloud.manager`), so a record can never claim a state that is
false.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Iterator

import yaml

from mlbench.cloud.providers import ADOPTED, PROVIDER_MODULES
from mlbench.errors import ClusterError, UsageError
from mlbench.extras import needs
from mlbench.safefile import write_text

PROVIDERS = (*PROVIDER_MODULES, ADOPTED)
CLUSTERS_FILE = "clusters.yaml"
KUBECONFIG_FILE = "kubeconfig"


def config_dir() -> Path:
    """The folder of mlbench's configuration: $MLBENCH_CONFIG_DIR, else the XDG config folder."""
    explicit = os.environ.get("MLBENCH_CONFIG_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "mlbench"


def kubeconfig_path() -> Path:
    """mlbench's own kubeconfig (one context per cluster; never the user's ~/.kube/config)."""
    return config_dir() / KUBECONFIG_FILE


def context_name(provider: str, name: str) -> str:
    """The kube context mlbench gives a cluster: unique per (provider, name)."""
    return f"mlbench-{provider}-{name}"


#: Where a cluster record keeps its ``--shared-storage-class``.
SHARED_STORAGE_KEY = "shared_storage_class"


@dataclass
class ClusterRecord:
    """How to reach one cluster mlbench knows of.

    ``context`` names the cluster's context in ``kubeconfig``; the context is written only once
    the cluster is reachable, so a record of an interrupted create has a context that does not
    exist yet. ``extra`` holds what the provider needs to find the cluster again (project and
    zone, region and profile, namespace) and the options it was created with.
    """

    provider: str
    name: str
    context: str
    kubeconfig: Path
    nodes: int
    image: str | None = None
    created_by_mlbench: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.provider, self.name)

    @property
    def shared_storage_class(self) -> str | None:
        """The ReadWriteMany storage class of the results service's volume
        (``--shared-storage-class``): with one, the pods of a run on several nodes can all mount
        the run's checkpoints, so such runs can checkpoint, restart and resume."""
        value = self.extra.get(SHARED_STORAGE_KEY)
        return str(value) if value else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["kubeconfig"] = str(self.kubeconfig)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterRecord:
        return cls(
            provider=str(data["provider"]),
            name=str(data["name"]),
            context=str(data["context"]),
            kubeconfig=Path(data["kubeconfig"]),
            nodes=int(data.get("nodes") or 0),
            image=data.get("image"),
            created_by_mlbench=bool(data.get("created_by_mlbench", True)),
            extra=dict(data.get("extra") or {}),
        )


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 600, atomically (a reader sees old or new, whole) and
    never through a link planted at its name."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_text(path, text, mode=0o600, unique=True)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ClusterError(f"{path} is not valid YAML ({err.__class__.__name__}); "
                           "fix or remove the file and try again.") from None
    return data if isinstance(data, dict) else {}


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Serialise read-modify-write cycles of the config files between mlbench processes."""
    directory = config_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(directory / ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _load_state() -> dict[str, Any]:
    data = _read_yaml(config_dir() / CLUSTERS_FILE)
    return {"current": data.get("current"), "clusters": list(data.get("clusters") or [])}


def _save_state(state: dict[str, Any]) -> None:
    _write_private(config_dir() / CLUSTERS_FILE, yaml.safe_dump(state, sort_keys=False))


def load_clusters() -> list[ClusterRecord]:
    """Every cluster mlbench knows of, in the order they were added."""
    return [ClusterRecord.from_dict(item) for item in _load_state()["clusters"]]


def find_cluster(provider: str, name: str) -> ClusterRecord | None:
    """The record of (provider, name), or None."""
    for record in load_clusters():
        if record.key == (provider, name):
            return record
    return None


def resolve_cluster(name: str, provider: str | None = None) -> ClusterRecord:
    """The one record called ``name`` (of ``provider`` if given); a UsageError otherwise."""
    matches = [r for r in load_clusters() if r.name == name and provider in (None, r.provider)]
    if not matches:
        what = f"{provider} cluster" if provider else "cluster"
        raise UsageError(f"No {what} named {name!r} is known to mlbench; "
                         "see `mlbench list-clusters`.")
    if len(matches) > 1:
        providers = ", ".join(r.provider for r in matches)
        raise UsageError(f"Several clusters are named {name!r} ({providers}); "
                         f"name the provider too, e.g. `{matches[0].provider} {name}`.")
    return matches[0]


def save_cluster(record: ClusterRecord) -> None:
    """Add or replace the record of (provider, name)."""
    with _locked():
        state = _load_state()
        items = [i for i in state["clusters"] if (i["provider"], i["name"]) != record.key]
        items.append(record.to_dict())
        state["clusters"] = items
        _save_state(state)


def remove_cluster(provider: str, name: str) -> None:
    """Forget (provider, name); if it was the current cluster, runs go local again."""
    with _locked():
        state = _load_state()
        state["clusters"] = [i for i in state["clusters"]
                             if (i["provider"], i["name"]) != (provider, name)]
        if state["current"] == {"provider": provider, "name": name}:
            state["current"] = None
        _save_state(state)
    remove_kube_context(context_name(provider, name))


def current_cluster() -> ClusterRecord | None:
    """The cluster runs go to, or None to run on this machine."""
    current = _load_state()["current"]
    if not current:
        return None
    return find_cluster(current["provider"], current["name"])


def set_current(record: ClusterRecord | None) -> None:
    """Make ``record`` the cluster runs go to (None: this machine)."""
    with _locked():
        state = _load_state()
        state["current"] = {"provider": record.provider, "name": record.name} if record else None
        _save_state(state)
        kube = _read_yaml(kubeconfig_path())
        if kube:
            kube["current-context"] = record.context if record else ""
            _write_private(kubeconfig_path(), yaml.safe_dump(kube, sort_keys=False))


def _named(entries: list[dict[str, Any]], name: str, value_key: str, value: Any) -> list:
    kept = [e for e in entries if e.get("name") != name]
    return kept + [{"name": name, value_key: value}] if value is not None else kept


def write_kube_context(context: str, cluster: dict[str, Any], user: dict[str, Any],
                       namespace: str | None = None) -> Path:
    """Put one context (with its own cluster and user entries) into mlbench's kubeconfig."""
    with _locked():
        path = kubeconfig_path()
        kube = _read_yaml(path) or {"apiVersion": "v1", "kind": "Config", "preferences": {},
                                     "current-context": ""}
        kube["clusters"] = _named(kube.get("clusters") or [], context, "cluster", cluster)
        kube["users"] = _named(kube.get("users") or [], context, "user", user)
        ctx = {"cluster": context, "user": context}
        if namespace:
            ctx["namespace"] = namespace
        kube["contexts"] = _named(kube.get("contexts") or [], context, "context", ctx)
        _write_private(path, yaml.safe_dump(kube, sort_keys=False))
        return path


def remove_kube_context(context: str) -> None:
    """Delete a context and its entries from mlbench's kubeconfig (no-op when absent)."""
    with _locked():
        path = kubeconfig_path()
        kube = _read_yaml(path)
        if not kube:
            return
        for key, value_key in (("clusters", "cluster"), ("users", "user"), ("contexts", "context")):
            kube[key] = _named(kube.get(key) or [], context, value_key, None)
        if kube.get("current-context") == context:
            kube["current-context"] = ""
        _write_private(path, yaml.safe_dump(kube, sort_keys=False))


def has_kube_context(record: ClusterRecord) -> bool:
    """Whether the record's context has been written (the cluster was reachable once)."""
    kube = _read_yaml(record.kubeconfig)
    return any(c.get("name") == record.context for c in kube.get("contexts") or [])


def kube_api_client(record: ClusterRecord):
    """A Kubernetes ApiClient for ``record``, from mlbench's kubeconfig and the record's context.

    Tokens of GKE and EKS contexts come from `python -m mlbench.cloud.token` (an exec plugin),
    so they are fresh on every new client and no cloud CLI is needed.
    """
    with needs("kubernetes"):
        from kubernetes import config as kube_config

    if not has_kube_context(record):
        raise ClusterError(f"The {record.provider} cluster {record.name!r} is not ready yet; "
                           f"rerun `mlbench create-cluster {record.provider} ...` to finish it.")
    try:
        return kube_config.new_client_from_config(
            config_file=str(record.kubeconfig), context=record.context, persist_config=False)
    except kube_config.ConfigException as err:
        raise ClusterError(f"Cannot use the kube context {record.context!r} ({err}); "
                           f"recreate it with `mlbench create-cluster` or `add-cluster`.") from None
