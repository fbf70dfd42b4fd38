"""Adopting a cluster the user can already reach (minikube, on-premises, GKE/EKS made elsewhere).

The chosen context is copied from the user's kubeconfig into mlbench's own (relative file paths
made absolute, so the copy works from anywhere), then mlbench proves that it can list nodes and
create pods there (a server-side dry run: nothing is created). An adopted cluster is never
deleted by mlbench: `delete-cluster` only forgets it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from mlbench.cloud.provisioner import ClusterStatus, KubeAccess
from mlbench.errors import ClusterError, UsageError
from mlbench.extras import needs

# kubeconfig fields that hold file paths, which kubectl resolves relative to the file itself
_PATH_FIELDS = {"cluster": ("certificate-authority",),
                "user": ("client-certificate", "client-key", "tokenFile")}
REQUEST_TIMEOUT = (5, 20)  # seconds: connect, read


def user_kubeconfig_paths(kubeconfig: str | None) -> list[Path]:
    """The files kubectl would read: the given one, else $KUBECONFIG's list, else ~/.kube/config."""
    if kubeconfig:
        return [Path(kubeconfig).expanduser()]
    env = os.environ.get("KUBECONFIG")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [Path.home() / ".kube" / "config"]


def _entry(files: list[tuple[Path, dict]], key: str, name: str) -> tuple[Path, dict] | None:
    """The first entry called ``name`` under ``key`` (kubectl's merge rule: first file wins)."""
    for path, data in files:
        for item in data.get(key) or []:
            if item.get("name") == name:
                return path, item
    return None


def _absolute(section: str, value: dict[str, Any], base: Path) -> dict[str, Any]:
    value = dict(value)
    for field in _PATH_FIELDS[section]:
        if value.get(field) and not os.path.isabs(str(value[field])):
            value[field] = str((base.parent / str(value[field])).resolve())
    exec_config = value.get("exec")
    if section == "user" and exec_config and "/" in str(exec_config.get("command", "")) \
            and not os.path.isabs(exec_config["command"]):
        value["exec"] = {**exec_config,
                         "command": str((base.parent / exec_config["command"]).resolve())}
    return value


def read_context(context: str, kubeconfig: str | None = None) -> tuple[KubeAccess, str | None]:
    """The cluster/user entries and namespace of ``context`` in the user's kubeconfig."""
    files = []
    for path in user_kubeconfig_paths(kubeconfig):
        if not path.exists():
            if kubeconfig:
                raise UsageError(f"The kubeconfig {path} does not exist; check the path.")
            continue
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, OSError) as err:
            raise UsageError(f"Cannot read the kubeconfig {path} ({err.__class__.__name__}); "
                             "check the file.") from None
        files.append((path, data if isinstance(data, dict) else {}))
    found = _entry(files, "contexts", context)
    if found is None:
        names = sorted({c.get("name") for _, d in files for c in d.get("contexts") or []})
        raise UsageError(f"No kube context named {context!r}"
                         f"{' (have: ' + ', '.join(names) + ')' if names else ''}; pass one "
                         "that `kubectl config get-contexts` lists, or --kubeconfig FILE.")
    ctx = found[1].get("context") or {}
    cluster = _entry(files, "clusters", ctx.get("cluster", ""))
    user = _entry(files, "users", ctx.get("user", "")) if ctx.get("user") else None
    if cluster is None:
        raise UsageError(f"The kube context {context!r} names cluster {ctx.get('cluster')!r}, "
                         "which the kubeconfig does not define; fix the kubeconfig.")
    access = KubeAccess(cluster=_absolute("cluster", cluster[1].get("cluster") or {}, cluster[0]),
                        user=_absolute("user", user[1].get("user") or {}, user[0]) if user else {})
    return access, ctx.get("namespace")


def _reason(err: Exception) -> str:
    """A short description of a failed Kubernetes call."""
    status = getattr(err, "status", None)
    if status:
        return f"{status} {getattr(err, 'reason', '')}".strip()
    detail = str(getattr(err, "reason", "") or err).splitlines()[0][:200]
    return f"{err.__class__.__name__}: {detail}"


