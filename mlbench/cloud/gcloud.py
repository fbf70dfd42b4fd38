"""GKE clusters through google-api-python-client (the `container` v1 API) and google-auth.

One zonal cluster with one node pool (``workers``). Everything GKE creates for it (instances,
disks, its internal firewall rules) belongs to the cluster and goes with it on delete. The
cluster carries the label ``created-by=mlbench``; mlbench refuses to delete a GKE cluster without
it. GPUs use GKE's managed driver installation (``gpuDriverInstallationConfig: DEFAULT``), which
is the maintained successor of the driver-installer DaemonSet that had to be applied by hand, and
GKE's own device plugin. No firewall rule is added; the control plane endpoint admits only the
CIDRs of ``--allow-api-from``, else this machine's public address (master authorized networks,
see :mod:`mlbench.cloud.address`).
"""

from __future__ import annotations

import json
from typing import Any

from mlbench.cloud import address, pricing
from mlbench.cloud.providers import register
from mlbench.cloud.provisioner import (
    ClusterSpec,
    ClusterStatus,
    KubeAccess,
    Progress,
    Provisioner,
)
from mlbench.cloud.token import GOOGLE_SCOPES, exec_user
from mlbench.errors import ClusterError, UsageError
from mlbench.extras import needs

DEFAULT_ZONE = "us-central1-a"
DEFAULT_MACHINE_TYPE = "n1-standard-4"
DEFAULT_GPU_TYPE = "nvidia-tesla-t4"
POOL_NAME = "workers"
LABEL = {"created-by": "mlbench"}
NODE_SCOPES = [
    "https://www.googleapis.com/auth/devstorage.read_only",  # pull images from GCR/AR
    "https://www.googleapis.com/auth/logging.write",
    "https://www.googleapis.com/auth/monitoring",
]
_STATES = {"PROVISIONING": "creating", "RUNNING": "ready", "RECONCILING": "ready",
           "STOPPING": "deleting", "ERROR": "error", "DEGRADED": "error"}


def _authorized_http(credentials: Any) -> Any:
    """An httplib2 transport that adds the credentials' token to every request."""
    with needs("gcp"):
        import google_auth_httplib2

    return google_auth_httplib2.AuthorizedHttp(credentials)


def _conditions(cluster: dict[str, Any]) -> str:
    """What GKE says about the cluster's state (its conditions)."""
    return "; ".join(c["message"] for c in cluster.get("conditions", []) if c.get("message"))


def _op_progress(op: dict[str, Any]) -> str:
    """A short progress note of a running operation ("3/4 nodes" or its running stages)."""
    progress = op.get("progress", {})
    metrics = {m.get("name"): m for m in progress.get("metrics", [])}
    if "nodes done" in metrics and "nodes total" in metrics:
        done, total = (metrics[k].get("intValue") for k in ("nodes done", "nodes total"))
        return f"{done}/{total} nodes"
    return ", ".join(s["name"] for s in progress.get("stages", [])
                     if s.get("status") == "RUNNING" and s.get("name"))


def _api_error(err: Exception, doing: str, project: str) -> ClusterError:
    """One readable sentence for a failed GKE API call (what happened, what to do)."""
    with needs("gcp"):
        from googleapiclient.errors import HttpError

    if not isinstance(err, HttpError):
        return ClusterError(f"Cannot reach Google Cloud to {doing} ({err.__class__.__name__}: "
                            f"{err}); check the network connection and rerun the command.")
    status = int(err.resp.status)
    try:
        body = json.loads(err.content.decode("utf-8"))["error"]
        message, reason = body.get("message", ""), body.get("status", "")
    except (ValueError, KeyError, TypeError, AttributeError):
        message, reason = str(err), ""
    lowered = message.lower()
    if status == 401:
        return ClusterError(f"Google Cloud rejected the credentials while trying to {doing} "
                            f"({message}); run `gcloud auth application-default login` again.")
    if status == 403 and ("has not been used" in lowered or "disabled" in lowered):
        return ClusterError(f"The Kubernetes Engine API is not enabled in project {project}; "
                            "enable container.googleapis.com in the Cloud Console and rerun.")
    if status == 429 or "quota" in lowered or reason == "RESOURCE_EXHAUSTED":
        return ClusterError(f"Google Cloud quota exceeded while trying to {doing} ({message}); "
                            "request more quota, or use fewer or smaller nodes, and rerun.")
    if status == 403:
        return ClusterError(f"Permission denied while trying to {doing} in project {project} "
                            f"({message}); grant your account roles/container.admin and rerun.")
    return ClusterError(f"Google Kubernetes Engine could not {doing} ({status} {reason}: "
                        f"{message}); fix the cause and rerun the same command to resume.")


