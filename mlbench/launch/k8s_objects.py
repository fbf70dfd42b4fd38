"""The Kubernetes objects of mlbench, as the plain dicts the API server receives.

Once per cluster (namespace): the results service (`mlbench serve`) as a Deployment with its run
store on a PersistentVolumeClaim, a ClusterIP Service (never a NodePort or LoadBalancer), a
ServiceAccount whose Role may only list and delete the objects of runs, and create a run's pods
again to restart its group (``--on-failure restart``: copies of the pods the CLI created, from the
run's ConfigMap; the run's checkpoints are a folder of the service's volume that its pods mount),
and a Secret with the two random tokens (workers' and the CLI's).

Per run: a ConfigMap holding run.json (the worker's only input, as in a local run), a Secret with
the run's own results token (workers never hold the shared worker secret), a headless Service so
that every worker finds rank 0's rendezvous store by DNS, and one Pod per worker running the
same command as locally, ``python -m mlbench.worker RUN_DIR --rank R`` (a port's worker module
for another framework, and every worker's address under the Service when that framework needs
them). The ConfigMap owns the Secret, the Service and the Pods, so deleting it lets the garbage
collector remove whatever a crash left behind; the supervisor deletes the ConfigMap, Service
and Pods explicitly when a run ends (the Secret goes with the ConfigMap).

Every container has a read-only root filesystem, bounded scratch space (``/tmp`` as an emptyDir
with a size limit) and ephemeral-storage requests and limits, so a runaway log or temporary file
is evicted by the kubelet instead of filling the node's disk. A worker reads its data set from
the cluster's data volume, mounted read-only (:mod:`mlbench.launch.k8s_data`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from mlbench.frameworks import PYTORCH, Framework, get_framework
from mlbench.network.kube import shape_pod
from mlbench.plugins import recorded_files
from mlbench.run_config import RunConfig, RunDocument
from mlbench.results.checkpoints import CHECKPOINTS_FOLDER
from mlbench.worker.launcher_env import PEERS_ENV

DEFAULT_NAMESPACE = "mlbench"
SERVICE = "mlbench-results"          # Deployment, Service, ServiceAccount, Role, Secret, PVC
SERVICE_PORT = 8080
RENDEZVOUS_PORT = 29500
WORKER_TOKEN_KEY = "worker-token"
ADMIN_TOKEN_KEY = "admin-token"
RUN_TOKEN_KEY = "token"
RUN_LABEL = "mlbench/run"
RANK_LABEL = "mlbench/rank"
MANAGED = {"app.kubernetes.io/managed-by": "mlbench"}
SERVICE_LABELS = {"app.kubernetes.io/name": SERVICE, **MANAGED}
RUNS_DIR = "/etc/mlbench/runs"     # a worker's run folder is RUNS_DIR/RUN_ID (its ConfigMap, read-only)
DATA_DIR = "/var/cache/mlbench"
STORE_DIR = "/var/lib/mlbench"
#: Where the checkpoints of runs are, in the results service's pod and in workers' pods alike:
#: a folder of the service's volume, each run's own sub-folder mounted into its pods
#: (``checkpoint_root(RUNS_DIR/RUN_ID, CHECKPOINT_DIR)`` is CHECKPOINT_DIR/RUN_ID in both).
CHECKPOINT_DIR = f"{STORE_DIR}/{CHECKPOINTS_FOLDER}"
UID = 1000  # the image's unprivileged user (docker/Dockerfile)
SCHEDULE_TIMEOUT_S = 600.0  # how long a run's pods may wait for a node before the run fails
TMP_LIMIT = "1Gi"           # a worker's scratch space (/tmp)
SHM_LIMIT = "1Gi"           # a worker's /dev/shm (memory; counted in its memory limit)
WORKER_EPHEMERAL = "2Gi"    # a worker's writable layer, logs and /tmp together
SERVICE_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi", "ephemeral-storage": "256Mi"},
                     "limits": {"cpu": "1", "memory": "1Gi", "ephemeral-storage": "1Gi"}}


@dataclass
class Placement:
    """Where and with what a run's workers run; recorded in run.json as ``placement``."""

    namespace: str
    image: str
    nodes: int
    cpu_millis: int
    memory_mib: int
    gpus: int = 0
    schedule_timeout_s: float = SCHEDULE_TIMEOUT_S
    data_claim: str | None = None  # the PersistentVolumeClaim holding the data set, if it needs one

    def to_dict(self) -> dict[str, Any]:
        return {"launcher": "kubernetes", **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Placement:
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def run_name(run_id: str) -> str:
    """ConfigMap and headless Service of a run (a DNS label starting with a letter)."""
    return f"mlbench-run-{run_id}"


def pod_name(run_id: str, rank: int) -> str:
    return f"{run_name(run_id)}-{rank}"


def results_url(namespace: str) -> str:
    """How pods reach the results service: its Service's cluster DNS name."""
    return f"http://{SERVICE}.{namespace}.svc:{SERVICE_PORT}"


def container_security() -> dict[str, Any]:
    """Every mlbench container: no privilege escalation, no capabilities, read-only root."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True}


def pod_security() -> dict[str, Any]:
    """Every mlbench pod: the image's unprivileged user, the runtime's default seccomp profile."""
    return {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def scratch_volume(size: str) -> dict[str, Any]:
    return {"name": "tmp", "emptyDir": {"sizeLimit": size}}


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}


def _secret_env(name: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": SERVICE, "key": key}}}


def role_rules() -> list[dict[str, Any]]:
    """The results service's permissions: end runs, keep their pods' logs and remove their
    objects; and restart a run's group (``--on-failure restart``): create its pods again, from
    its ConfigMap (read for its owner reference, patched with the checkpoint to go on from)."""
    return [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "delete", "create"]},
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["services"], "verbs": ["delete"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch", "delete"]}]


def pod_run_dir(run_id: str) -> str:
    """A worker's run folder in its pod: the run's ConfigMap, at a path ending in the run's id
    (as a local run folder's name is), so that its checkpoints' folder is the same path in the
    pod and in the results service's (:data:`CHECKPOINT_DIR`)."""
    return f"{RUNS_DIR}/{run_id}"


#: The access mode of a volume that pods on every node can mount at once.
SHARED_ACCESS = "ReadWriteMany"
#: The access modes of a volume that pods on several nodes can read at once (a data set's).
READABLE_EVERYWHERE = (SHARED_ACCESS, "ReadOnlyMany")


def service_objects(namespace: str, image: str, worker_token: str, admin_token: str,
                    storage: str = "5Gi", shared_storage_class: str | None = None) -> list[dict[str, Any]]:
    """The results service's objects, in the order they must be created."""
    meta = {"name": SERVICE, "namespace": namespace, "labels": SERVICE_LABELS}
    container = {
        "name": "serve", "image": image, "command": ["python", "-m", "mlbench.server"],
        "args": ["--host", "$(POD_IP)", "--port", str(SERVICE_PORT), "--home", STORE_DIR,
                 "--namespace", "$(POD_NAMESPACE)"],
        "env": [_field_env("POD_IP", "status.podIP"), _field_env("POD_NAMESPACE", "metadata.namespace"),
                _secret_env("MLBENCH_WORKER_TOKEN", WORKER_TOKEN_KEY),
                _secret_env("MLBENCH_ADMIN_TOKEN", ADMIN_TOKEN_KEY),
                {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                {"name": "HOME", "value": "/tmp"}],  # the root filesystem is read-only
        "ports": [{"name": "http", "containerPort": SERVICE_PORT}],
        # a loaded node's kubelet may wait over the default 1 s for an answer: an unready service
        # makes every CLI request fail for a while, a restarted one loses its in-memory state
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5,
                           "timeoutSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                          "initialDelaySeconds": 30, "periodSeconds": 20, "timeoutSeconds": 10,
                          "failureThreshold": 6},
        "resources": SERVICE_RESOURCES,
        "volumeMounts": [{"name": "store", "mountPath": STORE_DIR}, {"name": "tmp", "mountPath": "/tmp"}],
        "securityContext": container_security(),
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta,
         "automountServiceAccountToken": False},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
         "rules": role_rules()},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SERVICE},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE, "namespace": namespace}]},
        {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
         "stringData": {WORKER_TOKEN_KEY: worker_token, ADMIN_TOKEN_KEY: admin_token}},
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta,
         "spec": claim_spec(storage, shared_storage_class)},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {
            "replicas": 1, "strategy": {"type": "Recreate"},  # one writer of the volume at a time
            "selector": {"matchLabels": {"app.kubernetes.io/name": SERVICE}},
            "template": {"metadata": {"labels": SERVICE_LABELS}, "spec": {
                "serviceAccountName": SERVICE, "automountServiceAccountToken": True,
                "securityContext": pod_security(), "containers": [container],
                "volumes": [{"name": "store", "persistentVolumeClaim": {"claimName": SERVICE}},
                            scratch_volume("256Mi")]}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": {
            "type": "ClusterIP", "selector": {"app.kubernetes.io/name": SERVICE},
            "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": "http"}]}},
    ]