def _api_message(err: Exception) -> str:
    """The ``message`` of the Status document a Kubernetes API error carries ('' without one)."""
    try:
        body = json.loads(getattr(err, "body", None) or "{}")
    except (TypeError, ValueError):
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    return message.strip()[:300] if isinstance(message, str) else ""


def kube_error(err: Exception, context: str, doing: str) -> ClusterError:
    """One sentence for a failed Kubernetes call: rejected, forbidden, or unreachable."""
    with needs("kubernetes"):
        from kubernetes.client.rest import ApiException

    if isinstance(err, ApiException):
        if err.status == 401:
            return ClusterError(f"The cluster of context {context!r} rejected its credentials "
                                f"(401) when mlbench tried to {doing}; log in again and retry.")
        if err.status == 403:
            message = _api_message(err)
            if "service account" in message.lower():   # admission, not RBAC: a namespace just made
                return ClusterError(f"The cluster of context {context!r} refused to {doing}: {message}. A new "
                                    "namespace gets its default service account from the controller manager "
                                    "within seconds; retry (if it persists, the controller manager is not running).")
            return ClusterError(f"Context {context!r} may not {doing} (403 Forbidden); ask the "
                                "cluster admin for that permission or use another context.")
        return ClusterError(f"The cluster of context {context!r} refused to {doing} "
                            f"({err.status} {err.reason}); check the cluster and retry.")
    return ClusterError(f"Cannot reach the Kubernetes API of context {context!r} to {doing} "
                        f"({_reason(err)}); check that the cluster is running and reachable.")


def _probe_pod(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "mlbench-access-check", "namespace": namespace},
            "spec": {"automountServiceAccountToken": False, "restartPolicy": "Never",
                     "containers": [{"name": "check", "image": "busybox:1.36",
                                     "command": ["true"]}]}}


def check_access(api_client: Any, context: str, namespace: str) -> int:
    """Prove the context may list nodes and create pods in ``namespace``; the node count."""
    with needs("kubernetes"):
        from kubernetes import client

    core = client.CoreV1Api(api_client)
    try:
        nodes = core.list_node(_request_timeout=REQUEST_TIMEOUT).items
    except Exception as err:
        raise kube_error(err, context, "list nodes") from None
    try:
        # dict bodies: the client takes them, its annotations (kubernetes >= 37) name only its models
        probe = _probe_pod(namespace)
        core.create_namespaced_pod(namespace, probe, dry_run="All",  # type: ignore[arg-type, unused-ignore]
                                   _request_timeout=REQUEST_TIMEOUT)
    except Exception as err:
        if getattr(err, "status", None) == 404:
            raise ClusterError(f"The namespace {namespace} does not exist in the cluster of context "
                               f"{context!r}; create it (`kubectl create namespace {namespace}`) or "
                               "pass --namespace with one that exists.") from None
        raise kube_error(err, context, f"create pods in namespace {namespace}") from None
    return len(nodes)


def check_storage_class(api_client: Any, context: str, name: str) -> None:
    """Prove the storage class ``name`` exists (when the context may read storage classes)."""
    with needs("kubernetes"):
        from kubernetes import client

    try:
        client.StorageV1Api(api_client).read_storage_class(name, _request_timeout=REQUEST_TIMEOUT)
    except Exception as err:
        status = getattr(err, "status", None)
        if status == 404:
            raise UsageError(f"The cluster of context {context!r} has no storage class {name!r} "
                             "(`kubectl get storageclass` lists those it has); give a ReadWriteMany "
                             "class, e.g. GKE's standard-rwx (Filestore) or an EFS or NFS class.") from None
        if status != 403:   # not allowed to read storage classes: the claim will tell
            raise kube_error(err, context, "read storage classes") from None


def query(api_client: Any) -> ClusterStatus:
    """Reachable (with its node count and how many are Ready) or not."""
    with needs("kubernetes"):
        from kubernetes import client

    try:
        nodes = client.CoreV1Api(api_client).list_node(_request_timeout=REQUEST_TIMEOUT).items
    except Exception as err:
        return ClusterStatus("unreachable", _reason(err))
    ready = sum(1 for n in nodes for c in ((n.status and n.status.conditions) or [])
                if c.type == "Ready" and c.status == "True")
    return ClusterStatus("ready", f"{ready}/{len(nodes)} nodes Ready", len(nodes))