@register
class GkeProvisioner(Provisioner):
    """GKE in one zone of one project. ``http`` replaces the authorized transport (tests)."""

    provider = "gcloud"
    num_retries = 3  # googleapiclient retries 429/5xx with backoff

    def __init__(self, project: str | None = None, zone: str | None = None,
                 http: Any = None) -> None:
        self.project = project
        self.zone = zone or DEFAULT_ZONE
        self._http = http
        self._service: Any = None

    # -- plumbing ------------------------------------------------------------------------------
    @classmethod
    def from_locator(cls, locator: dict[str, Any]) -> GkeProvisioner:
        return cls(project=locator.get("project"), zone=locator.get("zone"))

    def locator(self) -> dict[str, Any]:
        return {"project": self.project, "zone": self.zone}

    def check_credentials(self) -> None:
        """Find application default credentials and the project (``--project`` wins)."""
        if self._http is not None:
            if not self.project:
                raise UsageError("No Google Cloud project given; pass --project.")
            return
        with needs("gcp"):
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError

        try:
            credentials, default_project = google.auth.default(scopes=GOOGLE_SCOPES)
        except DefaultCredentialsError:
            raise ClusterError(
                "No Google Cloud credentials found; run `gcloud auth application-default "
                "login` or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file."
            ) from None
        self.project = self.project or default_project
        if not self.project:
            raise UsageError("No Google Cloud project set; pass --project or set "
                             "GOOGLE_CLOUD_PROJECT.")
        self._http = _authorized_http(credentials)

    def _api(self) -> Any:
        if self._service is None:
            if self._http is None:
                self.check_credentials()
            with needs("gcp"):
                from googleapiclient.discovery import build

            self._service = build("container", "v1", http=self._http, static_discovery=True)
        return self._service.projects().locations()

    def _parent(self) -> str:
        return f"projects/{self.project}/locations/{self.zone}"

    def _call(self, request: Any, doing: str) -> dict[str, Any]:
        try:
            return request.execute(num_retries=self.num_retries)
        except Exception as err:  # HttpError or transport errors, all mapped to one sentence
            raise _api_error(err, doing, str(self.project)) from None

    def _get(self, name: str) -> dict[str, Any] | None:
        """The cluster resource, or None when GKE says it does not exist."""
        with needs("gcp"):
            from googleapiclient.errors import HttpError

        request = self._api().clusters().get(name=f"{self._parent()}/clusters/{name}")
        try:
            return request.execute(num_retries=self.num_retries)
        except HttpError as err:
            if int(err.resp.status) == 404:
                return None
            raise _api_error(err, f"read cluster {name}", str(self.project)) from None
        except Exception as err:
            raise _api_error(err, f"read cluster {name}", str(self.project)) from None

    def _wait_operation(self, operation: dict[str, Any], what: str, progress: Progress) -> None:
        """Poll a GKE operation until DONE; its error, if any, becomes a ClusterError."""
        name = f"{self._parent()}/operations/{operation['name']}"
        state = {"op": operation}

        def check() -> tuple[bool, str]:
            op = state["op"] = self._call(self._api().operations().get(name=name),
                                          f"follow operation {operation['name']}")
            detail = op.get("detail") or _op_progress(op)
            return op.get("status") == "DONE", op.get("status", "?") + (f", {detail}" if detail
                                                                          else "")

        self.poll(check, what, progress)
        error = state["op"].get("error")
        if error:
            raise ClusterError(f"GKE could not finish: {what} ({error.get('message', error)}); "
                               "fix the cause and rerun the same command.")

    def _pending_operation(self, name: str, op_type: str) -> dict[str, Any] | None:
        """The unfinished operation of ``op_type`` on cluster ``name`` (to resume waiting)."""
        ops = self._call(self._api().operations().list(parent=self._parent()),
                         "list operations").get("operations", [])
        for op in ops:
            if (op.get("operationType") == op_type and op.get("status") != "DONE"
                    and str(op.get("targetLink", "")).endswith(f"/clusters/{name}")):
                return op
        return None

    # -- the provisioner interface ---------------------------------------------------------------
    def preflight(self, spec: ClusterSpec) -> None:
        spec.api_cidrs, spec.options["api_cidrs_found_here"] = address.api_cidrs(spec.api_cidrs)

    def cluster_body(self, spec: ClusterSpec) -> dict[str, Any]:
        """The ``CreateClusterRequest`` for ``spec`` (int64 fields as strings, as JSON wants)."""
        node_config: dict[str, Any] = {
            "machineType": spec.machine_type or DEFAULT_MACHINE_TYPE,
            "diskSizeGb": spec.disk_gb,
            "diskType": "pd-standard",
            "imageType": "COS_CONTAINERD",
            "oauthScopes": NODE_SCOPES,
            "labels": {"mlbench-cluster": spec.name},
            "metadata": {"disable-legacy-endpoints": "true"},
            "shieldedInstanceConfig": {"enableSecureBoot": True,
                                       "enableIntegrityMonitoring": True},
        }
        if spec.spot:
            node_config["spot"] = True
        elif spec.preemptible:
            node_config["preemptible"] = True
        if spec.gpus_per_node:
            node_config["accelerators"] = [{
                "acceleratorCount": str(spec.gpus_per_node),
                "acceleratorType": spec.gpu_type or DEFAULT_GPU_TYPE,
                "gpuDriverInstallationConfig": {"gpuDriverVersion": "DEFAULT"},
            }]
        cluster: dict[str, Any] = {
            "name": spec.name,
            "description": "Created by mlbench for distributed-training benchmarks.",
            "resourceLabels": dict(LABEL),
            "nodePools": [{
                "name": POOL_NAME,
                "initialNodeCount": spec.nodes,
                "config": node_config,
                "management": {"autoRepair": True, "autoUpgrade": True},
            }],
            "legacyAbac": {"enabled": False},
            "masterAuth": {"clientCertificateConfig": {"issueClientCertificate": False}},
        }
        if spec.kubernetes_version:
            cluster["initialClusterVersion"] = spec.kubernetes_version
        if spec.shared_storage_class:   # GKE's ReadWriteMany classes (standard-rwx, ...) are Filestore's
            cluster["addonsConfig"] = {"gcpFilestoreCsiDriverConfig": {"enabled": True}}
        if spec.api_cidrs:
            cluster["controlPlaneEndpointsConfig"] = {"ipEndpointsConfig": {
                "authorizedNetworksConfig": {
                    "enabled": True,
                    "cidrBlocks": [{"cidrBlock": c, "displayName": "mlbench"}
                                   for c in spec.api_cidrs]}}}
        return {"cluster": cluster, "parent": self._parent()}

    def create(self, spec: ClusterSpec, progress: Progress) -> None:
        existing = self._get(spec.name)
        if existing is not None:
            self._check_ours(existing)
            state = existing.get("status")
            if state == "STOPPING":
                raise ClusterError(f"The GKE cluster {spec.name} is being deleted; wait for "
                                   "`mlbench delete-cluster` to finish, then create it again.")
            progress(f"GKE cluster {spec.name} exists ({state}); resuming.")
            pending = self._pending_operation(spec.name, "CREATE_CLUSTER")
            if pending:
                self._wait_operation(pending, f"creating GKE cluster {spec.name}", progress)
            return
        if not spec.api_cidrs:  # create() without preflight (library use): the same default
            self.preflight(spec)
        progress(f"Creating GKE cluster {spec.name} in {self.project}/{self.zone} "
                 f"({spec.nodes} x {spec.machine_type or DEFAULT_MACHINE_TYPE}).")
        progress(address.describe(spec.api_cidrs, bool(spec.options.get("api_cidrs_found_here"))))
        op = self._call(self._api().clusters().create(parent=self._parent(),
                                                      body=self.cluster_body(spec)),
                        f"create cluster {spec.name}")
        self._wait_operation(op, f"creating GKE cluster {spec.name}", progress)

    def wait(self, spec: ClusterSpec, progress: Progress) -> None:
        def check() -> tuple[bool, str]:
            cluster = self._get(spec.name)
            if cluster is None:
                raise ClusterError(f"The GKE cluster {spec.name} disappeared while mlbench "
                                   "waited for it; rerun the command to create it again.")
            status = cluster.get("status", "?")
            if status in ("ERROR", "DEGRADED"):
                raise ClusterError(f"The GKE cluster {spec.name} is {status} "
                                   f"({_conditions(cluster) or 'no detail'}); delete it "
                                   "with `mlbench delete-cluster gcloud` and create it again.")
            return status == "RUNNING", status

        self.poll(check, f"waiting for GKE cluster {spec.name}", progress)

    def kube_access(self, name: str) -> KubeAccess:
        cluster = self._get(name)
        if cluster is None or not cluster.get("endpoint"):
            raise ClusterError(f"The GKE cluster {name} has no endpoint yet; rerun the command.")
        ca = cluster.get("masterAuth", {}).get("clusterCaCertificate")
        entry: dict[str, Any] = {"server": f"https://{cluster['endpoint']}"}
        if ca:
            entry["certificate-authority-data"] = ca
        return KubeAccess(cluster=entry, user=exec_user("gcloud", []))

    def query(self, name: str) -> ClusterStatus:
        cluster = self._get(name)
        if cluster is None:
            return ClusterStatus("not found",
                                 f"no GKE cluster {name} in {self.project}/{self.zone}")
        status = cluster.get("status", "STATUS_UNSPECIFIED")
        nodes = sum(int(p.get("initialNodeCount", 0)) for p in cluster.get("nodePools", []))
        return ClusterStatus(_STATES.get(status, "unknown"), _conditions(cluster) or status.lower(),
                             nodes or None)

    def delete(self, name: str, progress: Progress) -> None:
        existing = self._get(name)
        if existing is None:
            progress(f"GKE cluster {name} does not exist (already deleted).")
            return
        self._check_ours(existing)
        pending = self._pending_operation(name, "DELETE_CLUSTER")
        if pending is None:
            progress(f"Deleting GKE cluster {name} in {self.project}/{self.zone}.")
            pending = self._call(self._api().clusters().delete(
                name=f"{self._parent()}/clusters/{name}"), f"delete cluster {name}")
        self._wait_operation(pending, f"deleting GKE cluster {name}", progress)

    def hourly_cost(self, spec: ClusterSpec) -> float | None:
        gpu_type = (spec.gpu_type or DEFAULT_GPU_TYPE) if spec.gpus_per_node else None
        return pricing.gke_hourly(spec.machine_type or DEFAULT_MACHINE_TYPE, spec.nodes,
                                  spec.disk_gb, gpu_type, spec.gpus_per_node)

    def _check_ours(self, cluster: dict[str, Any]) -> None:
        if cluster.get("resourceLabels", {}).get("created-by") != "mlbench":
            raise ClusterError(
                f"A GKE cluster named {cluster.get('name')} already exists in {self.project}/"
                f"{self.zone} and was not created by mlbench; choose another name, or adopt "
                "it with `mlbench add-cluster NAME --context CTX`.")