def claim_spec(storage: str, shared_storage_class: str | None) -> dict[str, Any]:
    """A claim of mlbench's (the results service's volume, a data set's): ReadWriteOnce of the
    cluster's default class, which every cluster has (pods on one node share it), or ReadWriteMany
    of the cluster's ``--shared-storage-class``, which the pods of a run on several nodes can all
    mount (its checkpoints, its data set)."""
    spec: dict[str, Any] = {"accessModes": [SHARED_ACCESS if shared_storage_class else "ReadWriteOnce"],
                            "resources": {"requests": {"storage": storage}}}
    if shared_storage_class:
        spec["storageClassName"] = shared_storage_class
    return spec


def owned_by(owner: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner["metadata"]["name"],
             "uid": owner["metadata"]["uid"], "controller": True}]


#: The most bytes of a plug-in's source a run ships in its ConfigMap (which, with run.json,
#: must stay under the API server's 1 MiB per object).
PLUGIN_LIMIT = 512 * 1024


def configmap_key(relative: str) -> str:
    """The ConfigMap key of a file of the run folder (keys hold no '/'): plugin/x/x.py ->
    plugin.x.x.py; a path with other characters than a key may hold is named by its hash."""
    key = relative.replace("/", ".")
    if re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,200}", key):
        return key
    return f"file-{hashlib.sha256(relative.encode()).hexdigest()[:20]}"


def configmap_run_json(run_json: dict[str, Any]) -> str:
    """run.json as the run's ConfigMap holds it (at the start, and again at a restart)."""
    return json.dumps(run_json, indent=2, sort_keys=True, default=str)


def run_configmap(run_id: str, run_json: dict[str, Any], namespace: str,
                  files: dict[str, bytes] | None = None) -> dict[str, Any]:
    """run.json, and ``files`` of the run folder (a plug-in's source) as binary data: the pods
    get the exact bytes whose SHA-256 run.json records (see :func:`worker_pod`'s items)."""
    configmap: dict[str, Any] = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": run_name(run_id), "namespace": namespace, "labels": {RUN_LABEL: run_id, **MANAGED}},
        "data": {"run.json": configmap_run_json(run_json)}}
    if files:
        configmap["binaryData"] = {configmap_key(path): base64.b64encode(data).decode("ascii")
                                   for path, data in files.items()}
    return configmap


def run_secret(run_id: str, token: str, owner: dict[str, Any]) -> dict[str, Any]:
    """The run's own results token (see mlbench.results.http_sink.run_token), for its pods."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": run_name(run_id), "namespace": owner["metadata"]["namespace"],
                         "labels": {RUN_LABEL: run_id, **MANAGED}, "ownerReferences": owned_by(owner)},
            "stringData": {RUN_TOKEN_KEY: token}}


def run_service(run_id: str, owner: dict[str, Any]) -> dict[str, Any]:
    """Headless: ``<pod>.<service>`` resolves to a worker's pod IP, even before it is ready."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": run_name(run_id), "namespace": owner["metadata"]["namespace"],
                         "labels": {RUN_LABEL: run_id, **MANAGED}, "ownerReferences": owned_by(owner)},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                     "selector": {RUN_LABEL: run_id},
                     "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT}]}}


def _affinity(run_id: str, workers: int, nodes: int) -> dict[str, Any]:
    """Workers on different nodes: required when there are enough nodes, else preferred."""
    term = {"labelSelector": {"matchLabels": {RUN_LABEL: run_id}},
            "topologyKey": "kubernetes.io/hostname"}
    if 1 < workers <= nodes:
        return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": term}]}}


def plugin_files(config: RunConfig) -> tuple[str, ...]:
    """The run folder's plug-in files (optimizer, model: every file of each bundle) that its
    ConfigMap carries, each once."""
    plugins = (config.optimizer_plugin, config.model_plugin)
    return tuple(dict.fromkeys(path for plugin in plugins if plugin for path in recorded_files(plugin)))


def worker_pods(run_id: str, document: RunDocument, owner: dict[str, Any]) -> list[dict[str, Any]]:
    """Every worker pod of a run, from its run.json (placement, threads, network, plug-in
    files, checkpoints) and its ConfigMap ``owner``: what the CLI creates at the start and
    the results service's supervisor again at a restart of the group."""
    config = document.config
    placement = Placement.from_dict(document.placement or {})
    return [worker_pod(run_id, rank, config.workers, config.threads_per_worker, placement, owner,
                       document.extra.get("network"), plugin_files(config), checkpoints=config.checkpoints,
                       framework=get_framework(config.framework))
            for rank in range(config.workers)]


def pod_host(run_id: str, rank: int) -> str:
    """A worker pod's name under the run's headless Service, which resolves to its IP before
    the pod is ready: how the others reach it."""
    return f"{pod_name(run_id, rank)}.{run_name(run_id)}"


def peer_addresses(run_id: str, workers: int) -> str:
    """Every worker's ``host:port`` in rank order (``MLBENCH_PEERS``, for a framework whose
    every worker listens: TensorFlow's gRPC servers): :func:`pod_host` and the rendezvous port
    of its own IP."""
    return ",".join(f"{pod_host(run_id, rank)}:{RENDEZVOUS_PORT}" for rank in range(workers))


def worker_pod(run_id: str, rank: int, workers: int, threads: int, placement: Placement,
               owner: dict[str, Any], network: dict[str, Any] | None = None,
               files: tuple[str, ...] = (), checkpoints: bool = False,
               framework: Framework = PYTORCH) -> dict[str, Any]:
    """The pod of one worker: the local worker command (``framework``'s worker module, which
    the placement's image has: :func:`mlbench.launch.kubernetes.worker_image`), its run.json
    mounted from the ConfigMap;
    with run.json's ``network``, shaped by an init container or CNI annotations (mlbench.network.kube).
    ``files``: the run folder's other files in the ConfigMap (a plug-in's source), mounted at
    their paths in the folder. With ``checkpoints``, the run's own folder of the service's
    volume (made by the service when the run was recorded) at CHECKPOINT_DIR/RUN_ID: the
    supervisor beside the service finds a restart's checkpoint there."""
    amount = {"cpu": f"{placement.cpu_millis}m", "memory": f"{placement.memory_mib}Mi",
              "ephemeral-storage": WORKER_EPHEMERAL}
    if placement.gpus:
        amount["nvidia.com/gpu"] = str(placement.gpus)
    env = [
        {"name": "MLBENCH_RESULTS_URL", "value": results_url(placement.namespace)},
        {"name": "MLBENCH_RESULTS_TOKEN",
         "valueFrom": {"secretKeyRef": {"name": run_name(run_id), "key": RUN_TOKEN_KEY}}},
        {"name": "MLBENCH_MASTER_ADDR", "value": pod_host(run_id, 0)},
        {"name": "MLBENCH_MASTER_PORT", "value": str(RENDEZVOUS_PORT)},
        _field_env("MLBENCH_BIND_ADDR", "status.podIP"),
        {"name": "MLBENCH_DATA", "value": DATA_DIR},
        {"name": "OMP_NUM_THREADS", "value": str(threads)},
        {"name": "MKL_NUM_THREADS", "value": str(threads)},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        {"name": "HOME", "value": "/tmp"},  # the root filesystem is read-only
    ]
    if framework.peers:
        env.append({"name": PEERS_ENV, "value": peer_addresses(run_id, workers)})
    listens = rank == 0 or framework.peers
    mounts = [{"name": "run", "mountPath": pod_run_dir(run_id), "readOnly": True},
              {"name": "tmp", "mountPath": "/tmp"}, {"name": "shm", "mountPath": "/dev/shm"}]
    run_volume: dict[str, Any] = {"name": run_name(run_id)}
    if files:
        run_volume["items"] = [{"key": "run.json", "path": "run.json"},
                               *({"key": configmap_key(path), "path": path} for path in files)]
    volumes = [{"name": "run", "configMap": run_volume}, scratch_volume(TMP_LIMIT),
               {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_LIMIT}}]
    if checkpoints:
        mounts.append({"name": "checkpoints", "mountPath": f"{CHECKPOINT_DIR}/{run_id}",
                       "subPath": f"{CHECKPOINTS_FOLDER}/{run_id}"})
        volumes.append({"name": "checkpoints", "persistentVolumeClaim": {"claimName": SERVICE}})
    if placement.data_claim:
        mounts.append({"name": "data", "mountPath": DATA_DIR, "readOnly": True})
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": placement.data_claim,
                                                                  "readOnly": True}})
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "automountServiceAccountToken": False,
        "hostname": pod_name(run_id, rank), "subdomain": run_name(run_id),
        "terminationGracePeriodSeconds": 15, "securityContext": pod_security(),
        "affinity": _affinity(run_id, workers, placement.nodes),
        "containers": [{
            "name": "worker", "image": placement.image,
            "command": ["python", "-m", framework.worker, pod_run_dir(run_id), "--rank", str(rank)],
            "env": env, "resources": {"requests": amount, "limits": dict(amount)},
            "ports": [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}] if listens else [],
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": container_security(), "volumeMounts": mounts}],
        "volumes": volumes,
    }
    if placement.gpus:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return shape_pod({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": pod_name(run_id, rank), "namespace": placement.namespace,
                                   "labels": {RUN_LABEL: run_id, RANK_LABEL: str(rank),
                                              "app.kubernetes.io/name": "mlbench-worker", **MANAGED},
                                   "ownerReferences": owned_by(owner)},
                      "spec": spec}, network, placement.image)
